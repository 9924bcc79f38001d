//! The llama forward on the real default model (provisioned once through the project's cached,
//! checksummed script; skipped with `MLXCEL_SKIP_MODEL_TESTS=1`).

use std::sync::OnceLock;

use mlxcel_core::{Activations, Array, Dtype, ForwardSeq, Kernels, KvType, LlamaModel};
use mlxcel_model::{LoadedModel, resolve_model};

use crate::{argmax, assert_close, greedy};

fn skip() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

fn default_model() -> &'static (LoadedModel, LlamaModel) {
    static MODEL: OnceLock<(LoadedModel, LlamaModel)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = resolve_model(None)
            .expect("provision the default model (set MLXCEL_SKIP_MODEL_TESTS=1 to skip)");
        let loaded = LoadedModel::open(&dir).expect("the default model opens");
        let model = LlamaModel::load(&loaded.checkpoint).expect("the default model loads");
        (loaded, model)
    })
}

/// The greedy reference in f32 arithmetic over the quantized weights (docs/model.md).
#[test]
fn greedy_reference_text_on_the_default_model() {
    if skip() {
        return;
    }
    let (loaded, model) = default_model();
    let prompt = loaded
        .tokenizer
        .encode("The capital of France is", false, false)
        .unwrap();
    assert_eq!(prompt, [504, 3575, 282, 4649, 314]);
    let generated = greedy(model, &prompt, 30);
    let text = loaded.tokenizer.decode(&generated, true).unwrap();
    assert!(
        text.starts_with(" Paris.\n\nThe answer is: 2018-01-22 12:12:53."),
        "{text:?}"
    );
}

/// A batch of sequences of different lengths gives each the logits it gets alone, through
/// chunked prefill and batched decode.
#[test]
fn batched_and_chunked_steps_match_single_sequences() {
    if skip() {
        return;
    }
    let (loaded, model) = default_model();
    let tok = |text| loaded.tokenizer.encode(text, false, false).unwrap();
    let a = tok("The capital of France is");
    let b = tok("Rust is a systems programming language that");

    // Alone, in one prefill.
    let alone = |prompt: &[u32]| {
        let mut cache = model.new_cache(256);
        model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: prompt,
            }])
            .unwrap()
            .remove(0)
    };
    let (alone_a, alone_b) = (alone(&a), alone(&b));

    // Together: `b` prefilled in two chunks, the second in the same step as all of `a`.
    let (mut cache_a, mut cache_b) = (model.new_cache(256), model.new_cache(256));
    let split = 3;
    model
        .forward(&mut [ForwardSeq {
            cache: &mut cache_b,
            tokens: &b[..split],
        }])
        .unwrap();
    let together = model
        .forward(&mut [
            ForwardSeq {
                cache: &mut cache_a,
                tokens: &a,
            },
            ForwardSeq {
                cache: &mut cache_b,
                tokens: &b[split..],
            },
        ])
        .unwrap();
    assert_close(&together[0], &alone_a, 1e-3);
    assert_close(&together[1], &alone_b, 1e-3);
    assert_eq!((cache_a.len(), cache_b.len()), (a.len(), b.len()));

    // Batched decode of one token each matches decoding alone.
    let next_a = argmax(&alone_a);
    let next_b = argmax(&alone_b);
    let batched = model
        .forward(&mut [
            ForwardSeq {
                cache: &mut cache_a,
                tokens: &[next_a],
            },
            ForwardSeq {
                cache: &mut cache_b,
                tokens: &[next_b],
            },
        ])
        .unwrap();
    let mut solo = model.new_cache(256);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut solo,
            tokens: &b,
        }])
        .unwrap();
    let solo_b = model
        .forward(&mut [ForwardSeq {
            cache: &mut solo,
            tokens: &[next_b],
        }])
        .unwrap()
        .remove(0);
    assert_close(&batched[1], &solo_b, 1e-3);
}

