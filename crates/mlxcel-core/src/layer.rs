//! One llama decoder layer as a single MLX node on mlxcel's CPU kernels
//! (`cpp/kernels/layer.cc`): RMSNorm, the q/k/v matmul (stacked, or three when q, k and v are
//! quantized differently, as in llama.cpp's K-quant presets), the q/k norms (Qwen3), RoPE
//! (skipped on NoPE layers), the KV-cache write, attention (within the window on layers that
//! slide, with attention sinks where the model has them), the output projection (with its bias,
//! if any) and its residual, and the SwiGLU MLP (or a mixture of
//! experts: the routed-expert node's kernel, `crate::moe`) with its residual, for every
//! sequence of a step at once.
//!
//! The per-op graph costs ~10 MLX nodes per layer for one sequence and grows by ~6 per extra
//! sequence; each node has a fixed cost of ~15–20 µs here, which dominated decode and most of
//! all batched decode. The fused node computes the same numbers with the same kernels.

use crate::array::Array;
use crate::error::{Error, Result};
use crate::kernels::{Activations, Kernels};
use crate::moe::MoeNode;
use crate::quantized::QuantizedWeight;
use crate::sys::{self, Handle, ffi};

/// The q, k and v projections of a fused layer.
#[derive(Clone, Copy)]
pub(crate) enum Qkv<'a> {
    /// One matrix, `[(heads + 2·kv_heads)·head_dim, hidden]`: one matmul.
    Stacked(&'a QuantizedWeight),
    /// Three matrices (`[heads·head_dim, hidden]`, `[kv_heads·head_dim, hidden]` twice) whose
    /// layouts differ (a Q4_K q and k beside a Q6_K v): three matmuls into the same rows.
    Split(
        &'a QuantizedWeight,
        &'a QuantizedWeight,
        &'a QuantizedWeight,
    ),
}

impl<'a> Qkv<'a> {
    /// The stacked matrix, or q's.
    fn first(self) -> &'a QuantizedWeight {
        match self {
            Self::Stacked(w) | Self::Split(w, _, _) => w,
        }
    }

    /// Every matrix, stacked or q, k, v.
    pub fn all(self) -> Vec<&'a QuantizedWeight> {
        match self {
            Self::Stacked(w) => vec![w],
            Self::Split(q, k, v) => vec![q, k, v],
        }
    }
}

/// A fused layer's feed-forward block.
#[derive(Clone, Copy)]
pub(crate) enum LayerMlp<'a> {
    /// A gated MLP: gate and up stacked (`[2·intermediate, hidden]`), and down.
    Dense {
        gate_up: &'a QuantizedWeight,
        down: &'a QuantizedWeight,
    },
    /// Routed experts, prepared for the routed-expert node.
    Routed(&'a MoeNode),
}

/// A layer's tensors, all f32 except the packed weights.
pub(crate) struct LayerTensors<'a> {
    pub input_norm: &'a Array,
    /// q, k and v: stacked, or separate.
    pub qkv: Qkv<'a>,
    /// The q, k and v biases stacked as the rows of `qkv` (f32), when the model has them.
    pub qkv_bias: Option<&'a Array>,
    pub o: &'a QuantizedWeight,
    /// o's bias (`[hidden]`, f32), when the model has one (gpt-oss).
    pub o_bias: Option<&'a Array>,
    pub post_norm: &'a Array,
    pub mlp: LayerMlp<'a>,
    /// RoPE's inverse frequencies, `[head_dim / 2]`.
    pub inv_freq: &'a Array,
    /// The RMSNorm weights of q and k, when the model has them: per head (`[head_dim]` each),
    /// or with `qk_norm_whole` over the whole projections (`[heads·head_dim]` and
    /// `[kv_heads·head_dim]`, OLMoE).
    pub qk_norm: Option<(&'a Array, &'a Array)>,
    /// `qk_norm` normalizes the whole q and k projections before the heads are split.
    pub qk_norm_whole: bool,
    /// Whether the layer rotates q and k (false: a NoPE layer).
    pub rope: bool,
    /// The layer's sliding window, if it slides.
    pub window: Option<usize>,
    /// Gemma: the norms of the attention's and the MLP's outputs (before the residual adds).
    pub sandwich: Option<(&'a Array, &'a Array)>,
    /// GeGLU (GELU-tanh) instead of SwiGLU.
    pub gelu: bool,
    /// Soft-capping of the attention scores.
    pub softcap: Option<f32>,
    /// Each head's attention-sink logit (`[heads]`), when the layer has them.
    pub sinks: Option<&'a [f32]>,
}

