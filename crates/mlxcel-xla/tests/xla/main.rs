//! mlxcel-xla against the real `iree-compile` (provisioned by `scripts/provision-iree`) and, with
//! the `runtime` feature, the IREE runtime on the default model.

mod compile;
#[cfg(feature = "runtime")]
mod default_model;
#[cfg(feature = "runtime")]
mod invariants;

use std::path::PathBuf;
use std::process::Command;

use mlxcel_xla::Compiler;

/// The provisioned compiler (provisioning it on first use), caching into `cache`.
pub fn compiler(cache: PathBuf) -> Compiler {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/provision-iree"))
        .output()
        .expect("run scripts/provision-iree");
    assert!(
        out.status.success(),
        "scripts/provision-iree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    Compiler::new(bin.join("iree-compile"), cache, "host").expect("iree-compile runs")
}

pub fn skip_model_tests() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// A two-layer llama small enough to compile in seconds, shared by the emitter and runtime tests.
pub fn tiny_dims() -> mlxcel_xla::abi::LlamaDims {
    mlxcel_xla::abi::LlamaDims {
        layers: 2,
        hidden: 16,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        intermediate: 32,
        vocab: 64,
        rms_norm_eps: 1e-5,
        inv_freq: vec![1.0, 0.1, 0.01, 0.001],
        qkv_bias: true,
        out_bias: false,
        tied_embeddings: false,
        qk_norm: false,
        layer_attention: vec![
            mlxcel_model::LayerAttention {
                rope: true,
                window: None,
                linear: None,
                conv: None
            };
            2
        ],
        local_inv_freq: None,
        rotary_dim: 8,
        rope_mscale: 1.0,
        norm_offset: false,
        sandwich_norms: false,
        gelu: false,
        embedding_scale: None,
        attention_scale: 1.0 / 8f32.sqrt(),
        attn_softcap: None,
        final_softcap: None,
        packed: Default::default(),
    }
}
