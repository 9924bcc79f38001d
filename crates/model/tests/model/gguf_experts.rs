//! Mixture-of-experts GGUF files as llama.cpp writes them: the `{arch}.expert_*` keys, the router
//! `ffn_gate_inp`, the experts stacked in `ffn_{gate,up,down}_exps` (`[experts, out, in]`) read as
//! one view per expert (the affine form and the GGUF blocks alike), the shared expert, Mixtral as
//! a `llama` with experts, and llama.cpp's routing per architecture.

use mlxcel_model::gguf::dequant::dequantize_reference;
use mlxcel_model::gguf::{GgmlType, GgufFile, GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, Routing, convert_gguf, converted, dequantize_affine};

use crate::fixtures::{Rng, TinyLlama, floats, random_tensor};

const EXPERTS: usize = 4;
const HIDDEN: usize = 64;
const EXPERT_FFN: usize = 32;

/// A two-layer MoE file of `arch`: experts' gate Q8_0, up Q4_0, down F16; the router F32; with
/// `shared`, Qwen2-MoE's shared expert and its vector gate.
fn write_moe(
    path: &std::path::Path,
    arch: &'static str,
    shared: bool,
    extra: &[(&str, GgufValue)],
) {
    let tiny = TinyLlama {
        arch,
        qk_norm: arch == "qwen3moe",
        hidden: HIDDEN,
        ..TinyLlama::default()
    };
    let mut w: GgufWriter = tiny.metadata();
    let key = |k: &str| format!("{arch}.{k}");
    w.metadata(&key("expert_count"), GgufValue::U32(EXPERTS as u32))
        .metadata(&key("expert_used_count"), GgufValue::U32(2));
    if arch != "llama" && arch != "olmoe" {
        w.metadata(
            &key("expert_feed_forward_length"),
            GgufValue::U32(EXPERT_FFN as u32),
        );
    } else {
        w.metadata(
            &key("feed_forward_length"),
            GgufValue::U32(EXPERT_FFN as u32),
        );
    }
    if shared {
        w.metadata(
            &key("expert_shared_feed_forward_length"),
            GgufValue::U32(96),
        );
    }
    for (k, v) in extra {
        w.metadata(&key(k), v.clone());
    }
    let mut rng = Rng::new(31);
    let (h, e, f) = (HIDDEN as u64, EXPERTS as u64, EXPERT_FFN as u64);
    let kv = (tiny.kv_heads * HIDDEN / tiny.heads) as u64;
    let vocab = tiny.tokens().0.len() as u64;
    let mut add = |w: &mut GgufWriter, name: String, dims: &[u64], ty: GgmlType| {
        let n = dims.iter().product::<u64>() as usize;
        w.tensor(&name, dims, ty, random_tensor(ty, n, &mut rng));
    };
    add(
        &mut w,
        "token_embd.weight".into(),
        &[h, vocab],
        GgmlType::F32,
    );
    add(&mut w, "output_norm.weight".into(), &[h], GgmlType::F32);
    for l in 0..2 {
        let b = |p: &str| format!("blk.{l}.{p}.weight");
        add(&mut w, b("attn_norm"), &[h], GgmlType::F32);
        add(&mut w, b("ffn_norm"), &[h], GgmlType::F32);
        add(&mut w, b("attn_q"), &[h, h], GgmlType::F32);
        add(&mut w, b("attn_k"), &[h, kv], GgmlType::F32);
        add(&mut w, b("attn_v"), &[h, kv], GgmlType::F32);
        add(&mut w, b("attn_output"), &[h, h], GgmlType::F32);
        if arch == "qwen3moe" {
            add(&mut w, b("attn_q_norm"), &[16], GgmlType::F32);
            add(&mut w, b("attn_k_norm"), &[16], GgmlType::F32);
        }
        if arch == "olmoe" {
            add(&mut w, b("attn_q_norm"), &[h], GgmlType::F32);
            add(&mut w, b("attn_k_norm"), &[kv], GgmlType::F32);
        }
        if arch == "qwen2moe" {
            for (p, n) in [("attn_q", h), ("attn_k", kv), ("attn_v", kv)] {
                add(&mut w, format!("blk.{l}.{p}.bias"), &[n], GgmlType::F32);
            }
        }
        add(&mut w, b("ffn_gate_inp"), &[h, e], GgmlType::F32);
        add(&mut w, b("ffn_gate_exps"), &[h, f, e], GgmlType::Q8_0);
        add(&mut w, b("ffn_up_exps"), &[h, f, e], GgmlType::Q4_0);
        add(&mut w, b("ffn_down_exps"), &[f, h, e], GgmlType::F16);
        if shared {
            add(&mut w, b("ffn_gate_inp_shexp"), &[h], GgmlType::F32);
            add(&mut w, b("ffn_gate_shexp"), &[h, 96], GgmlType::Q8_0);
            add(&mut w, b("ffn_up_shexp"), &[h, 96], GgmlType::Q8_0);
            add(&mut w, b("ffn_down_shexp"), &[96, h], GgmlType::F32);
        }
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    w.write(&mut out).unwrap();
}

/// Expert `j`'s rows of the stacked GGUF tensor `name`, dequantized as llama.cpp does.
fn expert_reference(gguf: &GgufFile, name: &str, j: usize) -> Vec<f32> {
    let info = gguf.tensor_info(name).unwrap();
    let data = gguf.tensor_data(info).unwrap();
    let per = data.len() / EXPERTS;
    dequantize_reference(info.ggml_type, &data[j * per..(j + 1) * per]).unwrap()
}

/// Expert `j`'s weight `module` as the checkpoint reads it, dequantized.
fn expert_read(ckpt: &Checkpoint, module: &str) -> Vec<f32> {
    let w = ckpt.tensor(&format!("{module}.weight")).unwrap();
    match ckpt.quantization_of(module) {
        None => floats(w.dtype, w.data),
        Some(spec) => {
            let s = ckpt.tensor(&format!("{module}.scales")).unwrap();
            let b = ckpt.tensor(&format!("{module}.biases")).unwrap();
            let (rows, cols) = (s.shape[0], s.shape[1] * spec.group_size);
            dequantize_affine(
                spec,
                rows,
                cols,
                w.data,
                (s.dtype, s.data),
                (b.dtype, b.data),
            )
            .unwrap()
        }
    }
}

#[test]
fn qwen3moe_experts_are_read_per_expert_from_the_stacked_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    write_moe(&path, "qwen3moe", false, &[]);
    let lazy = converted(&dir.path().join("cache"), &path, "0123abcd").unwrap();
    let ckpt = Checkpoint::open(&lazy).unwrap();
    let config = ckpt.config();
    assert_eq!(config.architecture.model_type(), "qwen3_moe");
    let moe = *config.layer_spec(1).ffn.routed().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate_size),
        (EXPERTS, 2, EXPERT_FFN)
    );
    // llama.cpp's qwen3moe renormalises the top-k weights.
    assert_eq!(moe.routing, Routing::SoftmaxTopK { renormalize: true });
    let gguf = GgufFile::open(&path).unwrap();
    for l in 0..2 {
        for (part, projection) in [
            ("gate", "gate_proj"),
            ("up", "up_proj"),
            ("down", "down_proj"),
        ] {
            for j in 0..EXPERTS {
                let module = format!("model.layers.{l}.mlp.experts.{j}.{projection}");
                assert_eq!(
                    expert_read(&ckpt, &module),
                    expert_reference(&gguf, &format!("blk.{l}.ffn_{part}_exps.weight"), j),
                    "{module}"
                );
            }
        }
    }
    // The int8 loader's view: expert 2's rows are the stack's rows 2·32 … 3·32.
    let blocks = ckpt
        .gguf_blocks("model.layers.0.mlp.experts.2.gate_proj.weight")
        .unwrap();
    let info = gguf.tensor_info("blk.0.ffn_gate_exps.weight").unwrap();
    let data = gguf.tensor_data(info).unwrap();
    let row_bytes = data.len() / (EXPERTS * EXPERT_FFN);
    assert_eq!((blocks.rows, blocks.cols), (EXPERT_FFN, HIDDEN));
    for r in [0, 5, EXPERT_FFN - 1] {
        let at = (2 * EXPERT_FFN + r) * row_bytes;
        assert_eq!(blocks.row(r), &data[at..at + row_bytes]);
    }
    assert_eq!(
        ckpt.quantization_of("model.layers.1.mlp.experts.3.gate_proj")
            .map(|s| s.bits),
        Some(8)
    );
    // Converting writes the same per-expert tensors.
    let written = convert_gguf(&path, &dir.path().join("written")).unwrap();
    let expected = Checkpoint::open(&written.out_dir).unwrap();
    for t in expected.tensors() {
        assert_eq!(ckpt.tensor(t.name).unwrap().data, t.data, "{}", t.name);
    }
}

