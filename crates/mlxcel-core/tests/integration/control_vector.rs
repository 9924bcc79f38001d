//! Control vectors on the default model: random vectors built here (the oracle against
//! llama.cpp is `scripts/check-control-vectors`). The fused decoder-layer node and the per-op
//! graph add them alike; a zero vector is the model alone, bit for bit; a vector on one layer
//! changes the logits, and removing it restores them.

use mlxcel_core::{Activations, ForwardSeq, Kernels, LlamaModel};
use mlxcel_model::{ControlVector, LoadedModel, resolve_model};

use crate::{argmax, assert_close, pseudo_random};

fn skip() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// A vector on `layers` of the model (each direction pseudo-random times `amplitude`).
fn vector(loaded: &LoadedModel, layers: &[usize], amplitude: f32) -> ControlVector {
    let c = loaded.config();
    let mut v = ControlVector {
        hidden: c.hidden_size,
        layers: vec![None; c.num_hidden_layers],
    };
    for &layer in layers {
        let values = pseudo_random(c.hidden_size, 40 + layer as u64)
            .iter()
            .map(|x| x * amplitude)
            .collect();
        v.layers[layer] = Some(values);
    }
    v
}

/// The logits after prefilling `prompt`, then after each of 3 greedy decode steps.
fn run(model: &LlamaModel, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(prompt.len() + 8);
    let mut input = prompt.to_vec();
    let mut all = Vec::new();
    for _ in 0..4 {
        let logits = model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &input,
            }])
            .unwrap()
            .remove(0);
        input = vec![argmax(&logits)];
        all.push(logits);
    }
    all
}

fn model_on(loaded: &LoadedModel, fused: bool) -> LlamaModel {
    let kernels = Kernels {
        fused_layers: fused,
        activations: Activations::F32,
        ..Kernels::native()
    };
    LlamaModel::load_with(&loaded.checkpoint, kernels).unwrap()
}

#[test]
fn the_fused_node_and_the_per_op_graph_add_control_vectors_alike() {
    if skip() {
        return;
    }
    let dir = resolve_model(None).expect("provision the default model");
    let loaded = LoadedModel::open(&dir).unwrap();
    let prompt = loaded
        .tokenizer
        .encode("The capital of France is", false, false)
        .unwrap();
    let (mut fused, mut per_op) = (model_on(&loaded, true), model_on(&loaded, false));
    let base = run(&fused, &prompt);
    // Every layer but 0, then a few scattered layers (runs of fused layers between them).
    let layers: Vec<usize> = (1..loaded.config().num_hidden_layers).collect();
    for layers in [&layers[..], &[3, 4, 17, 29][..]] {
        let v = vector(&loaded, layers, 0.5);
        fused.set_control_vector(Some(&v)).unwrap();
        per_op.set_control_vector(Some(&v)).unwrap();
        assert!(fused.has_control_vector());
        let (a, b) = (run(&fused, &prompt), run(&per_op, &prompt));
        for (x, y) in a.iter().zip(&b) {
            assert_close(x, y, 1e-3);
        }
        let moved = a[0]
            .iter()
            .zip(&base[0])
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            moved > 0.1,
            "the vector on {layers:?} moved the logits by {moved}"
        );
    }
    // A zero vector adds nothing, and removing the vector restores the model, bit for bit.
    let mut zero = vector(&loaded, &[1, 2, 3], 0.0);
    zero.layers[5] = Some(vec![0.0; loaded.config().hidden_size]);
    fused.set_control_vector(Some(&zero)).unwrap();
    assert_eq!(run(&fused, &prompt), base);
    fused.set_control_vector(None).unwrap();
    assert!(!fused.has_control_vector());
    assert_eq!(run(&fused, &prompt), base);
}

#[test]
fn a_vector_for_another_shape_is_refused() {
    if skip() {
        return;
    }
    let dir = resolve_model(None).expect("provision the default model");
    let loaded = LoadedModel::open(&dir).unwrap();
    let mut model = model_on(&loaded, true);
    let c = loaded.config();
    for (hidden, layers) in [(c.hidden_size + 1, c.num_hidden_layers), (c.hidden_size, 2)] {
        let v = ControlVector {
            hidden,
            layers: vec![None; layers],
        };
        let e = model.set_control_vector(Some(&v)).unwrap_err().to_string();
        assert!(
            e.contains("control vector") && e.contains(&hidden.to_string()),
            "{e}"
        );
    }
}