#[test]
fn a_full_cache_and_bad_tokens_are_errors_not_crashes() {
    if skip() {
        return;
    }
    let (_, model) = default_model();
    let mut cache = model.new_cache(4);
    let err = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &[1, 2, 3, 4, 5],
        }])
        .unwrap_err();
    assert!(err.to_string().contains("KV cache full"), "{err}");
    let err = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &[49_152],
        }])
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    // The cache is untouched by the failed steps and still works.
    assert_eq!(cache.len(), 0);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &[1, 2],
        }])
        .unwrap();
    assert_eq!(cache.len(), 2);
}

/// The default model with int8 activations (`MLXCEL_ACTIVATIONS=int8`).
fn int8_model() -> &'static LlamaModel {
    static MODEL: OnceLock<LlamaModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let kernels = Kernels {
            activations: Activations::Int8,
            ..Kernels::native()
        };
        let (loaded, _) = default_model();
        LlamaModel::load_with(&loaded.checkpoint, kernels).expect("int8 loads")
    })
}

/// Teacher-forced over a fixed passage, one token per step: (Σ −log p(next), top-1 agreement
/// against `other`'s argmax) with `other`'s logits per step.
fn teacher_forced(model: &LlamaModel, tokens: &[u32]) -> (Vec<f64>, Vec<u32>) {
    let mut cache = model.new_cache(tokens.len());
    let (mut nll, mut top) = (Vec::new(), Vec::new());
    for i in 0..tokens.len() - 1 {
        let logits = model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &tokens[i..=i],
            }])
            .unwrap()
            .remove(0);
        let max = logits.iter().fold(f32::MIN, |m, &l| m.max(l)) as f64;
        let log_sum = logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln()
            + max;
        nll.push(log_sum - logits[tokens[i + 1] as usize] as f64);
        top.push(argmax(&logits));
    }
    (nll, top)
}

/// Int8 activations change the numbers a little, not the model: over a passage of English the
/// perplexity stays within 6% of the f32 path's and the most likely next token agrees at ≥ 90%
/// of positions (measured +3.5% and 96%: docs/kernels.md; llama.cpp quantizes activations the
/// same way, per block of 32 to max|x|/127, for this checkpoint's Q4_1 weights).
#[test]
fn int8_activations_keep_perplexity_and_top_tokens_of_the_f32_path() {
    if skip() {
        return;
    }
    let int8 = int8_model();
    let (loaded, f32_model) = default_model();
    let text = "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, \
                France. It is named after the engineer Gustave Eiffel, whose company designed \
                and built the tower from 1887 to 1889. Locally nicknamed the Iron Lady, it was \
                constructed as the centrepiece of the 1889 World's Fair, and to crown the \
                centennial anniversary of the French Revolution. Although initially criticised \
                by some of France's leading artists and intellectuals for its design, it has \
                since become a global cultural icon of France and one of the most recognisable \
                structures in the world.";
    let tokens = loaded.tokenizer.encode(text, false, false).unwrap();
    assert!(tokens.len() > 100, "{}", tokens.len());
    let (nll_f32, top_f32) = teacher_forced(f32_model, &tokens);
    let (nll_int8, top_int8) = teacher_forced(int8, &tokens);
    let ppl = |nll: &[f64]| (nll.iter().sum::<f64>() / nll.len() as f64).exp();
    let agree = top_f32
        .iter()
        .zip(&top_int8)
        .filter(|(a, b)| a == b)
        .count() as f64
        / top_f32.len() as f64;
    let (p32, p8) = (ppl(&nll_f32), ppl(&nll_int8));
    eprintln!(
        "{} tokens: perplexity f32 {p32:.4}, int8 {p8:.4} ({:+.2}%); top-1 agreement {:.1}%",
        tokens.len(),
        100.0 * (p8 / p32 - 1.0),
        100.0 * agree
    );
    assert!((p8 / p32 - 1.0).abs() < 0.06, "perplexity {p32} -> {p8}");
    assert!(agree >= 0.9, "top-1 agreement {agree}");
}

