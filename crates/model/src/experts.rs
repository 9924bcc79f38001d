//! Checkpoints that store a layer's experts otherwise than one tensor per expert under
//! `mlp.experts.{j}.`, read as those canonical per-expert views without copying a byte: mlx-lm's
//! stacked `mlp.switch_mlp.{gate,up,down}_proj` (`[num_experts, ...]`, dense or MLX-quantized), and
//! Mixtral's Hugging Face names (`block_sparse_moe.gate`, `block_sparse_moe.experts.{j}.w1`/`w3`/
//! `w2` for gate/up/down) and its mlx-lm form (`block_sparse_moe.switch_mlp.*`), and gpt-oss's
//! mlx-lm form (the router `mlp.router`, the experts stacked as `mlp.experts.{gate,up,down}_proj`
//! with their biases), and Hugging Face's Gemma 4 (`mlp.switch_mlp.gate_up_proj` after its
//! family's renaming: each expert's gate rows, then its up rows).

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::safetensors_files::SafetensorsFiles;

/// The projections of an expert's gated MLP.
const PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// Renames and slices `files` so that every routed layer's experts are found under their
/// canonical names, and rewrites `config.quantization`'s per-module overrides of stacked or
/// renamed modules to the per-expert modules, so that quantization answers for each of them.
pub(crate) fn per_expert_views(
    config: &mut ModelConfig,
    files: &mut SafetensorsFiles,
) -> Result<()> {
    if let Some(info) = files.infos().find(|i| hf_fused_experts(i.name)) {
        return Err(ModelError::Safetensors {
            path: info.file.to_owned(),
            reason: format!(
                "tensor `{}` is Hugging Face's fused gpt-oss expert layout (`gate_up_proj` with \
                 gate and up interleaved, MXFP4 `_blocks`/`_scales`), which mlxcel does not \
                 read: use mlx-lm's conversion of the checkpoint (`mlx_lm.convert`) or a GGUF",
                info.name
            ),
        });
    }
    files.rename(|name| Some(canonical(name)))?;
    for layer in 0..config.num_hidden_layers {
        let Some(moe) = config.layer_spec(layer).ffn.routed().copied() else {
            continue;
        };
        let p = format!("model.layers.{layer}.mlp");
        for projection in PROJECTIONS {
            for suffix in ["weight", "scales", "biases", "bias"] {
                let parts: Vec<String> = (0..moe.num_experts)
                    .map(|j| format!("{p}.experts.{j}.{projection}.{suffix}"))
                    .collect();
                files.unstack(&format!("{p}.switch_mlp.{projection}.{suffix}"), &parts)?;
            }
        }
        // Hugging Face's Gemma 4 stacks each expert's gate and up rows as one
        // `[num_experts, 2 · size, hidden]` tensor (gate first; not interleaved as gpt-oss's).
        let fused: Vec<String> = (0..moe.num_experts)
            .map(|j| format!("{p}.experts.{j}.gate_up_proj.weight"))
            .collect();
        files.unstack(&format!("{p}.switch_mlp.gate_up_proj.weight"), &fused)?;
        let rows = moe.expert_intermediate_size;
        for (j, name) in fused.iter().enumerate() {
            let part = |projection: &str| (format!("{p}.experts.{j}.{projection}.weight"), rows);
            files.split_rows(name, &[part("gate_proj"), part("up_proj")])?;
        }
    }
    if let Some(q) = &mut config.quantization {
        let overrides = std::mem::take(&mut q.overrides);
        for (module, spec) in overrides {
            let module = canonical(&module);
            match stacked_module(&module) {
                Some((stem, projection)) => {
                    let experts = layer_of(&module)
                        .and_then(|l| config.feed_forward.get(l))
                        .and_then(|f| f.routed())
                        .map_or(0, |moe| moe.num_experts);
                    for j in 0..experts {
                        q.overrides
                            .insert(format!("{stem}experts.{j}.{projection}"), spec);
                    }
                }
                None => {
                    q.overrides.insert(module, spec);
                }
            }
        }
    }
    Ok(())
}

/// Whether `name` is one of Hugging Face's fused gpt-oss expert tensors
/// (`mlp.experts.gate_up_proj`, `…_bias`, `…_blocks`, `…_scales`, and `down_proj`'s).
fn hf_fused_experts(name: &str) -> bool {
    name.rsplit_once(".mlp.experts.").is_some_and(|(_, rest)| {
        rest.starts_with("gate_up_proj") || rest.starts_with("down_proj_") || rest == "down_proj"
    })
}

/// A tensor or module name with Mixtral's and gpt-oss's names made canonical:
/// `block_sparse_moe` is `mlp`, an expert's `w1`, `w3`, `w2` are its `gate_proj`, `up_proj`,
/// `down_proj`; gpt-oss's router `mlp.router` is `mlp.gate` and its stacked experts
/// `mlp.experts.{projection}` are `mlp.switch_mlp.{projection}`. Other names are returned as they
/// are.
fn canonical(name: &str) -> String {
    if let Some((stem, rest)) = name.split_once(".mlp.router")
        && (rest.is_empty() || rest.starts_with('.'))
    {
        return format!("{stem}.mlp.gate{rest}");
    }
    if let Some((stem, rest)) = name.split_once(".mlp.experts.")
        && let Some(projection) = PROJECTIONS
            .iter()
            .find(|p| rest == **p || rest.strip_prefix(**p).is_some_and(|s| s.starts_with('.')))
    {
        return format!(
            "{stem}.mlp.switch_mlp.{projection}{}",
            &rest[projection.len()..]
        );
    }
    if !name.contains("block_sparse_moe") {
        return name.to_owned();
    }
    let mut parts: Vec<&str> = name.split('.').collect();
    for i in 0..parts.len() {
        if parts[i] != "block_sparse_moe" {
            continue;
        }
        parts[i] = "mlp";
        if parts.get(i + 1) == Some(&"experts")
            && let Some(w) = parts.get_mut(i + 3)
        {
            *w = match *w {
                "w1" => "gate_proj",
                "w3" => "up_proj",
                "w2" => "down_proj",
                other => other,
            };
        }
    }
    parts.join(".")
}

/// A stacked module `….mlp.switch_mlp.{projection}` as its stem (`….mlp.`) and projection.
fn stacked_module(module: &str) -> Option<(&str, &str)> {
    let (stem, projection) = module.rsplit_once(".switch_mlp.")?;
    PROJECTIONS
        .contains(&projection)
        .then(|| (&module[..stem.len() + 1], projection))
}

/// The layer of a module `model.layers.{i}.…`.
fn layer_of(module: &str) -> Option<usize> {
    module
        .strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}
