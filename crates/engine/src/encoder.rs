//! What the engine does differently for an encoder model (a BERT GGUF, loaded by
//! [`crate::Engine::load_encoder`]): the options that apply to decoders only are refused by name,
//! generation is refused, and its one-line description.
//!
//! Not applicable to an encoder, and ignored as documented in docs/model.md ("Encoders"): the
//! scheduler's limits and KV budget and types (an encoder keeps no cache; each input runs whole,
//! one at a time between generation steps), the activations (it computes in f32), the thread
//! count, shapes, the prefix cache, and printing special tokens (it generates no text).

use mlxcel_model::encoder::BertCheckpoint;

use crate::error::EngineError;
use crate::options::EngineOptions;

/// Refuses, naming it, an option an encoder cannot honour.
pub(crate) fn check_options(options: &EngineOptions) -> Result<(), EngineError> {
    let refuse = |what: &str| {
        Err(EngineError::Unsupported {
            what: format!("{what} with an encoder model (BERT)"),
            backend: options.backend.as_str(),
            reason: "an encoder has no generation, no chat and no rotary positions",
        })
    };
    if options.speculative.is_some() || options.draft_model.is_some() {
        return refuse("speculative decoding (--spec-type, --spec-draft-model)");
    }
    if options.pipeline.is_some() {
        return refuse("a pipeline of ranks (--pipeline)");
    }
    if !options.lora_adapters.is_empty() {
        return refuse("LoRA adapters (--lora)");
    }
    if options.chat_template.is_some() {
        return refuse("a chat template (--chat-template)");
    }
    if options.rope != mlxcel_model::RopeOverrides::default() {
        return refuse("RoPE overrides (--rope-scaling, --rope-freq-base, ...)");
    }
    if !options.kv_overrides.is_empty() {
        return refuse("metadata overrides (--override-kv)");
    }
    if !options.control_vector.is_empty() {
        return refuse("control vectors (--control-vector, --control-vector-layer-range)");
    }
    Ok(())
}

/// The error a generation request gets from an encoder.
pub(crate) fn generation_refused() -> EngineError {
    EngineError::EncoderCannotGenerate
}

/// The model's one-line description, e.g. `bert: 2 layers, hidden 32, 4 heads, rank head`.
pub(crate) fn describe(bert: &BertCheckpoint) -> String {
    let c = &bert.config;
    let head = match &bert.head {
        Some(head) => format!("rank head of {} output(s)", head.outputs()),
        None => "no classification head".into(),
    };
    format!(
        "bert encoder: {} layers, hidden {}, {} heads, {} positions, {head}",
        c.layers, c.hidden, c.heads, c.positions
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_only_options_are_refused_by_name_and_the_rest_pass() {
        assert!(check_options(&EngineOptions::default()).is_ok());
        let cases: Vec<(EngineOptions, &str)> = vec![
            (
                EngineOptions {
                    draft_model: Some("draft.gguf".into()),
                    ..EngineOptions::default()
                },
                "--spec-draft-model",
            ),
            (
                EngineOptions {
                    lora_adapters: vec!["a.gguf".into()],
                    ..EngineOptions::default()
                },
                "--lora",
            ),
            (
                EngineOptions {
                    chat_template: Some("{{ messages }}".into()),
                    ..EngineOptions::default()
                },
                "--chat-template",
            ),
            (
                EngineOptions {
                    rope: mlxcel_model::RopeOverrides {
                        freq_base: Some(1e4),
                        ..Default::default()
                    },
                    ..EngineOptions::default()
                },
                "--rope-freq-base",
            ),
            (
                EngineOptions {
                    control_vector: mlxcel_model::ControlVectorSpec {
                        files: vec![("v.gguf".into(), 1.0)],
                        layer_range: None,
                    },
                    ..EngineOptions::default()
                },
                "--control-vector",
            ),
        ];
        for (options, flag) in cases {
            let err = check_options(&options).unwrap_err().to_string();
            assert!(
                err.contains(flag) && err.contains("encoder"),
                "{flag}: {err}"
            );
        }
        // What does not apply to an encoder is not refused.
        let ignored = EngineOptions {
            prefix_cache_bytes: 1 << 20,
            kv_budget_bytes: 1 << 20,
            ..EngineOptions::default()
        };
        assert!(check_options(&ignored).is_ok());
        assert!(generation_refused().to_string().contains("encoder"));
    }
}
