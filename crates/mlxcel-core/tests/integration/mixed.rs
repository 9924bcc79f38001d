//! `mixed` activations: a per-matrix choice between the int8 and the f32 kernels, made at load.
//! Each matrix must run the choice for it on every path (the fused layer node and the per-op
//! graph), which the tiny model pins by bits: no matrix chosen gives the f32 model's logits,
//! every matrix the int8 model's, and a choice of some gives neither but stays close to f32.

use mlxcel_core::{Activations, ForwardSeq, Kernels, LlamaModel, Matrix};

use crate::reference::{PLAIN, Storage, Variant, assert_logits_close, open_tiny, write_tiny};

/// The logits of a 7-token prefill and three decode steps, and the final hidden states of the
/// prefill, under `kernels`.
fn run(checkpoint: &mlxcel_model::Checkpoint, kernels: Kernels) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let model = LlamaModel::load_with(checkpoint, kernels).expect("the tiny checkpoint loads");
    let prompt = [3u32, 17, 42, 5, 88, 61, 9];
    let hidden = model
        .forward_hidden(ForwardSeq {
            cache: &mut model.new_cache(64),
            tokens: &prompt,
        })
        .unwrap();
    let mut cache = model.new_cache(64);
    let mut steps = vec![
        model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &prompt,
            }])
            .unwrap()
            .remove(0),
    ];
    for token in [11u32, 29, 4] {
        steps.push(
            model
                .forward(&mut [ForwardSeq {
                    cache: &mut cache,
                    tokens: &[token],
                }])
                .unwrap()
                .remove(0),
        );
    }
    (steps, hidden)
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn mixed_runs_each_matrix_on_the_kernel_chosen_for_it() {
    for tied in [true, false] {
        let variant = Variant {
            storage: Storage::Quantized {
                bits: 4,
                group_size: 32,
                f16_scales: true,
            },
            tied,
            ..PLAIN
        };
        let tiny = write_tiny(variant, 58);
        let checkpoint = open_tiny(&tiny);
        for fused_layers in [true, false] {
            let with = |activations, int8_matrices: &'static [Matrix]| Kernels {
                activations,
                int8_matrices,
                fused_layers,
                ..Kernels::native()
            };
            let what = format!("tied {tied}, fused layers {fused_layers}");
            let (f32, f32_hidden) = run(&checkpoint, with(Activations::F32, &[]));
            let (int8, int8_hidden) = run(&checkpoint, with(Activations::Int8, &[]));
            assert_ne!(bits(&f32), bits(&int8), "{what}: int8 differs from f32");
            assert_ne!(bits(&f32_hidden), bits(&int8_hidden), "{what}");

            // No matrix chosen: the f32 model, bit for bit.
            let (none, _) = run(&checkpoint, with(Activations::Mixed, &[]));
            assert_eq!(bits(&none), bits(&f32), "{what}: mixed with no int8 matrix");
            // Every matrix chosen: the int8 model, bit for bit.
            let all = &[
                Matrix::Attention,
                Matrix::GateUp,
                Matrix::Down,
                Matrix::Head,
            ];
            let (every, _) = run(&checkpoint, with(Activations::Mixed, all));
            assert_eq!(
                bits(&every),
                bits(&int8),
                "{what}: mixed with every matrix int8"
            );

            // Only the output head in int8: the layers' hidden states are f32's, the logits
            // are not, but close.
            let (head, head_hidden) = run(&checkpoint, with(Activations::Mixed, &[Matrix::Head]));
            assert_eq!(bits(&head_hidden), bits(&f32_hidden), "{what}: f32 layers");
            assert_ne!(bits(&head), bits(&f32), "{what}: the head multiplies int8");
            // The default policy: int8 for gate/up and the head only, so neither model's bits.
            let kernels = Kernels {
                activations: Activations::Mixed,
                fused_layers,
                ..Kernels::native()
            };
            assert_eq!(kernels.int8_matrices, Matrix::MIXED_INT8);
            assert_eq!(
                kernels.matrix_activations(Matrix::Attention),
                Activations::F32
            );
            assert_eq!(kernels.matrix_activations(Matrix::Down), Activations::F32);
            assert_eq!(
                kernels.matrix_activations(Matrix::GateUp),
                Activations::Int8
            );
            assert_eq!(kernels.matrix_activations(Matrix::Other), Activations::F32);
            assert_eq!(kernels.matrix_activations(Matrix::Head), Activations::Int8);
            let (default, default_hidden) = run(&checkpoint, kernels);
            assert_ne!(bits(&default_hidden), bits(&f32_hidden), "{what}");
            assert_ne!(bits(&default_hidden), bits(&int8_hidden), "{what}");
            for (step, ((d, h), f)) in default.iter().zip(&head).zip(&f32).enumerate() {
                // Random tiny weights give wide activations: the dense int8 checks' bound.
                assert_logits_close(d, f, 0.15, &format!("{what}: mixed step {step}"));
                assert_logits_close(h, f, 0.15, &format!("{what}: int8 head step {step}"));
            }
        }
    }
}

/// The choice is the kernels' alone: f32 and int8 ignore `int8_matrices`.
#[test]
fn only_mixed_reads_the_matrix_choice() {
    let all = &[
        Matrix::Attention,
        Matrix::GateUp,
        Matrix::Down,
        Matrix::Head,
    ];
    for matrix in [
        Matrix::Attention,
        Matrix::GateUp,
        Matrix::Down,
        Matrix::Head,
        Matrix::Other,
    ] {
        for int8_matrices in [&[][..], &all[..]] {
            for activations in [Activations::F32, Activations::Int8] {
                let kernels = Kernels {
                    activations,
                    int8_matrices,
                    ..Kernels::native()
                };
                assert_eq!(kernels.matrix_activations(matrix), activations);
            }
        }
    }
}
