//! The llama program on the IREE runtime with tiny random weights: the KV cache, chunked prefill,
//! scratch rows and batching must not change any sequence's logits.

use half::f16;
use mlxcel_xla::abi::{
    Layout, LlamaDims, Packing, ProgramShape, WeightFormat, cache_type, weight_specs, weight_type,
    weight_types,
};
use mlxcel_xla::hlo::ElementType;
use mlxcel_xla::program::emit_llama;
use mlxcel_xla::runtime::{BufferId, Runtime};

use crate::{compiler, tiny_dims};

const SHAPE: ProgramShape = ProgramShape {
    context_capacity: 16,
    batch: 2,
    chunk: 4,
    min_window: 0,
};

/// Deterministic values in `[-0.5, 0.5)` (an LCG), norms near 1.
fn random(n: usize, seed: u64, around_one: bool) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let x = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            if around_one { 1.0 + 0.2 * x } else { x }
        })
        .collect()
}

/// One argument buffer: bytes, dims, element type.
type Buffer = (Vec<u8>, Vec<usize>, ElementType);

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Random f32 weights for every argument of `d` (as `WeightFormat::F32` lays them out).
fn random_weights(d: &LlamaDims) -> Vec<Buffer> {
    weight_specs(d)
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let ty = weight_type(spec, WeightFormat::F32);
            let values = random(ty.elements() as usize, i as u64, spec.name.contains("norm"));
            let shape = ty.dims.iter().map(|&x| x as usize).collect();
            (f32_bytes(&values), shape, ElementType::F32)
        })
        .collect()
}

/// Random MLX-quantized weights for the packed weights of `d`: the packed arguments, and the
/// same weights dequantized on the host (`scale · q + bias` in f32) as f32 arguments.
fn random_packed_weights(d: &LlamaDims) -> (Vec<Buffer>, Vec<Buffer>) {
    let (mut packed, mut dense) = (Vec::new(), Vec::new());
    for (i, spec) in weight_specs(d).iter().enumerate() {
        let ty = weight_type(spec, WeightFormat::F32);
        let Some(p) = spec.packed else {
            // Random values in whatever layout the argument has (blocked or not).
            let values = random(ty.elements() as usize, i as u64, spec.name.contains("norm"));
            let shape: Vec<usize> = ty.dims.iter().map(|&x| x as usize).collect();
            packed.push((f32_bytes(&values), shape.clone(), ElementType::F32));
            dense.push((f32_bytes(&values), shape, ElementType::F32));
            continue;
        };
        // The checkpoint's `[rows, cols]` (`spec.dims` is `[in, out]` when transposed).
        let (rows, cols) = match spec.layout {
            Layout::AsIs => (spec.dims[0] as usize, spec.dims[1] as usize),
            Layout::Transposed => (spec.dims[1] as usize, spec.dims[0] as usize),
        };
        let groups = cols / p.group;
        let levels = 1u32 << p.bits;
        let q: Vec<u32> = random(rows * cols, 100 + i as u64, false)
            .iter()
            .map(|x| ((x + 0.5) * levels as f32) as u32 % levels)
            .collect();
        let f16s = |seed| -> Vec<f16> {
            random(rows * groups, seed, false)
                .iter()
                .map(|&x| f16::from_f32(x * 0.1))
                .collect()
        };
        let (scales, biases) = (f16s(200 + i as u64), f16s(300 + i as u64));
        // MLX packing: little-endian u32 words, the first element in the lowest bits.
        let per_word = 32 / p.bits as usize;
        let words: Vec<u32> = q
            .chunks(per_word)
            .map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u32, |w, (k, &v)| w | (v << (k * p.bits as usize)))
            })
            .collect();
        let types = weight_types(spec, WeightFormat::Packed);
        let dims = |k: usize| {
            types[k]
                .dims
                .iter()
                .map(|&x| x as usize)
                .collect::<Vec<_>>()
        };
        packed.push((
            words.iter().flat_map(|w| w.to_le_bytes()).collect(),
            dims(0),
            types[0].element,
        ));
        for values in [&scales, &biases] {
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            packed.push((bytes, dims(1), ElementType::F16));
        }
        let mut w = vec![0f32; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                let g = r * groups + c / p.group;
                let v = scales[g].to_f32() * q[r * cols + c] as f32 + biases[g].to_f32();
                match spec.layout {
                    Layout::AsIs => w[r * cols + c] = v,
                    Layout::Transposed => w[c * rows + r] = v,
                }
            }
        }
        // The f32 format's argument: `[in, out]` split into blocks of columns when blocked.
        if let Some(block) = spec.block() {
            let (block, out) = (block as usize, rows);
            let mut blocked = Vec::with_capacity(w.len());
            for b in 0..out / block {
                for r in 0..cols {
                    blocked.extend_from_slice(&w[r * out + b * block..r * out + (b + 1) * block]);
                }
            }
            w = blocked;
        }
        let shape = ty.dims.iter().map(|&x| x as usize).collect();
        dense.push((f32_bytes(&w), shape, ElementType::F32));
    }
    (packed, dense)
}

