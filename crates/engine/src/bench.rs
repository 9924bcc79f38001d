//! Backend throughput without the scheduler: what `mlxcel bench` and `cargo bench` measure.
//!
//! Like llama-bench, a prompt test prefills `n` random tokens into an empty sequence and a
//! generation test decodes `n` tokens one at a time from an empty sequence; sampling and
//! detokenization are left out so the numbers are the backend's.

use std::time::{Duration, Instant};

use mlxcel_capacity::MaxNewTokens;
use mlxcel_model::{LoadedModel, resolve_model_with};

use crate::backend::{Backend, RequestShape, SequenceStep};
use crate::backends;
use crate::engine::ModelInfo;
use crate::error::EngineError;
use crate::options::EngineOptions;
use crate::rng::Rng;

/// A backend loaded for benchmarking.
pub struct BackendBench {
    backend: Box<dyn Backend>,
    info: ModelInfo,
    rng: Rng,
}

impl std::fmt::Debug for BackendBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendBench")
            .field("info", &self.info)
            .finish()
    }
}

impl BackendBench {
    /// Loads `model` (`None` for the default model) on the backend `options` name.
    pub fn load(model: Option<&str>, options: &EngineOptions) -> Result<Self, EngineError> {
        let mut loaded = LoadedModel::open(&resolve_model_with(model, &options.kv_overrides)?)?;
        loaded.checkpoint.apply_rope_overrides(&options.rope)?;
        let info = ModelInfo::from_loaded(&loaded, options.backend);
        let backend = backends::load(&loaded.checkpoint, options)?;
        Ok(Self {
            backend,
            info,
            rng: Rng::seeded(0x6d6c_7863_656c),
        })
    }

    /// How the backend runs the model ([`Backend::execution`]).
    pub fn execution(&self) -> String {
        self.backend.execution()
    }

    /// The model's description.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Bytes of weights the loaded model holds in the layout its kernels read
    /// ([`Backend::weight_bytes`]), else the checkpoint's ([`ModelInfo::weight_bytes`]).
    pub fn weight_bytes(&self) -> u64 {
        self.backend
            .weight_bytes()
            .unwrap_or(self.info.weight_bytes)
    }

    /// Bytes of weights one decode token reads ([`Backend::token_read_bytes`]: a mixture of
    /// experts' routed experts and the weights every token shares), else
    /// [`BackendBench::weight_bytes`].
    pub fn token_read_bytes(&self) -> u64 {
        self.backend
            .token_read_bytes()
            .unwrap_or_else(|| self.weight_bytes())
    }

    fn random_tokens(&mut self, n: usize) -> Vec<u32> {
        let vocab = self.backend.vocab_size() as u64;
        (0..n)
            .map(|_| (self.rng.next_u64() % vocab) as u32)
            .collect()
    }

    /// Time to prefill `n` random tokens, in chunks of at most `chunk`, into a sequence that
    /// already holds `depth` tokens (prefilled untimed first, as llama-bench's `-d`).
    pub fn prompt(
        &mut self,
        n: usize,
        chunk: usize,
        depth: usize,
    ) -> Result<Duration, EngineError> {
        self.after_context(n, chunk, depth, |backend, slot, tokens| {
            fill(backend, slot, tokens, depth, chunk)
        })
    }

    /// Time to decode `n` random tokens one at a time after `depth` tokens of context
    /// (prefilled untimed, in chunks of at most `chunk`).
    pub fn generate(
        &mut self,
        n: usize,
        chunk: usize,
        depth: usize,
    ) -> Result<Duration, EngineError> {
        self.after_context(n, chunk, depth, |backend, slot, tokens| {
            for (index, token) in tokens.iter().enumerate() {
                backend.step(&[SequenceStep {
                    slot,
                    tokens: std::slice::from_ref(token),
                    start_position: depth + index,
                }])?;
            }
            Ok(())
        })
    }