/// Steps `prompts` together, each prefilled in the given chunk sizes (the last chunk takes the
/// rest), then decoded greedily for `steps` tokens; returns each sequence's logits after its
/// prompt and after every decode step.
fn run_together(
    model: &LlamaModel,
    prompts: &[Vec<u32>],
    chunks: &[Vec<usize>],
    steps: usize,
) -> Vec<Vec<Vec<f32>>> {
    let mut caches: Vec<_> = prompts
        .iter()
        .map(|p| model.new_cache(p.len() + steps))
        .collect();
    // Per sequence: the token slices still to feed, in order.
    let mut pending: Vec<Vec<Vec<u32>>> = prompts
        .iter()
        .zip(chunks)
        .map(|(p, sizes)| {
            let mut out = Vec::new();
            let mut at = 0;
            for &size in sizes {
                out.push(p[at..at + size].to_vec());
                at += size;
            }
            out.push(p[at..].to_vec());
            out
        })
        .collect();
    let mut logits: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    let mut fed = vec![0usize; prompts.len()];
    loop {
        let active: Vec<usize> = (0..prompts.len())
            .filter(|&i| !pending[i].is_empty() || logits[i].len() < steps + 1)
            .collect();
        if active.is_empty() {
            break;
        }
        let tokens: Vec<Vec<u32>> = active
            .iter()
            .map(|&i| {
                if pending[i].is_empty() {
                    vec![argmax(logits[i].last().unwrap())]
                } else {
                    pending[i].remove(0)
                }
            })
            .collect();
        let mut seqs: Vec<ForwardSeq<'_>> = caches
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| active.contains(i))
            .zip(&tokens)
            .map(|((_, cache), tokens)| ForwardSeq { cache, tokens })
            .collect();
        let out = model.forward(&mut seqs).unwrap();
        for ((&i, l), t) in active.iter().zip(out).zip(&tokens) {
            fed[i] += t.len();
            if fed[i] >= prompts[i].len() {
                logits[i].push(l);
            }
        }
    }
    logits
}

/// With int8 activations a sequence gets the same bits batched or alone, whatever the chunking
/// of its prompt: each row of x is quantized on its own, the kernels compute a row the same way
/// for any batch, and attention splits keys on a fixed grid of positions. Checked over a prompt
/// longer than one 256-key range, prefilled in chunks beside other sequences' decode steps.
#[test]
fn int8_sequences_get_the_same_bits_batched_or_alone() {
    if skip() {
        return;
    }
    let model = int8_model();
    let (loaded, _) = default_model();
    let long = "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. "
        .repeat(20);
    let prompts: Vec<Vec<u32>> = [
        "The capital of France is",
        "Hi",
        long.as_str(),
        "Rust is a systems programming language that",
    ]
    .iter()
    .map(|t| loaded.tokenizer.encode(t, false, false).unwrap())
    .collect();
    assert!(prompts[2].len() > 300, "{}", prompts[2].len());
    let steps = 8;
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .map(|p| run_together(model, std::slice::from_ref(p), &[vec![]], steps).remove(0))
        .collect();
    let together = run_together(
        model,
        &prompts,
        &[vec![], vec![], vec![100, 150], vec![3]],
        steps,
    );
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.len(), steps + 1);
        for (step, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "sequence {i}, step {step}: batched logits differ from alone"
            );
        }
    }
}

/// The default model with int8 activations whose caches hold f16 keys and values
/// (`--cache-type-k f16 --cache-type-v f16`), on `kernels`.
fn f16_cache_model(kernels: Kernels) -> LlamaModel {
    let (loaded, _) = default_model();
    let mut model = LlamaModel::load_with(&loaded.checkpoint, kernels).expect("loads");
    model.set_kv_types(KvType::F16, KvType::F16).unwrap();
    model
}

