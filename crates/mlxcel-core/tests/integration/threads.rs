//! `Array` is Send + Sync: graphs built on one thread evaluate on another, and threads
//! sharing weights do not race (every MLX call is serialised by the crate's lock).

use std::sync::Arc;

use mlxcel_core::Array;

#[test]
fn array_built_on_one_thread_evaluates_on_another() {
    let a = Array::from_f32(&[1.0, 2.0, 3.0], &[3]).unwrap();
    let lazy = a.multiply(&a).unwrap();
    let out = std::thread::spawn(move || lazy.to_vec_f32().unwrap())
        .join()
        .unwrap();
    assert_eq!(out, [1.0, 4.0, 9.0]);
}

#[test]
fn threads_sharing_an_unevaluated_subgraph_agree() {
    let w = Array::from_f32(&[0.5; 64], &[8, 8]).unwrap();
    // An unevaluated node shared by every thread: the case that races without the lock.
    let shared = Arc::new(w.add(&w).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let x = Array::from_f32(&[t as f32; 8], &[1, 8]).unwrap();
                let mut sums = Vec::new();
                for _ in 0..20 {
                    let y = x.matmul(&shared).unwrap();
                    sums.push(y.to_vec_f32().unwrap()[0]);
                }
                sums
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        assert!(h.join().unwrap().iter().all(|&s| s == t as f32 * 8.0));
    }
}
