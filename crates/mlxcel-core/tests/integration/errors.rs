//! MLX exceptions surface as `Error::Mlx` carrying MLX's message, never as a crash.

use mlxcel_core::fast::{AttentionMask, rms_norm, scaled_dot_product_attention};
use mlxcel_core::{Array, Dtype, Error, QuantizedWeight};

fn mlx_error(result: Result<Array, Error>) -> (&'static str, String) {
    match result {
        Err(Error::Mlx { op, message }) => (op, message),
        other => panic!("expected an MLX error, got {other:?}"),
    }
}

#[test]
fn matmul_shape_mismatch_carries_mlx_message() {
    let a = Array::from_f32(&[1.0; 6], &[2, 3]).unwrap();
    let b = Array::from_f32(&[1.0; 8], &[4, 2]).unwrap();
    let (op, message) = mlx_error(a.matmul(&b));
    assert_eq!(op, "matmul");
    assert!(message.contains("[matmul]"), "{message}");
    let shown = a.matmul(&b).unwrap_err().to_string();
    assert!(shown.starts_with("MLX matmul failed: [matmul]"), "{shown}");
}

#[test]
fn every_op_family_reports_instead_of_aborting() {
    let a = Array::from_f32(&[1.0; 6], &[2, 3]).unwrap();
    let b = Array::from_f32(&[1.0; 4], &[4]).unwrap();
    let cases: Vec<(&str, Result<Array, Error>)> = vec![
        ("add", a.add(&b)),
        ("reshape", a.reshape(&[4, 2])),
        ("transpose", a.transpose(&[0, 0])),
        ("swapaxes", a.swapaxes(0, 5)),
        ("take", a.take(&Array::from_u32(&[0], &[1]).unwrap(), 3)),
        ("concatenate", Array::concatenate(&[&a, &b], 0)),
        ("slice_update", a.slice_update(&b, &[0, 0], &[1, 3])),
        ("softmax", a.softmax(4, false)),
        ("rms_norm", rms_norm(&a, &b, 1e-5)),
        (
            "scaled_dot_product_attention",
            scaled_dot_product_attention(&a, &a, &a, 1.0, AttentionMask::Causal),
        ),
        (
            "quantize",
            QuantizedWeight::quantize(&a, 32, 4).map(|q| q.weight),
        ),
        ("quantized_matmul", {
            let w = Array::from_f32(&[0.5; 64 * 4], &[4, 64]).unwrap();
            let qw = QuantizedWeight::quantize(&w, 32, 4).unwrap();
            qw.matmul(&Array::from_f32(&[1.0; 32], &[1, 32]).unwrap(), true)
        }),
    ];
    for (expected_op, result) in cases {
        let (op, message) = mlx_error(result);
        assert_eq!(op, expected_op);
        assert!(!message.is_empty(), "{op}: empty message");
    }
}

#[test]
fn host_data_of_the_wrong_length_is_rejected_before_mlx() {
    let err = Array::from_f32(&[1.0; 5], &[2, 3]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DataLength {
                len: 5,
                expected: 6,
                ..
            }
        ),
        "{err:?}"
    );
    let err = Array::from_bytes(&[0; 6], &[2], Dtype::F32).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DataLength {
                len: 6,
                expected: 8,
                ..
            }
        ),
        "{err:?}"
    );
    let err = Array::from_u32(&[1], &[-1]).unwrap_err();
    assert!(matches!(err, Error::DataLength { .. }), "{err:?}");
}

#[test]
fn arrays_stay_usable_after_an_error() {
    let a = Array::from_f32(&[1.0, 2.0], &[2]).unwrap();
    assert!(a.reshape(&[3]).is_err());
    assert_eq!(a.add(&a).unwrap().to_vec_f32().unwrap(), [2.0, 4.0]);
}