struct Tiny {
    runtime: Runtime,
    module: String,
    dims: LlamaDims,
    shape: ProgramShape,
    weights: Vec<BufferId>,
    caches: Vec<BufferId>,
}

impl Tiny {
    fn new() -> Self {
        let d = tiny_dims();
        let weights = random_weights(&d);
        Self::with(d, WeightFormat::F32, weights)
    }

    fn with(d: LlamaDims, format: WeightFormat, weights: Vec<Buffer>) -> Self {
        Self::with_shape(d, SHAPE, format, weights)
    }

    fn with_shape(
        d: LlamaDims,
        shape: ProgramShape,
        format: WeightFormat,
        weights: Vec<Buffer>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let program = emit_llama(&d, &shape, format).unwrap();
        let compiled = compiler(dir.path().to_owned()).compile(&program).unwrap();
        Self::from_module(&compiled.path, d, shape, format, weights)
    }

    /// A fresh runtime with the compiled module at `module` loaded and `weights` uploaded.
    fn from_module(
        module: &std::path::Path,
        d: LlamaDims,
        shape: ProgramShape,
        format: WeightFormat,
        weights: Vec<Buffer>,
    ) -> Self {
        let runtime = Runtime::start().unwrap();
        runtime.load_module(module).unwrap();
        let weights = weights
            .into_iter()
            .map(|(bytes, shape, element)| runtime.upload(bytes, shape, element).unwrap())
            .collect();
        let mut tiny = Self {
            runtime,
            module: shape.module_name(format),
            dims: d,
            shape,
            weights,
            caches: Vec::new(),
        };
        tiny.reset();
        tiny
    }

    fn reset(&mut self) {
        let ty = cache_type(&self.dims, &self.shape);
        let shape: Vec<usize> = ty.dims.iter().map(|&x| x as usize).collect();
        self.caches = (0..2 * self.dims.layers)
            .map(|_| {
                self.runtime
                    .upload(
                        vec![0; ty.elements() as usize * 4],
                        shape.clone(),
                        ElementType::F32,
                    )
                    .unwrap()
            })
            .collect();
    }

    fn call(&mut self, function: &str, step: Vec<BufferId>, rows: usize) -> Vec<f32> {
        let mut args = self.weights.clone();
        args.extend(&self.caches);
        args.extend(&step);
        let results = self
            .runtime
            .call(
                &format!("{}.{function}", self.module),
                args,
                self.caches.clone(),
            )
            .unwrap();
        self.caches = results[1..].to_vec();
        self.runtime
            .read_f32(results[0], rows * self.dims.vocab)
            .unwrap()
    }

    /// Prefill of at most one chunk; logits of its last token.
    fn prefill(&mut self, row: i32, start: i32, tokens: &[i32]) -> Vec<f32> {
        self.prefill_by("prefill", row, start, tokens)
    }

    /// [`Self::prefill`] by `function` (a windowed prefill).
    fn prefill_by(&mut self, function: &str, row: i32, start: i32, tokens: &[i32]) -> Vec<f32> {
        let mut ids = tokens.to_vec();
        ids.resize(SHAPE.chunk, 0);
        let step = vec![
            self.runtime.upload_i32(&ids, vec![SHAPE.chunk]).unwrap(),
            self.runtime.upload_i32(&[row], vec![]).unwrap(),
            self.runtime.upload_i32(&[start], vec![]).unwrap(),
            self.runtime
                .upload_i32(&[tokens.len() as i32 - 1], vec![])
                .unwrap(),
        ];
        self.call(function, step, 1)
    }

