//! The llama program on the IREE runtime with tiny random weights: the KV cache, chunked prefill,
//! scratch rows and batching must not change any sequence's logits.

use mlxcel_xla::hlo::ElementType;
use mlxcel_xla::program::{
    ProgramShape, WeightFormat, cache_type, emit_llama, weight_specs, weight_type,
};
use mlxcel_xla::runtime::{BufferId, Runtime};

use crate::{compiler, tiny_dims};

const SHAPE: ProgramShape = ProgramShape {
    context_capacity: 16,
    batch: 2,
    chunk: 4,
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

struct Tiny {
    runtime: Runtime,
    module: String,
    weights: Vec<BufferId>,
    caches: Vec<BufferId>,
}

impl Tiny {
    fn new() -> Self {
        let d = tiny_dims();
        let dir = tempfile::tempdir().unwrap();
        let program = emit_llama(&d, &SHAPE, WeightFormat::F32).unwrap();
        let compiled = compiler(dir.path().to_owned()).compile(&program).unwrap();
        let runtime = Runtime::start().unwrap();
        runtime.load_module(&compiled.path).unwrap();
        let weights = weight_specs(&d)
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let ty = weight_type(spec, WeightFormat::F32);
                let values = random(ty.elements() as usize, i as u64, spec.name.contains("norm"));
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let shape = ty.dims.iter().map(|&x| x as usize).collect();
                runtime.upload(bytes, shape, ElementType::F32).unwrap()
            })
            .collect();
        let mut tiny = Self {
            runtime,
            module: SHAPE.module_name(WeightFormat::F32),
            weights,
            caches: Vec::new(),
        };
        tiny.reset();
        tiny
    }

    fn reset(&mut self) {
        let ty = cache_type(&tiny_dims(), &SHAPE);
        let shape: Vec<usize> = ty.dims.iter().map(|&x| x as usize).collect();
        self.caches = (0..2 * tiny_dims().layers)
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
            .read_f32(results[0], rows * tiny_dims().vocab)
            .unwrap()
    }

    /// Prefill of at most one chunk; logits of its last token.
    fn prefill(&mut self, row: i32, start: i32, tokens: &[i32]) -> Vec<f32> {
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
        self.call("prefill", step, 1)
    }

    fn decode(&mut self, tokens: [i32; 2], positions: [i32; 2]) -> Vec<f32> {
        let step = vec![
            self.runtime.upload_i32(&tokens, vec![2]).unwrap(),
            self.runtime.upload_i32(&positions, vec![2]).unwrap(),
        ];
        self.call("decode", step, 2)
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
