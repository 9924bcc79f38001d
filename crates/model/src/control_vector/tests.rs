use std::path::{Path, PathBuf};

use super::{ControlVector, ControlVectorSpec};
use crate::gguf::{GgmlType, GgufValue, GgufWriter};

const HIDDEN: usize = 4;
const LAYERS: usize = 5;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlxcel-cvec-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A tensor to write: name, ggml dims, type, raw data.
type Tensor<'a> = (&'a str, Vec<u64>, GgmlType, Vec<u8>);

/// A GGUF of `tensors`.
fn write(path: &Path, tensors: &[Tensor<'_>]) {
    let mut w = GgufWriter::new();
    w.metadata(
        "general.architecture",
        GgufValue::String("controlvector".into()),
    );
    for (name, dims, ty, data) in tensors {
        w.tensor(name, dims, *ty, data.clone());
    }
    let mut out = Vec::new();
    w.write(&mut out).unwrap();
    std::fs::write(path, out).unwrap();
}

/// A file of F32 directions: (N, values).
fn vector(path: &Path, directions: &[(usize, [f32; HIDDEN])]) -> PathBuf {
    let tensors: Vec<_> = directions
        .iter()
        .map(|(n, v)| {
            let name: &'static str = Box::leak(format!("direction.{n}").into_boxed_str());
            (name, vec![HIDDEN as u64], GgmlType::F32, bytes(v))
        })
        .collect();
    write(path, &tensors);
    path.to_path_buf()
}

fn load(files: &[(&Path, f32)], range: Option<(i32, i32)>) -> Result<ControlVector, String> {
    let spec = ControlVectorSpec {
        files: files.iter().map(|(p, s)| (p.to_path_buf(), *s)).collect(),
        layer_range: range,
    };
    ControlVector::load(&spec, HIDDEN, LAYERS)
        .map(|v| v.expect("files were given"))
        .map_err(|e| e.to_string())
}

#[test]
fn direction_n_adds_to_layer_n_and_files_sum_with_their_scales() {
    let d = dir("sum");
    let a = vector(
        &d.join("a.gguf"),
        &[(1, [1.0, 2.0, 3.0, 4.0]), (3, [0.5, 0.5, 0.5, 0.5])],
    );
    let b = vector(
        &d.join("b.gguf"),
        &[(3, [1.0, -1.0, 2.0, 0.0]), (4, [8.0; 4])],
    );
    let v = load(&[(&a, 1.0), (&b, -0.5)], None).unwrap();
    assert_eq!(v.hidden, HIDDEN);
    assert_eq!(v.layers.len(), LAYERS);
    assert_eq!(v.layers[0], None, "layer 0 never takes a direction");
    assert_eq!(v.layers[1].as_deref(), Some(&[1.0, 2.0, 3.0, 4.0][..]));
    assert_eq!(v.layers[2], None);
    assert_eq!(v.layers[3].as_deref(), Some(&[0.0, 1.0, -0.5, 0.5][..]));
    assert_eq!(v.layers[4].as_deref(), Some(&[-4.0; 4][..]));
    assert_eq!(v.layers_with_directions(), [1, 3, 4]);
}

#[test]
fn the_layer_range_is_inclusive_defaults_below_one_and_clamps_past_the_last_layer() {
    let d = dir("range");
    let all = [1, 2, 3, 4].map(|n| (n, [n as f32; HIDDEN]));
    let a = vector(&d.join("a.gguf"), &all);
    let kept = |range| load(&[(&a, 1.0)], range).unwrap().layers_with_directions();
    assert_eq!(kept(None), [1, 2, 3, 4]);
    assert_eq!(kept(Some((2, 3))), [2, 3]);
    assert_eq!(kept(Some((0, 2))), [1, 2], "a start of 0 or less is 1");
    assert_eq!(kept(Some((-7, 2))), [1, 2]);
    assert_eq!(
        kept(Some((3, 0))),
        [3, 4],
        "an end of 0 or less is the layer count"
    );
    assert_eq!(
        kept(Some((3, 99))),
        [3, 4],
        "an end past the last layer clamps"
    );
    assert_eq!(kept(Some((4, 4))), [4]);
    // The digest follows what is applied: the same range gives the same, another range another.
    let digest = |range| load(&[(&a, 1.0)], range).unwrap().digest();
    assert_eq!(digest(None), digest(Some((0, 99))));
    assert_ne!(digest(None), digest(Some((2, 3))));
    assert_ne!(digest(None), load(&[(&a, 0.5)], None).unwrap().digest());
    // Selecting nothing is refused, where llama.cpp applies nothing silently.
    for range in [(3, 2), (5, 9)] {
        let e = load(&[(&a, 1.0)], Some(range)).unwrap_err();
        assert!(
            e.contains("--control-vector-layer-range") && e.contains("no layer"),
            "{e}"
        );
    }
    let only_4 = vector(&d.join("b.gguf"), &[(4, [1.0; HIDDEN])]);
    let e = load(&[(&only_4, 1.0)], Some((1, 3))).unwrap_err();
    assert!(e.contains("[4]"), "names the layers the files have: {e}");
}

#[test]
fn a_range_without_a_vector_is_refused_and_nothing_is_none() {
    let none = ControlVector::load(&ControlVectorSpec::default(), HIDDEN, LAYERS).unwrap();
    assert_eq!(none, None);
    let spec = ControlVectorSpec {
        files: vec![],
        layer_range: Some((1, 2)),
    };
    let e = ControlVector::load(&spec, HIDDEN, LAYERS)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--control-vector-layer-range"), "{e}");
    assert!(e.contains("--control-vector-scaled"), "{e}");
}

#[test]
fn hostile_files_are_refused_naming_the_file_and_the_tensor() {
    let d = dir("hostile");
    let f32s = |n: usize| bytes(&vec![1.0; n]);
    // (file, its tensors, what the refusal must say)
    let cases: Vec<(&str, Vec<Tensor<'_>>, Vec<&str>)> = vec![
        (
            "wide.gguf",
            vec![("direction.1", vec![6], GgmlType::F32, f32s(6))],
            vec!["`direction.1`", "6 values", "hidden size is 4"],
        ),
        (
            "name.gguf",
            vec![("blk.1.attn_q.weight", vec![4], GgmlType::F32, f32s(4))],
            vec!["`blk.1.attn_q.weight`", "direction.N"],
        ),
        (
            "suffix.gguf",
            vec![("direction.1a", vec![4], GgmlType::F32, f32s(4))],
            vec!["`direction.1a`", "direction.N"],
        ),
        (
            "negative.gguf",
            vec![("direction.-1", vec![4], GgmlType::F32, f32s(4))],
            vec!["`direction.-1`"],
        ),
        (
            "zero.gguf",
            vec![("direction.0", vec![4], GgmlType::F32, f32s(4))],
            vec!["`direction.0`", "layer 0"],
        ),
        (
            "past.gguf",
            vec![("direction.5", vec![4], GgmlType::F32, f32s(4))],
            vec!["`direction.5`", "5 layers", "1 to 4"],
        ),
        (
            "huge.gguf",
            vec![(
                "direction.99999999999999999999999",
                vec![4],
                GgmlType::F32,
                f32s(4),
            )],
            vec!["`direction.99999999999999999999999`", "5 layers"],
        ),
        (
            "f16.gguf",
            vec![("direction.2", vec![4], GgmlType::F16, vec![0; 8])],
            vec!["`direction.2`", "F16", "must be F32"],
        ),
        (
            "matrix.gguf",
            vec![("direction.2", vec![4, 2], GgmlType::F32, f32s(8))],
            vec!["`direction.2`", "[2, 4]", "one-dimensional"],
        ),
        ("empty.gguf", vec![], vec!["no tensors"]),
    ];
    for (file, tensors, expected) in cases {
        let path = d.join(file);
        write(&path, &tensors);
        let e = load(&[(&path, 1.0)], None).unwrap_err();
        assert!(e.contains(file), "{file}: the file is named: {e}");
        assert!(e.contains("control vector"), "{file}: {e}");
        for part in expected {
            assert!(e.contains(part), "{file}: `{part}` missing from: {e}");
        }
    }
    // A second file wrong after a good first one: the bad one is named.
    let good = vector(&d.join("good.gguf"), &[(1, [1.0; HIDDEN])]);
    let e = load(&[(&good, 1.0), (&d.join("wide.gguf"), 1.0)], None).unwrap_err();
    assert!(e.contains("wide.gguf") && !e.contains("good.gguf"), "{e}");
    // Not a GGUF at all, and a missing file.
    let text = d.join("text.gguf");
    std::fs::write(&text, "not a gguf").unwrap();
    let e = load(&[(&text, 1.0)], None).unwrap_err();
    assert!(e.contains("text.gguf"), "{e}");
    let e = load(&[(&d.join("missing.gguf"), 1.0)], None).unwrap_err();
    assert!(e.contains("missing.gguf"), "{e}");
}

#[test]
fn a_trailing_dimension_of_one_still_reads_as_a_direction() {
    // ggml counts [4, 1] as one-dimensional, as llama.cpp's loader does.
    let d = dir("trailing");
    let path = d.join("col.gguf");
    write(
        &path,
        &[(
            "direction.2",
            vec![4, 1],
            GgmlType::F32,
            bytes(&[1.0, 2.0, 3.0, 4.0]),
        )],
    );
    let v = load(&[(&path, 2.0)], None).unwrap();
    assert_eq!(v.layers[2].as_deref(), Some(&[2.0, 4.0, 6.0, 8.0][..]));
}