/// f16 caches: each key and value is the f32 one rounded to the nearest half (MLX's
/// `astype(float16)`, checked on layer 0, whose inputs do not depend on the cache type), a
/// position costs half the bytes, int8 sequences still get the same bits batched or alone, the
/// per-op graph (MLX's attention, caches widened for it) agrees with the fused layer, the
/// logits stay close to an f32 cache's, and a cache's contents survive export and import.
#[test]
fn f16_caches_round_each_key_and_value_and_keep_the_batch_invariance() {
    if skip() {
        return;
    }
    let int8 = Kernels {
        activations: Activations::Int8,
        ..Kernels::native()
    };
    let f16 = f16_cache_model(int8);
    let f32_model = int8_model();
    assert_eq!(
        f16.kv_bytes_per_position() * 2,
        f32_model.kv_bytes_per_position()
    );
    let (loaded, _) = default_model();
    let prompt = loaded
        .tokenizer
        .encode(
            "The capital of France is Paris, and the capital of Italy is",
            false,
            false,
        )
        .unwrap();
    let run = |model: &LlamaModel| {
        let mut cache = model.new_cache(prompt.len() + 4);
        let logits = model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &prompt,
            }])
            .unwrap()
            .remove(0);
        (cache, logits)
    };
    let (c32, l32) = run(f32_model);
    let (c16, l16) = run(&f16);
    assert_eq!(c16.types(), (KvType::F16, KvType::F16));
    assert_eq!(c16.allocated_bytes() * 2, c32.allocated_bytes());
    // Layer 0's keys and values: the f32 cache's, rounded.
    let layer0 = c32.floats_per_position() / loaded.checkpoint.config().num_hidden_layers;
    let n = prompt.len();
    let (e32, e16) = (c32.export(n).unwrap(), c16.export(n).unwrap());
    let rounded = Array::from_f32(&e32[..layer0 * n], &[(layer0 * n) as i32])
        .unwrap()
        .astype(Dtype::F16)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert!(
        rounded
            .iter()
            .zip(&e16[..layer0 * n])
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "layer 0's f16 keys/values are not the f32 ones rounded"
    );
    assert_eq!(argmax(&l16), argmax(&l32));
    // With f32 activations (no int8 rounding to amplify the difference), the logits stay close
    // to an f32 cache's: every key and value moves by at most 2^-11 of itself.
    let f16_f32_activations = f16_cache_model(Kernels::native());
    let (_, lf) = run(&f16_f32_activations);
    let (_, lr) = run(&default_model().1);
    let scale = lr.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert_close(&lf, &lr, 2e-3 * scale);
    // The per-op graph on MLX's kernels rounds the same values into its caches.
    let mlx = f16_cache_model(Kernels {
        backend: mlxcel_core::KernelBackend::Mlx,
        fused_layers: false,
        activations: Activations::F32,
        ..Kernels::native()
    });
    let (_, lm) = run(&mlx);
    assert_close(&lm, &lf, 2e-3 * scale);
    // Export and import give back the same cache.
    let mut copy = f16.new_cache(n + 4);
    copy.import(&e16, n).unwrap();
    let again = copy.export(n).unwrap();
    assert!(
        again
            .iter()
            .zip(&e16)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    // A prefix is not copied between caches of different types.
    let mut f32_cache = f32_model.new_cache(n);
    let err = f32_cache.copy_prefix_from(&c16, n).unwrap_err().to_string();
    assert!(err.contains("f16") && err.contains("f32"), "{err}");
    // Batched or alone, chunked or not: the same bits with f16 caches too.
    let long = "The Eiffel Tower is a wrought-iron lattice tower in Paris. ".repeat(24);
    let prompts: Vec<Vec<u32>> = ["Hi", long.as_str(), "Rust is a language that"]
        .iter()
        .map(|t| loaded.tokenizer.encode(t, false, false).unwrap())
        .collect();
    assert!(prompts[1].len() > 260, "{}", prompts[1].len());
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .map(|p| run_together(&f16, std::slice::from_ref(p), &[vec![]], 4).remove(0))
        .collect();
    let together = run_together(&f16, &prompts, &[vec![], vec![100, 90], vec![2]], 4);
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        for (step, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "sequence {i}, step {step}: batched logits differ from alone (f16 caches)"
            );
        }
    }
}