#[test]
fn qwen2moe_shared_expert_olmoe_and_mixtral_read_their_experts() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, shared, model_type) in [
        ("qwen2moe", true, "qwen2_moe"),
        ("olmoe", false, "olmoe"),
        ("llama", false, "mixtral"),
    ] {
        let path = dir.path().join(format!("{arch}.gguf"));
        write_moe(&path, arch, shared, &[]);
        let out = dir.path().join(arch);
        let summary = convert_gguf(&path, &out).unwrap();
        let config = &summary.config;
        assert_eq!(config.architecture.model_type(), model_type, "{arch}");
        let moe = *config.layer_spec(0).ffn.routed().unwrap();
        assert_eq!(
            (moe.num_experts, moe.expert_intermediate_size),
            (EXPERTS, EXPERT_FFN)
        );
        let routing = match arch {
            "llama" => Routing::TopKSoftmax,
            _ => Routing::SoftmaxTopK { renormalize: false },
        };
        assert_eq!(moe.routing, routing, "{arch}");
        assert_eq!(moe.shared_expert_intermediate_size, shared.then_some(96));
        let ckpt = Checkpoint::open(&out).unwrap();
        if shared {
            let gate = ckpt
                .tensor("model.layers.1.mlp.shared_expert_gate.weight")
                .unwrap();
            assert_eq!(gate.shape, &[1, HIDDEN]);
            assert!(config.attention_qkv_bias);
        }
        if arch == "olmoe" {
            assert!(config.qk_norm_whole);
        }
    }
}

#[test]
fn expert_weights_norm_contradicting_llama_cpp_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    write_moe(
        &path,
        "qwen2moe",
        true,
        &[("expert_weights_norm", GgufValue::Bool(true))],
    );
    let message = convert_gguf(&path, &dir.path().join("out"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("qwen2moe.expert_weights_norm"),
        "{message}"
    );
    // Agreeing with llama.cpp is fine.
    write_moe(
        &path,
        "qwen2moe",
        true,
        &[("expert_weights_norm", GgufValue::Bool(false))],
    );
    convert_gguf(&path, &dir.path().join("ok")).unwrap();
    // Experts in a family without them are refused naming the count.
    let qwen3 = dir.path().join("qwen3.gguf");
    write_moe(&qwen3, "qwen3", false, &[]);
    let message = convert_gguf(&qwen3, &dir.path().join("q3"))
        .unwrap_err()
        .to_string();
    assert!(message.contains("qwen3.expert_count"), "{message}");
}