    /// Times `timed` over `n` random tokens in a fresh slot that first holds `depth` random
    /// tokens of context (prefilled untimed, in chunks of at most `chunk`).
    fn after_context(
        &mut self,
        n: usize,
        chunk: usize,
        depth: usize,
        timed: impl FnOnce(&mut dyn Backend, usize, &[u32]) -> Result<(), EngineError>,
    ) -> Result<Duration, EngineError> {
        let context = self.random_tokens(depth);
        let tokens = self.random_tokens(n);
        self.with_slot(depth + n, |backend, slot| {
            fill(backend, slot, &context, 0, chunk)?;
            let started = Instant::now();
            timed(backend, slot, &tokens)?;
            Ok(started.elapsed())
        })
    }

    /// Time for `streams` sequences to decode `n` tokens each, one batched step per token, after
    /// `depth` tokens of context each (at least one; prefilled untimed, in chunks of at most
    /// `chunk`). Aggregate throughput is `streams * n / time`.
    pub fn generate_streams(
        &mut self,
        streams: usize,
        n: usize,
        chunk: usize,
        depth: usize,
    ) -> Result<Duration, EngineError> {
        let streams = streams.max(1);
        let depth = depth.max(1);
        let tokens: Vec<Vec<u32>> = (0..streams)
            .map(|_| self.random_tokens(depth + n))
            .collect();
        let plan = self.backend.create_session_for_request(&RequestShape {
            prompt_len: depth + n,
            image_tokens: 0,
            max_new_tokens: MaxNewTokens::Limited(0),
        })?;
        let mut slots = Vec::with_capacity(streams);
        let result = (|| {
            for _ in 0..streams {
                slots.push(self.backend.allocate_slot(&plan)?);
            }
            for (&slot, t) in slots.iter().zip(&tokens) {
                fill(self.backend.as_mut(), slot, &t[..depth], 0, chunk)?;
            }
            let started = Instant::now();
            for position in depth..depth + n {
                let batch: Vec<SequenceStep<'_>> = slots
                    .iter()
                    .zip(&tokens)
                    .map(|(&slot, t)| SequenceStep {
                        slot,
                        tokens: &t[position..position + 1],
                        start_position: position,
                    })
                    .collect();
                self.backend.step(&batch)?;
            }
            Ok(started.elapsed())
        })();
        for slot in slots {
            self.backend.release_slot(slot);
        }
        result
    }

    fn with_slot(
        &mut self,
        positions: usize,
        run: impl FnOnce(&mut dyn Backend, usize) -> Result<Duration, EngineError>,
    ) -> Result<Duration, EngineError> {
        let plan = self.backend.create_session_for_request(&RequestShape {
            prompt_len: positions,
            image_tokens: 0,
            max_new_tokens: MaxNewTokens::Limited(0),
        })?;
        let slot = self.backend.allocate_slot(&plan)?;
        let result = run(self.backend.as_mut(), slot);
        self.backend.release_slot(slot);
        result
    }
}

/// Read bandwidth of main memory in GB/s, measured now: `threads` threads each sum their share of
/// a buffer far larger than the caches; the best of `rounds` passes counts.
pub fn measure_read_bandwidth(threads: usize, rounds: usize) -> f64 {
    const BYTES: usize = 512 << 20;
    let words = BYTES / 8;
    let buffer: Vec<u64> = (0..words as u64).collect();
    let threads = threads.max(1);
    let share = words.div_ceil(threads);
    let mut best = 0.0f64;
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        std::thread::scope(|scope| {
            for part in buffer.chunks(share) {
                scope.spawn(move || {
                    // Eight independent sums keep the loads in flight.
                    let mut sums = [0u64; 8];
                    for block in part.chunks_exact(8) {
                        for (sum, &word) in sums.iter_mut().zip(block) {
                            *sum = sum.wrapping_add(word);
                        }
                    }
                    std::hint::black_box(sums);
                });
            }
        });
        let seconds = started.elapsed().as_secs_f64();
        best = best.max(BYTES as f64 / seconds / 1e9);
    }
    best
}

/// Prefills `tokens` into `slot` from `start`, in chunks of at most `chunk`.
fn fill(
    backend: &mut dyn Backend,
    slot: usize,
    tokens: &[u32],
    start: usize,
    chunk: usize,
) -> Result<(), EngineError> {
    let chunk = chunk.max(1);
    for (index, piece) in tokens.chunks(chunk).enumerate() {
        backend.step(&[SequenceStep {
            slot,
            tokens: piece,
            start_position: start + index * chunk,
        }])?;
    }
    Ok(())
}