/// The model's dimensions and constants as the layer needs them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerShape {
    pub hidden: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub intermediate: i32,
    pub eps: f32,
    /// The attention scale, `1/√head_dim`.
    pub scale: f32,
    /// RoPE's position scale.
    pub rope_scale: f32,
    /// Leading features of each head that RoPE rotates.
    pub rotary: i32,
    /// The factor on the rotated features (LongRoPE's attention factor).
    pub rope_mscale: f32,
}

/// One sequence's part of the step: `n` rows of `x` whose first position is `position`, and
/// the blocks of its layer caches (`[1, kv_heads, KV_BLOCK, head_dim]` each, block `b` holding
/// positions `b·KV_BLOCK..`), at least up to position `position + n`; the node writes the new
/// positions into them in place.
pub(crate) struct LayerSeq<'a> {
    pub n: usize,
    pub position: usize,
    pub keys: Vec<&'a Array>,
    pub values: Vec<&'a Array>,
}

/// LoRA deltas for a fused stack (`cpp/kernels/lora.h`): each layer's projections get
/// `Σ_j s_j(row) · B_j (A_j h)` over the adapters' pairs on them, `s_j(row)` the row's scale for
/// adapter `j` times the pair's factor.
#[derive(Debug, Default)]
pub(crate) struct StackLora<'a> {
    pub pairs: Vec<StackLoraPair<'a>>,
    /// Each adapter's scale per row of x: `[adapters, tokens]`, adapter-major.
    pub scales: Vec<f32>,
}

impl<'a> StackLora<'a> {
    /// The pairs on the stack's layers `range`, renumbered from its first (for a stack run in
    /// pieces); the scales are the rows', the same for every piece.
    pub fn layers(&self, range: std::ops::RangeInclusive<usize>) -> StackLora<'a> {
        let start = *range.start();
        StackLora {
            pairs: self
                .pairs
                .iter()
                .filter(|p| range.contains(&p.layer))
                .map(|p| StackLoraPair {
                    layer: p.layer - start,
                    ..*p
                })
                .collect(),
            scales: self.scales.clone(),
        }
    }
}

/// One adapter's pair on one projection of one layer of the stack.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StackLoraPair<'a> {
    /// The layer's place in the stack.
    pub layer: usize,
    /// 0 to 6: q, k, v, o, gate, up, down.
    pub target: i32,
    /// The adapter: its row of [`StackLora::scales`].
    pub adapter: usize,
    /// `Aᵀ`, f32 `[in, rank]`, contiguous.
    pub a_t: &'a Array,
    /// `Bᵀ`, f32 `[rank, out]`, contiguous.
    pub b_t: &'a Array,
    /// alpha / rank (1 where alpha is 0).
    pub factor: f32,
}