/// q8_0 caches (`--cache-type-k q8_0 --cache-type-v q8_0`): the fused layer writes each row as
/// q8_0 blocks with llama.cpp's reference arithmetic (`quantize_q8_0`, checked on layer 0, whose
/// inputs do not depend on the cache type), a position costs 34 bytes per 32 values, int8
/// sequences still get the same bits batched or alone, the logits stay close to an f32 cache's,
/// a cache's contents survive export and import, and a model that runs the per-op graph refuses
/// the type with the reason.
#[test]
fn q8_0_caches_quantize_each_block_and_keep_the_batch_invariance() {
    if skip() {
        return;
    }
    let (loaded, f32_activations) = default_model();
    let load = |kernels: Kernels| {
        let mut model = LlamaModel::load_with(&loaded.checkpoint, kernels).expect("loads");
        model
            .set_kv_types(KvType::Q8_0, KvType::Q8_0)
            .map(|()| model)
    };
    let int8 = Kernels {
        activations: Activations::Int8,
        ..Kernels::native()
    };
    let q8 = load(int8).unwrap();
    let f32_model = int8_model();
    let c = loaded.checkpoint.config();
    assert_eq!(
        q8.kv_bytes_per_position(),
        c.num_hidden_layers * c.num_key_value_heads * 2 * (c.head_dim / 32 * 34)
    );
    let prompt = loaded
        .tokenizer
        .encode(
            "The capital of France is Paris, and the capital of Italy is",
            false,
            false,
        )
        .unwrap();
    let n = prompt.len();
    let run = |model: &LlamaModel| {
        let mut cache = model.new_cache(n + 4);
        let logits = model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &prompt,
            }])
            .unwrap()
            .remove(0);
        (cache, logits)
    };
    let (c32, l32) = run(f32_model);
    let (c8, l8) = run(&q8);
    assert_eq!(c8.types(), (KvType::Q8_0, KvType::Q8_0));
    assert_eq!(c8.bytes_per_position(), q8.kv_bytes_per_position());
    // Layer 0's keys and values: the f32 cache's, quantized (rows of head_dim values are whole
    // blocks, so the flat export quantizes block by block) and read back.
    let layer0 = c32.floats_per_position() / c.num_hidden_layers;
    let (e32, e8) = (c32.export(n).unwrap(), c8.export(n).unwrap());
    let expected = mlxcel_core::dequantize_q8_0(&mlxcel_core::quantize_q8_0(&e32[..layer0 * n]));
    assert!(
        expected
            .iter()
            .zip(&e8[..layer0 * n])
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "layer 0's q8_0 keys/values are not the f32 ones quantized"
    );
    assert_eq!(argmax(&l8), argmax(&l32));
    // With f32 activations, the logits stay close to an f32 cache's.
    let q8_f32_activations = load(Kernels::native()).unwrap();
    let (_, lf) = run(&q8_f32_activations);
    let (_, lr) = run(f32_activations);
    let scale = lr.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = lf
        .iter()
        .zip(&lr)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("q8_0 cache vs f32 cache: max |Δlogit| {worst:.3e} (largest logit {scale:.2})");
    assert!(worst < 2e-2 * scale, "{worst} of {scale}");
    assert_eq!(argmax(&lf), argmax(&lr));
    // Export and import give back the same cache.
    let mut copy = q8.new_cache(n + 4);
    copy.import(&e8, n).unwrap();
    assert!(
        copy.export(n)
            .unwrap()
            .iter()
            .zip(&e8)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    // Batched or alone, chunked or not: the same bits with q8_0 caches too.
    let long = "The Eiffel Tower is a wrought-iron lattice tower in Paris. ".repeat(24);
    let prompts: Vec<Vec<u32>> = ["Hi", long.as_str(), "Rust is a language that"]
        .iter()
        .map(|t| loaded.tokenizer.encode(t, false, false).unwrap())
        .collect();
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .map(|p| run_together(&q8, std::slice::from_ref(p), &[vec![]], 4).remove(0))
        .collect();
    let together = run_together(&q8, &prompts, &[vec![], vec![100, 90], vec![2]], 4);
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        for (step, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "sequence {i}, step {step}: batched logits differ from alone (q8_0 caches)"
            );
        }
    }
    // The per-op graph cannot write q8_0 blocks: refused, naming the path.
    let err = load(Kernels {
        fused_layers: false,
        ..Kernels::native()
    })
    .map(|_| ())
    .expect_err("refused")
    .to_string();
    assert!(
        err.contains("q8_0") && err.contains("MLXCEL_FUSED_LAYERS=off"),
        "{err}"
    );
}

