//! The gated-DeltaNet hybrids (Qwen3-Next, Qwen3.5) as llama.cpp's converters write them: the
//! `{arch}.ssm.*` keys and which layers are recurrent, and per linear layer `attn_qkv` (q, k, v
//! of every head), `attn_gate` (z), `ssm_ba` (Qwen3-Next: per key head its value heads' b, then
//! a) or `ssm_beta`/`ssm_alpha` (Qwen3.5), `ssm_conv1d` (`[channels, taps]`), `ssm_a`
//! (`-exp(A_log)`), `ssm_dt.bias`, `ssm_norm` and `ssm_out`. Qwen3.5's converter moves the value
//! heads from grouped order (per key head its value heads) to tiled order (each key head's first
//! value head, then each one's second, ...).

use mlxcel_model::gguf::{GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, GatedDeltaNet, ModelConfig};

use super::experts::Tensor;
use super::{Error, tensor_f32};

/// Whether llama.cpp's architecture `arch` stores the value heads tiled.
fn tiled_arch(arch: &str) -> bool {
    matches!(arch, "qwen35" | "qwen35moe")
}

/// Writes the linear attention's keys (`None` of every layer: not a hybrid). llama.cpp's graphs
/// take value heads of the key heads' size (`ssm.state_size`, a square state): other sizes have
/// no GGUF form and are refused by name.
pub fn write_metadata(w: &mut GgufWriter, c: &ModelConfig, arch: &str) -> Result<(), Error> {
    let Some(net) = c.layers.iter().find_map(|l| l.linear) else {
        return Ok(());
    };
    if net.value_head_dim != net.key_head_dim {
        return Err(format!(
            "linear_value_head_dim {} differs from linear_key_head_dim {}: llama.cpp's `{arch}` \
             takes value heads of the key heads' size (ssm.state_size)",
            net.value_head_dim, net.key_head_dim
        )
        .into());
    }
    let key = |k: &str| format!("{arch}.{k}");
    let u32v = |v: usize| GgufValue::U32(v as u32);
    w.metadata(&key("ssm.conv_kernel"), u32v(net.conv_kernel))
        .metadata(&key("ssm.state_size"), u32v(net.key_head_dim))
        .metadata(&key("ssm.group_count"), u32v(net.key_heads))
        .metadata(&key("ssm.time_step_rank"), u32v(net.value_heads))
        .metadata(&key("ssm.inner_size"), u32v(net.value_dim()))
        .metadata(
            &key("attention.recurrent_layers"),
            GgufValue::Array(
                c.layers
                    .iter()
                    .map(|l| GgufValue::Bool(l.linear.is_some()))
                    .collect(),
            ),
        );
    if tiled_arch(arch) {
        // llama.cpp's Qwen3.5 reads multi-axis RoPE sections; a text position is the same on
        // every axis, so any split of the rotated pairs is plain RoPE.
        let pairs = c.rotary_dim / 2;
        let sections = [pairs - 2 * (pairs / 3), pairs / 3, pairs / 3, 0];
        w.metadata(
            &key("rope.dimension_sections"),
            GgufValue::Array(sections.iter().map(|&s| GgufValue::I32(s as i32)).collect()),
        );
    }
    Ok(())
}

/// A linear layer's projections and per-head tensors in one order: q, k (every key head), v, z,
/// b, a, `A_log`, `dt_bias` by value head, grouped or tiled as `tiled` says, and `out_proj`'s
/// columns in the same order.
struct Parts {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    tiled: bool,
}

/// `values`, one equal run per value head, from grouped to tiled order.
fn retile(values: &[f32], net: &GatedDeltaNet) -> Vec<f32> {
    let (kh, vh) = (net.key_heads, net.value_heads);
    let per = vh / kh;
    let head = values.len() / vh;
    let mut out = vec![0.0; values.len()];
    for h in 0..vh {
        let t = (h % per) * kh + h / per;
        out[t * head..(t + 1) * head].copy_from_slice(&values[h * head..(h + 1) * head]);
    }
    out
}

/// Columns of a `[rows, value_heads · value_head_dim]` matrix moved from grouped to tiled order.
fn retile_columns(values: &[f32], net: &GatedDeltaNet) -> Vec<f32> {
    let cols = net.value_dim();
    values
        .chunks_exact(cols)
        .flat_map(|row| retile(row, net))
        .collect()
}

fn read_parts(checkpoint: &Checkpoint, a: &str, net: &GatedDeltaNet) -> Result<Parts, Error> {
    let (dk, dv, kh, vh) = (
        net.key_head_dim,
        net.value_head_dim,
        net.key_heads,
        net.value_heads,
    );
    let per = vh / kh;
    let row =
        |values: &[f32], r: usize, n: usize, cols: usize| values[r * cols..(r + n) * cols].to_vec();
    if net.fused_projections {
        let (qkvz, shape) = tensor_f32(checkpoint, &format!("{a}.in_proj_qkvz"), "weight")?;
        let (ba, _) = tensor_f32(checkpoint, &format!("{a}.in_proj_ba"), "weight")?;
        let hidden = shape[1];
        let group = 2 * dk + 2 * per * dv;
        let mut parts = Parts {
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            z: Vec::new(),
            b: Vec::new(),
            a: Vec::new(),
            tiled: false,
        };
        for g in 0..kh {
            let at = g * group;
            parts.q.extend(row(&qkvz, at, dk, hidden));
            parts.k.extend(row(&qkvz, at + dk, dk, hidden));
            parts.v.extend(row(&qkvz, at + 2 * dk, per * dv, hidden));
            parts
                .z
                .extend(row(&qkvz, at + 2 * dk + per * dv, per * dv, hidden));
            parts.b.extend(row(&ba, g * 2 * per, per, hidden));
            parts.a.extend(row(&ba, g * 2 * per + per, per, hidden));
        }
        return Ok(parts);
    }
    let (qkv, shape) = tensor_f32(checkpoint, &format!("{a}.in_proj_qkv"), "weight")?;
    let hidden = shape[1];
    Ok(Parts {
        q: row(&qkv, 0, kh * dk, hidden),
        k: row(&qkv, kh * dk, kh * dk, hidden),
        v: row(&qkv, 2 * kh * dk, vh * dv, hidden),
        z: tensor_f32(checkpoint, &format!("{a}.in_proj_z"), "weight")?.0,
        b: tensor_f32(checkpoint, &format!("{a}.in_proj_b"), "weight")?.0,
        a: tensor_f32(checkpoint, &format!("{a}.in_proj_a"), "weight")?.0,
        tiled: net.tiled_value_heads,
    })
}

