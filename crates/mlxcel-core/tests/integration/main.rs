//! mlxcel-core's one integration-test binary. Every op is checked against a scalar Rust
//! reference on small inputs built here; nothing is downloaded beyond the pinned MLX wheel.

mod array_ops;
mod attention;
mod attention_head256;
mod control_vector;
mod device;
mod errors;
mod experts;
mod gemma4;
mod hybrid;
mod int8_blocks;
mod kernels;
mod layout_cache;
mod lfm2;
mod llama;
mod lora;
mod mixed;
mod mxfp4;
mod pin;
mod properties;
mod quantized;
mod reference;
mod rms_rope;
mod rpath;
mod stages;
mod threads;

/// Runs this binary's ignored test `name` alone in a child process with `env` set, asserts that
/// it passed, and returns the child's standard error: for tests of settings read from the
/// environment, which a test must not change under the others running beside it.
pub fn run_ignored_test_in_child(name: &str, env: &[(&str, &str)]) -> String {
    let me = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(me)
        .args(["--ignored", "--exact", name])
        .envs(env.iter().copied())
        .output()
        .expect("test binary starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}{stderr}"
    );
    stderr
}

/// Deterministic pseudo-random f32s in `[-1, 1)` (a 64-bit LCG; no dependency needed).
pub fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Asserts `actual ≈ expected` element-wise within `tol` (absolute + relative).
#[track_caller]
pub fn assert_close(actual: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(actual.len(), expected.len(), "length mismatch");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tol * (1.0 + e.abs()),
            "element {i}: got {a}, expected {e} (tol {tol})\nactual:   {actual:?}\nexpected: {expected:?}"
        );
    }
}

/// Row-major `[m, k] · [k, n]`.
pub fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

/// The index of the largest logit (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding of `prompt` for `n` tokens, one sequence alone.
pub fn greedy(model: &mlxcel_core::LlamaModel, prompt: &[u32], n: usize) -> Vec<u32> {
    use mlxcel_core::ForwardSeq;
    let mut cache = model.new_cache(prompt.len() + n);
    let mut logits = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: prompt,
        }])
        .unwrap()
        .remove(0);
    let mut out = Vec::new();
    for _ in 0..n {
        let next = argmax(&logits);
        out.push(next);
        logits = model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &[next],
            }])
            .unwrap()
            .remove(0);
    }
    out
}