/// Blocks shared between caches: a copied prefix shares its full blocks (and copies the
/// partial one), a sharer's writes never reach the other cache (a write into a shared block
/// copies it first, also after a truncation into it), and the logits are bitwise those of
/// caches that share nothing. On the fused layer with int8 activations (bitwise invariant to
/// chunking) and on the per-op graph (mlxcel's kernels; MLX's take minutes at this length),
/// whose writes are functional.
#[test]
fn shared_prefix_blocks_are_read_only_and_give_the_same_bits() {
    use mlxcel_core::KV_BLOCK;
    if skip() {
        return;
    }
    let per_op = {
        let (loaded, _) = default_model();
        LlamaModel::load_with(
            &loaded.checkpoint,
            Kernels {
                fused_layers: false,
                activations: Activations::F32,
                ..Kernels::native()
            },
        )
        .unwrap()
    };
    let tokens: Vec<u32> = (0..2 * KV_BLOCK as u32 + 88)
        .map(|i| (i * 7 + 1) % 3000)
        .collect();
    let bits = |logits: &[f32]| logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for model in [int8_model(), &per_op] {
        let step = |cache: &mut mlxcel_core::KvCache, tokens: &[u32]| {
            model
                .forward(&mut [ForwardSeq { cache, tokens }])
                .unwrap()
                .remove(0)
        };
        let total = tokens.len() + 8;
        let mut source = model.new_cache(total);
        step(&mut source, &tokens);
        let before = source.export(tokens.len()).unwrap();

        // 300 positions: block 0 shared, block 1 (44 positions of it) copied.
        let mut copy = model.new_cache(total);
        copy.copy_prefix_from(&source, 300).unwrap();
        assert_eq!((copy.blocks(), copy.shared_blocks()), (2, 1));
        assert_eq!(copy.block_ids().next(), source.block_ids().next());
        // The copy continues with the source's tokens: the source's last logits, bitwise.
        let mut fresh = model.new_cache(total);
        let fresh_logits = step(&mut fresh, &tokens);
        let copy_logits = step(&mut copy, &tokens[300..]);
        if std::ptr::eq(model, int8_model()) {
            assert_eq!(bits(&copy_logits), bits(&fresh_logits));
        }
        // Then each decodes its own token: the source is as if nothing shared its blocks.
        let (a, b) = (5u32, 9u32);
        let source_next = step(&mut source, &[a]);
        let fresh_next = step(&mut fresh, &[a]);
        step(&mut copy, &[b]);
        assert_eq!(bits(&source_next), bits(&fresh_next));

        // Truncated into a shared block and rewritten: the block is copied, the source keeps
        // its keys and values.
        let mut rewind = model.new_cache(total);
        rewind.copy_prefix_from(&source, 2 * KV_BLOCK).unwrap();
        assert_eq!((rewind.blocks(), rewind.shared_blocks()), (2, 2));
        assert!(rewind.reserved_blocks() >= 3);
        rewind.truncate(100);
        assert_eq!(
            rewind.reserved_blocks_at(100, total),
            total.div_ceil(KV_BLOCK) + 1
        );
        let other: Vec<u32> = (0..50).map(|i| (i * 13 + 2) % 3000).collect();
        step(&mut rewind, &other);
        assert_eq!(
            rewind.shared_blocks(),
            1,
            "block 0 was copied before the write"
        );
        let after = source.export(tokens.len()).unwrap();
        assert_eq!(
            bits(&before),
            bits(&after),
            "a sharer's writes reached the source"
        );
        // And the rewound cache computes what a fresh one does over the same tokens.
        let mut expected = model.new_cache(total);
        step(&mut expected, &tokens[..100]);
        let want = step(&mut expected, &other);
        let got = step(&mut rewind, &[a]);
        let want_next = step(&mut expected, &[a]);
        if std::ptr::eq(model, int8_model()) {
            assert_eq!(bits(&got), bits(&want_next));
        } else {
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert_close(&got, &want_next, 1e-3 * scale);
        }
    }
}