/// Every tensor of linear layer `layer` that is not a norm of the decoder layer, as llama.cpp's
/// `arch` stores it.
pub fn layer_tensors(
    checkpoint: &Checkpoint,
    c: &ModelConfig,
    arch: &str,
    layer: usize,
    net: &GatedDeltaNet,
) -> Result<Vec<Tensor>, Error> {
    let a = format!("model.layers.{layer}.linear_attn");
    let blk = format!("blk.{layer}");
    let hidden = c.hidden_size as u64;
    let mut parts = read_parts(checkpoint, &a, net)?;
    let tile = tiled_arch(arch) && !parts.tiled;
    if !tiled_arch(arch) && parts.tiled {
        return Err(format!("{a}: value heads in tiled order have no `{arch}` form").into());
    }
    let per_head = |values: &[f32], t: bool| -> Vec<f32> {
        if t {
            retile(values, net)
        } else {
            values.to_vec()
        }
    };
    if tile {
        parts.v = per_head(&parts.v, true);
        parts.z = per_head(&parts.z, true);
        parts.b = per_head(&parts.b, true);
        parts.a = per_head(&parts.a, true);
    }
    let (vh, value_dim, conv_dim) = (
        net.value_heads as u64,
        net.value_dim() as u64,
        net.conv_dim() as u64,
    );
    let tensor = |name: &str, imported_as: String, dims: Vec<u64>, values: Vec<f32>| Tensor {
        name: format!("{blk}.{name}"),
        imported_as,
        dims,
        values,
    };
    let mut out = Vec::new();
    let mut qkv = parts.q;
    qkv.extend(parts.k);
    qkv.extend(parts.v);
    out.push(tensor(
        "attn_qkv.weight",
        format!("{a}.in_proj_qkv.weight"),
        vec![hidden, conv_dim],
        qkv,
    ));
    out.push(tensor(
        "attn_gate.weight",
        format!("{a}.in_proj_z.weight"),
        vec![hidden, value_dim],
        parts.z,
    ));
    if tiled_arch(arch) {
        out.push(tensor(
            "ssm_beta.weight",
            format!("{a}.in_proj_b.weight"),
            vec![hidden, vh],
            parts.b,
        ));
        out.push(tensor(
            "ssm_alpha.weight",
            format!("{a}.in_proj_a.weight"),
            vec![hidden, vh],
            parts.a,
        ));
    } else {
        let per = net.value_heads / net.key_heads;
        let cols = c.hidden_size;
        let mut ba = Vec::with_capacity(parts.b.len() * 2);
        for g in 0..net.key_heads {
            ba.extend_from_slice(&parts.b[g * per * cols..(g + 1) * per * cols]);
            ba.extend_from_slice(&parts.a[g * per * cols..(g + 1) * per * cols]);
        }
        out.push(tensor(
            "ssm_ba.weight",
            format!("{a}.in_proj_ba.weight"),
            vec![hidden, 2 * vh],
            ba,
        ));
    }
    // The convolution's channels are q‖k‖v: only v's are per value head.
    let (mut conv, _) = tensor_f32(checkpoint, &format!("{a}.conv1d"), "weight")?;
    if tile {
        let qk = 2 * net.key_dim() * net.conv_kernel;
        let v = retile(&conv[qk..], net);
        conv.truncate(qk);
        conv.extend(v);
    }
    out.push(tensor(
        "ssm_conv1d.weight",
        format!("{a}.conv1d.weight"),
        vec![net.conv_kernel as u64, conv_dim],
        conv,
    ));
    let (a_log, _) = tensor_f32(checkpoint, &a, "A_log")?;
    let ssm_a: Vec<f32> = per_head(&a_log, tile).iter().map(|&x| -x.exp()).collect();
    out.push(tensor("ssm_a", format!("{a}.A_log"), vec![vh], ssm_a));
    let (dt, _) = tensor_f32(checkpoint, &a, "dt_bias")?;
    out.push(tensor(
        "ssm_dt.bias",
        format!("{a}.dt_bias"),
        vec![vh],
        per_head(&dt, tile),
    ));
    let (norm, _) = tensor_f32(checkpoint, &format!("{a}.norm"), "weight")?;
    out.push(tensor(
        "ssm_norm.weight",
        format!("{a}.norm.weight"),
        vec![net.value_head_dim as u64],
        norm,
    ));
    let (out_proj, _) = tensor_f32(checkpoint, &format!("{a}.out_proj"), "weight")?;
    let out_proj = if tile {
        retile_columns(&out_proj, net)
    } else {
        out_proj
    };
    out.push(tensor(
        "ssm_out.weight",
        format!("{a}.out_proj.weight"),
        vec![value_dim, hidden],
        out_proj,
    ));
    Ok(out)
}