    fn decode(&mut self, tokens: [i32; 2], positions: [i32; 2]) -> Vec<f32> {
        let step = vec![
            self.runtime.upload_i32(&tokens, vec![2]).unwrap(),
            self.runtime.upload_i32(&positions, vec![2]).unwrap(),
        ];
        self.call("decode", step, 2)
    }

    /// Decode of the first `tokens.len()` rows by `function`.
    fn decode_rows(&mut self, function: &str, tokens: &[i32], positions: &[i32]) -> Vec<f32> {
        let n = tokens.len();
        let step = vec![
            self.runtime.upload_i32(tokens, vec![n]).unwrap(),
            self.runtime.upload_i32(positions, vec![n]).unwrap(),
        ];
        self.call(function, step, n)
    }
}

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-4, "{what}: max |Δ| {diff}");
}

#[test]
fn cache_chunking_scratch_and_batching_leave_logits_unchanged() {
    let mut t = Tiny::new();
    let tokens = [3, 14, 15, 9, 26, 5, 35];
    let vocab = tiny_dims().vocab;

    // Reference: the whole sequence one token at a time through decode, row 0, row 1 idle.
    let mut one_by_one = Vec::new();
    for (p, &tok) in tokens.iter().enumerate() {
        let out = t.decode([tok, 0], [p as i32, SHAPE.context_capacity as i32]);
        one_by_one.push(out[..vocab].to_vec());
    }

    // Chunked prefill (4 + 3 tokens, the second chunk padded) into row 1 gives the same logits.
    t.reset();
    t.prefill(1, 0, &tokens[..4]);
    let last = t.prefill(1, 4, &tokens[4..]);
    assert_close(
        &last,
        &one_by_one[6],
        "chunked prefill vs token-by-token decode",
    );

    // Decoding both rows together: row 1 continues, row 0 starts fresh; neither disturbs the other.
    let both = t.decode([tokens[0], 7], [0, 7]);
    assert_close(&both[..vocab], &one_by_one[0], "row 0 beside a busy row 1");
    t.reset();
    t.prefill(0, 0, &tokens[..4]);
    let alone_row0 = t.prefill(0, 4, &tokens[4..]);
    let next = t.decode([7, 0], [7, SHAPE.context_capacity as i32]);
    assert_close(&alone_row0, &last, "the same sequence in row 0");
    assert_close(
        &next[..vocab],
        &both[vocab..],
        "row 1's decode step alone in row 0",
    );
}

/// With four cache rows, the two-row decode function gives rows 0 and 1 the logits of the
/// four-row one (rows 2 and 3 idle on scratch positions).
#[test]
fn the_two_row_decode_function_matches_the_whole_batch() {
    let shape = ProgramShape { batch: 4, ..SHAPE };
    let d = tiny_dims();
    let weights = random_weights(&d);
    let mut t = Tiny::with_shape(d, shape, WeightFormat::F32, weights);
    let tokens = [3, 14, 15, 9, 26];
    let scratch = SHAPE.context_capacity as i32;
    t.prefill(0, 0, &tokens[..4]);
    t.prefill(1, 0, &tokens[1..4]);
    let all = t.decode_rows("decode", &[tokens[4], 8, 0, 0], &[4, 3, scratch, scratch]);
    t.reset();
    t.prefill(0, 0, &tokens[..4]);
    t.prefill(1, 0, &tokens[1..4]);
    let two = t.decode_rows("decode_2", &[tokens[4], 8], &[4, 3]);
    let vocab = tiny_dims().vocab;
    assert_close(&two, &all[..2 * vocab], "decode_2 vs decode");
}