/// `x` (`[tokens, hidden]`, the sequences' rows in order) through the decoder layers
/// `layers` (each with its sequences' view of its caches), one after the other, as one MLX node:
/// each node costs MLX a fixed ~10–15 µs of scheduling and allocation, 30 of them a decode step of
/// a 30-layer model.
///
/// The blocks holding new positions must each own their buffer (not a broadcast, a view or an
/// array shared with another cache): the node writes the new keys and values into them.
/// [`crate::KvCache`] keeps them that way (a shared block is copied before it is written).
///
/// `keep`: empty, or the rows (ascending) the last layer's MLP runs on, and the only rows the
/// node returns (`[keep.len(), hidden]`): the rows whose logits a step reads. Not with LoRA.
pub(crate) fn decoder_stack(
    x: &Array,
    layers: &[(LayerTensors<'_>, Vec<LayerSeq<'_>>)],
    shape: &LayerShape,
    kernels: &Kernels,
    lora: Option<&StackLora<'_>>,
    keep: &[u32],
) -> Result<Array> {
    let to_i32 = |v: usize| {
        i32::try_from(v).map_err(|_| Error::Mlx {
            op: "decoder_layer",
            message: format!("{v} does not fit in i32"),
        })
    };
    let mut tensors: Vec<&Array> = vec![x];
    let mut caches: Vec<&Array> = Vec::new();
    let mut dims = Vec::with_capacity(16 * layers.len());
    let mut quant = Vec::with_capacity(18 * layers.len());
    let mut spans = Vec::new();
    let mut softcaps = Vec::with_capacity(layers.len());
    let mut sinks = Vec::new();
    let mut experts = Vec::new();
    for (t, seqs) in layers {
        let first = t.qkv.first();
        tensors.extend([
            t.input_norm,
            &first.weight,
            &first.scales,
            &first.biases,
            &t.o.weight,
            &t.o.scales,
            &t.o.biases,
            t.post_norm,
            t.inv_freq,
        ]);
        let mut weights = vec![first, t.o];
        let mlp = match t.mlp {
            LayerMlp::Dense { gate_up, down } => {
                tensors.extend([
                    &gate_up.weight,
                    &gate_up.scales,
                    &gate_up.biases,
                    &down.weight,
                    &down.scales,
                    &down.biases,
                ]);
                weights.extend([gate_up, down]);
                0
            }
            LayerMlp::Routed(node) => {
                experts.push(node);
                if kernels.activations == Activations::Int8 {
                    2
                } else {
                    1
                }
            }
        };
        if let Some((q_norm, k_norm)) = t.qk_norm {
            tensors.extend([q_norm, k_norm]);
        }
        if let Some((post_attention, post_feedforward)) = t.sandwich {
            tensors.extend([post_attention, post_feedforward]);
        }
        if let Some(bias) = t.qkv_bias {
            tensors.push(bias);
        }
        if let Qkv::Split(_, k, v) = t.qkv {
            tensors.extend([
                &k.weight, &k.scales, &k.biases, &v.weight, &v.scales, &v.biases,
            ]);
            weights.extend([k, v]);
        }
        if let Some(bias) = t.o_bias {
            tensors.push(bias);
        }
        quant.extend(weights.iter().flat_map(|w| {
            [
                w.group_size,
                w.bits,
                i32::from(w.layout_code(kernels.activations)),
            ]
        }));
        dims.extend([
            shape.hidden,
            shape.heads,
            shape.kv_heads,
            shape.head_dim,
            shape.intermediate,
            match (t.qk_norm.is_some(), t.qk_norm_whole) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            },
            i32::from(t.rope),
            to_i32(t.window.unwrap_or(0))?,
            i32::from(t.sandwich.is_some()),
            i32::from(t.gelu),
            shape.rotary,
            i32::from(t.qkv_bias.is_some()),
            i32::from(matches!(t.qkv, Qkv::Split(..))),
            i32::from(t.sinks.is_some()),
            mlp,
            i32::from(t.o_bias.is_some()),
        ]);
        softcaps.push(t.softcap.unwrap_or(0.0));
        sinks.extend_from_slice(t.sinks.unwrap_or_default());
        for s in seqs {
            if s.keys.len() != s.values.len() {
                return Err(Error::Mlx {
                    op: "decoder_layer",
                    message: format!(
                        "{} key blocks but {} value blocks",
                        s.keys.len(),
                        s.values.len()
                    ),
                });
            }
            spans.extend([to_i32(s.n)?, to_i32(s.position)?, to_i32(s.keys.len())?]);
            caches.extend(s.keys.iter().chain(&s.values).copied());
        }
    }
    let threads = kernels.threads.min(i32::MAX as usize) as i32;
    let no_lora = StackLora::default();
    let lora = lora.unwrap_or(&no_lora);
    let mut lora_pairs = Vec::with_capacity(3 * lora.pairs.len());
    for p in &lora.pairs {
        lora_pairs.extend([to_i32(p.layer)?, p.target, to_i32(p.adapter)?]);
    }
    let lora_factors: Vec<f32> = lora.pairs.iter().map(|p| p.factor).collect();
    let keep = keep
        .iter()
        .map(|&r| to_i32(r as usize))
        .collect::<Result<Vec<i32>>>()?;
    sys::with_lock(|| {
        let mut tensor_list = ffi::array_list_new();
        for a in tensors {
            ffi::array_list_push(tensor_list.pin_mut(), a.raw());
        }
        let mut cache_list = ffi::array_list_new();
        for block in caches {
            ffi::array_list_push(cache_list.pin_mut(), block.raw());
        }
        let mut experts_list = ffi::experts_list_new();
        for node in experts {
            ffi::experts_list_push(experts_list.pin_mut(), node.experts());
        }
        let mut lora_list = ffi::array_list_new();
        for p in &lora.pairs {
            ffi::array_list_push(lora_list.pin_mut(), p.a_t.raw());
            ffi::array_list_push(lora_list.pin_mut(), p.b_t.raw());
        }
        ffi::native_decoder_stack(
            &tensor_list,
            &cache_list,
            &dims,
            &quant,
            &spans,
            &softcaps,
            &sinks,
            &experts_list,
            &lora_list,
            &lora_pairs,
            &lora_factors,
            &lora.scales,
            shape.eps,
            shape.scale,
            shape.rope_scale,
            shape.rope_mscale,
            &keep,
            kernels.isa as u8,
            threads,
        )
        .map(Handle::new)
    })
    .map(Array::from_handle)
    .map_err(Error::mlx("decoder_layer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::eval;
    use crate::kv_cache::KV_BLOCK;

    const HIDDEN: i32 = 64;
    const HEADS: i32 = 2;
    const KV_HEADS: i32 = 1;
    const HEAD_DIM: i32 = 32;
    const FFN: i32 = 64;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    }

    fn matrix(rows: i32, cols: i32, seed: u32) -> QuantizedWeight {
        let w = Array::from_f32(&values((rows * cols) as usize, seed), &[rows, cols]).unwrap();
        QuantizedWeight::quantize(&w, 32, 4).unwrap()
    }

    struct Owned {
        norm: Array,
        inv_freq: Array,
        qkv: QuantizedWeight,
        o: QuantizedWeight,
        gate_up: QuantizedWeight,
        down: QuantizedWeight,
        keys: Array,
        values: Array,
    }

    fn layer(seed: u32, down_cols: i32) -> Owned {
        let block = |s| {
            let a = Array::from_f32(
                &values(KV_BLOCK * (KV_HEADS * HEAD_DIM) as usize, s),
                &[1, KV_HEADS, KV_BLOCK as i32, HEAD_DIM],
            )
            .unwrap();
            a.eval().unwrap();
            a
        };
        let owned = Owned {
            norm: Array::from_f32(&vec![1.0; HIDDEN as usize], &[HIDDEN]).unwrap(),
            inv_freq: Array::from_f32(
                &(0..HEAD_DIM / 2)
                    .map(|i| 10000f32.powf(-2.0 * i as f32 / HEAD_DIM as f32))
                    .collect::<Vec<_>>(),
                &[HEAD_DIM / 2],
            )
            .unwrap(),
            qkv: matrix((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, seed),
            o: matrix(HIDDEN, HEADS * HEAD_DIM, seed + 1),
            gate_up: matrix(2 * FFN, HIDDEN, seed + 2),
            down: matrix(HIDDEN, down_cols, seed + 3),
            keys: block(seed + 4),
            values: block(seed + 5),
        };
        let arrays = [
            &owned.norm,
            &owned.inv_freq,
            &owned.qkv.weight,
            &owned.o.weight,
            &owned.gate_up.weight,
            &owned.down.weight,
        ];
        eval(&arrays).unwrap();
        owned
    }

    fn tensors(l: &Owned) -> (LayerTensors<'_>, Vec<LayerSeq<'_>>) {
        (
            LayerTensors {
                input_norm: &l.norm,
                qkv: Qkv::Stacked(&l.qkv),
                qkv_bias: None,
                o: &l.o,
                o_bias: None,
                post_norm: &l.norm,
                mlp: LayerMlp::Dense {
                    gate_up: &l.gate_up,
                    down: &l.down,
                },
                inv_freq: &l.inv_freq,
                qk_norm: None,
                qk_norm_whole: false,
                rope: true,
                window: None,
                sandwich: None,
                gelu: false,
                softcap: None,
                sinks: None,
            },
            vec![LayerSeq {
                n: 1,
                position: 3,
                keys: vec![&l.keys],
                values: vec![&l.values],
            }],
        )
    }

    fn shape() -> LayerShape {
        LayerShape {
            hidden: HIDDEN,
            heads: HEADS,
            kv_heads: KV_HEADS,
            head_dim: HEAD_DIM,
            intermediate: FFN,
            eps: 1e-5,
            scale: 1.0 / (HEAD_DIM as f32).sqrt(),
            rope_scale: 1.0,
            rotary: HEAD_DIM,
            rope_mscale: 1.0,
        }
    }

    /// Three layers in one node give, bit for bit, what the same layers give as three nodes
    /// (each reading the previous one's output; inside the node the rows between layers
    /// alternate between two scratch buffers), and the cache writes land in each layer's own
    /// blocks.
    #[test]
    fn a_stack_of_layers_is_its_layers_one_after_the_other() {
        let kernels = Kernels::native();
        let x = Array::from_f32(&values(HIDDEN as usize, 7), &[1, HIDDEN]).unwrap();
        let (a, b, e) = (layer(11, FFN), layer(23, FFN), layer(37, FFN));
        let (c, d, f) = (layer(11, FFN), layer(23, FFN), layer(37, FFN));
        let stack = [tensors(&a), tensors(&b), tensors(&e)];
        let together = decoder_stack(&x, &stack, &shape(), &kernels, None, &[])
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let mut apart = x.clone();
        for one in [&c, &d, &f] {
            apart = decoder_stack(&apart, &[tensors(one)], &shape(), &kernels, None, &[]).unwrap();
        }
        let apart = apart.to_vec_f32().unwrap();
        assert!(together.iter().all(|v| v.is_finite()));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&together), bits(&apart));
        for (one, two) in [(&a, &c), (&b, &d), (&e, &f)] {
            for (p, q) in [(&one.keys, &two.keys), (&one.values, &two.values)] {
                assert_eq!(
                    bits(&p.to_vec_f32().unwrap()),
                    bits(&q.to_vec_f32().unwrap())
                );
            }
        }
        // Position 3 of the first layer's keys was written (RoPE'd k), position 4 not.
        let written = a.keys.to_vec_f32().unwrap();
        let fresh = layer(11, FFN).keys.to_vec_f32().unwrap();
        let row =
            |v: &[f32], p: usize| v[p * HEAD_DIM as usize..(p + 1) * HEAD_DIM as usize].to_vec();
        assert_ne!(bits(&row(&written, 3)), bits(&row(&fresh, 3)));
        assert_eq!(bits(&row(&written, 4)), bits(&row(&fresh, 4)));
    }

    /// With rows to keep, the node returns those rows alone, each the same as the whole step
    /// gives it (bit for bit with int8 activations, whose every row is a function of that row
    /// alone; within rounding with f32, whose kernels sum in another order for fewer rows),
    /// while the caches get every row's keys and values; rows that do not ascend or lie past
    /// the step are refused.
    #[test]
    fn kept_rows_are_the_rows_the_whole_step_gives() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let rows = 5usize;
        let x =
            Array::from_f32(&values(rows * HIDDEN as usize, 7), &[rows as i32, HIDDEN]).unwrap();
        fn step(l: &Owned, n: usize) -> (LayerTensors<'_>, Vec<LayerSeq<'_>>) {
            let (t, _) = tensors(l);
            let seq = LayerSeq {
                n,
                position: 3,
                keys: vec![&l.keys],
                values: vec![&l.values],
            };
            (t, vec![seq])
        }
        for activations in [Activations::F32, Activations::Int8] {
            let kernels = Kernels {
                activations,
                ..Kernels::native()
            };
            // Int8 activations multiply weights in the int8 layout (as a model loads them).
            let made = |seed| {
                let mut l = layer(seed, FFN);
                if activations == Activations::Int8 {
                    for w in [&mut l.qkv, &mut l.o, &mut l.gate_up, &mut l.down] {
                        *w = w.interleave_int8().unwrap();
                        eval(&[&w.weight]).unwrap();
                    }
                }
                l
            };
            // Fresh layers (and caches) for each run: the node writes the caches.
            let run = |keep: &[u32]| {
                let (a, b) = (made(11), made(23));
                let out = decoder_stack(
                    &x,
                    &[step(&a, rows), step(&b, rows)],
                    &shape(),
                    &kernels,
                    None,
                    keep,
                )
                .unwrap();
                (out, a, b)
            };
            let (whole, a, b) = run(&[]);
            let whole = whole.to_vec_f32().unwrap();
            let (kept, c, d) = run(&[1, 4]);
            assert_eq!(kept.shape(), vec![2, HIDDEN]);
            let kept = kept.to_vec_f32().unwrap();
            let h = HIDDEN as usize;
            for (i, r) in [1usize, 4].into_iter().enumerate() {
                let (k, w) = (&kept[i * h..(i + 1) * h], &whole[r * h..(r + 1) * h]);
                if activations == Activations::Int8 {
                    assert_eq!(bits(k), bits(w), "row {r}");
                } else {
                    for (a, b) in k.iter().zip(w) {
                        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "row {r}: {a} {b}");
                    }
                }
            }
            // Both layers' caches hold the same keys either way.
            for (one, other) in [(&a, &c), (&b, &d)] {
                assert_eq!(
                    bits(&one.keys.to_vec_f32().unwrap()),
                    bits(&other.keys.to_vec_f32().unwrap())
                );
            }
        }
        for bad in [&[3u32, 1][..], &[2, 2], &[5]] {
            let (e, f) = (layer(11, FFN), layer(23, FFN));
            let err = decoder_stack(
                &x,
                &[step(&e, rows), step(&f, rows)],
                &shape(),
                &Kernels::native(),
                None,
                bad,
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("rows to keep must ascend"), "{bad:?}: {err}");
        }
    }

    /// A malformed layer is refused with the layer's index and what is wrong with it.
    #[test]
    fn a_malformed_layer_is_refused_by_index() {
        let x = Array::from_f32(&values(HIDDEN as usize, 7), &[1, HIDDEN]).unwrap();
        let (a, b) = (layer(11, FFN), layer(23, 2 * FFN));
        let err = decoder_stack(
            &x,
            &[tensors(&a), tensors(&b)],
            &shape(),
            &Kernels::native(),
            None,
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("layer 1") && err.contains("down"), "{err}");
    }
}