/// The windowed functions (attention over the first 4 or 8 positions of a row) give the logits
/// of the functions that attend over the whole row, for prefill chunks and decode steps that fit
/// their windows, and write the same caches.
#[test]
fn windowed_functions_match_the_whole_row() {
    let shape = ProgramShape {
        min_window: 4,
        ..SHAPE
    };
    assert_eq!(shape.windows(), [4, 8, 20]);
    let d = tiny_dims();
    let weights = random_weights(&d);
    let mut t = Tiny::with_shape(d, shape, WeightFormat::F32, weights);
    let tokens = [3, 14, 15, 9, 26, 5, 35];
    let scratch = SHAPE.context_capacity as i32;
    let vocab = tiny_dims().vocab;
    let run = |t: &mut Tiny, windowed: bool| {
        let name = |base: &str, window: usize| {
            if windowed {
                shape.function(base, window)
            } else {
                base.to_owned()
            }
        };
        t.reset();
        let mut out = vec![t.prefill_by(&name("prefill", 4), 0, 0, &tokens[..4])];
        out.push(t.prefill_by(&name("prefill", 8), 0, 4, &tokens[4..]));
        out.push(t.prefill_by(&name("prefill", 4), 1, 0, &tokens[..2]));
        // Row 0 at position 7 and row 1 at 2: window 8; then row 0 at 8 needs the whole row.
        let both = t.decode_rows(&name("decode", 8), &[11, 12], &[7, 2]);
        out.extend([both[..vocab].to_vec(), both[vocab..].to_vec()]);
        let next = t.decode_rows(&name("decode", 20), &[13, 0], &[8, scratch]);
        out.push(next[..vocab].to_vec());
        out
    };
    let whole = run(&mut t, false);
    let windowed = run(&mut t, true);
    for (i, (w, a)) in windowed.iter().zip(&whole).enumerate() {
        assert_close(w, a, &format!("step {i}: windowed vs whole row"));
    }
}

/// Packed weights (4-bit linears, an 8-bit embedding, f16 scales and biases) dequantized in the
/// graph give the logits of the same weights dequantized on the host and passed as f32.
#[test]
fn packed_weights_match_host_dequantized_weights() {
    let mut d = tiny_dims();
    for spec in weight_specs(&d) {
        if spec.always_f32 {
            continue;
        }
        let bits = if spec.name.contains("embed") { 8 } else { 4 };
        let packing = Packing {
            bits,
            group: 8,
            scales: ElementType::F16,
        };
        d.packed.insert(spec.name.clone(), packing);
    }
    let (packed, dense) = random_packed_weights(&d);
    let mut reference = Tiny::with(d.clone(), WeightFormat::F32, dense);
    let mut t = Tiny::with(d.clone(), WeightFormat::Packed, packed);
    let tokens = [3, 14, 15, 9, 26, 5, 35];
    let a = reference.prefill(0, 0, &tokens[..4]);
    let b = t.prefill(0, 0, &tokens[..4]);
    assert_close(&b, &a, "packed vs dense prefill");
    let a = reference.decode([tokens[4], 11], [4, 0]);
    let b = t.decode([tokens[4], 11], [4, 0]);
    assert_close(&b, &a, "packed vs dense decode");
    let mut tied = d.clone();
    tied.tied_embeddings = true;
    tied.packed.remove("lm_head.weight");
    let (packed, dense) = random_packed_weights(&tied);
    let mut reference = Tiny::with(tied.clone(), WeightFormat::F32, dense);
    let mut t = Tiny::with(tied, WeightFormat::Packed, packed);
    reference.prefill(1, 0, &tokens[..4]);
    let a = reference.prefill(1, 4, &tokens[4..]);
    t.prefill(1, 0, &tokens[..4]);
    let b = t.prefill(1, 4, &tokens[4..]);
    assert_close(&b, &a, "tied packed embedding vs dense");
}

/// Runtimes started, used and dropped on several threads at once share the process's device:
/// each computes the same logits, and dropping one disturbs none of the others.
#[test]
fn runtimes_come_and_go_on_several_threads() {
    let dir = tempfile::tempdir().unwrap();
    let d = tiny_dims();
    let program = emit_llama(&d, &SHAPE, WeightFormat::F32).unwrap();
    let compiled = compiler(dir.path().to_owned()).compile(&program).unwrap();
    let expected = Tiny::new().prefill(0, 0, &[3, 1, 4]);
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                for _ in 0..8 {
                    let weights = random_weights(&d);
                    let mut tiny = Tiny::from_module(
                        &compiled.path,
                        d.clone(),
                        SHAPE,
                        WeightFormat::F32,
                        weights,
                    );
                    assert_eq!(tiny.prefill(0, 0, &[3, 1, 4]), expected);
                    assert_eq!(tiny.prefill(1, 0, &[3, 1, 4]), expected);
                }
            });
        }
    });
}
