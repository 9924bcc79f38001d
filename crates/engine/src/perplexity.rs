//! Perplexity as llama.cpp's `llama-perplexity` computes it, so that the two numbers compare
//! directly on the same model file and text.
//!
//! The text is tokenized whole (with the tokenizer's BOS when it adds one), cut into chunks of
//! `context` tokens (a last partial chunk is dropped), each chunk evaluated from an empty cache
//! with its first token replaced by BOS when the tokenizer adds one, and only the second half of
//! each chunk scored (positions `context/2 .. context-2` predicting the next token), so that
//! every scored token has at least half a window of context. The running estimate after each
//! chunk is `exp(mean NLL)`; the final error is llama-perplexity's: `ppl · √(var(NLL) / (n − 1))`.

use std::time::Instant;

use mlxcel_capacity::MaxNewTokens;
use mlxcel_model::{LoadedModel, resolve_model_with};

use crate::backend::{Backend, RequestShape, SequenceStep};
use crate::backends;
use crate::error::EngineError;
use crate::options::EngineOptions;

/// How to measure.
#[derive(Debug, Clone, Copy)]
pub struct PerplexityOptions {
    /// Tokens per chunk (llama-perplexity's `-c`, default 512).
    pub context: usize,
    /// At most this many chunks (`--chunks`); `None`: every whole chunk of the text.
    pub chunks: Option<usize>,
    /// Most tokens per forward pass (`-b`); a chunk longer than this is fed in parts.
    pub batch: usize,
}

impl Default for PerplexityOptions {
    fn default() -> Self {
        Self {
            context: 512,
            chunks: None,
            batch: 512,
        }
    }
}

/// The measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct PerplexityReport {
    /// Tokens in the text.
    pub tokens: usize,
    /// Chunks evaluated, and tokens scored over all of them.
    pub chunks: usize,
    pub scored: usize,
    /// The final estimate and its error (llama-perplexity's `PPL = x +/- y`).
    pub ppl: f64,
    pub error: f64,
    /// The estimate after each chunk (`[1]…,[2]…` in llama-perplexity's output).
    pub running: Vec<f64>,
    /// Seconds per chunk (the mean).
    pub seconds_per_chunk: f64,
}

/// Measures `text`'s perplexity under `model` (`None`: the default model) on the backend
/// `options` names. `progress(chunk, running_ppl)` is called after each chunk.
pub fn perplexity(
    model: Option<&str>,
    options: &EngineOptions,
    text: &str,
    settings: &PerplexityOptions,
    mut progress: impl FnMut(usize, f64),
) -> Result<PerplexityReport, EngineError> {
    let mut loaded = LoadedModel::open(&resolve_model_with(model, &options.kv_overrides)?)?;
    loaded.checkpoint.apply_rope_overrides(&options.rope)?;
    let tokens = loaded.tokenizer.encode(text, true, false)?;
    let plain = loaded.tokenizer.encode(text, false, false)?;
    // The BOS the tokenizer adds (llama.cpp's add_bos), if it adds one.
    let bos = (tokens.len() == plain.len() + 1).then(|| tokens[0]);
    let n_ctx = settings.context;
    let invalid =
        |setting: &'static str, value: usize, reason: String| EngineError::InvalidPerplexity {
            setting,
            value,
            reason,
        };
    let window = loaded.checkpoint.config().window();
    if n_ctx < 4 || n_ctx > window {
        return Err(invalid(
            "context",
            n_ctx,
            format!("expected between 4 and the model's window ({window})"),
        ));
    }
    if settings.batch == 0 {
        return Err(invalid("batch", 0, "expected at least 1".into()));
    }
    if tokens.len() < 2 * n_ctx {
        return Err(invalid(
            "context",
            n_ctx,
            format!(
                "the text tokenizes to {} tokens; it needs at least {} (two chunks): give a \
                 longer text or a smaller context",
                tokens.len(),
                2 * n_ctx
            ),
        ));
    }
    let whole = tokens.len() / n_ctx;
    let n_chunk = settings.chunks.map_or(whole, |c| c.min(whole));
    if n_chunk == 0 {
        return Err(invalid("chunks", 0, "expected at least 1".into()));
    }

    let mut backend = backends::load(&loaded.checkpoint, options)?;
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunk);
    let started = Instant::now();
    for chunk in 0..n_chunk {
        let mut input = tokens[chunk * n_ctx..(chunk + 1) * n_ctx].to_vec();
        if let Some(bos) = bos {
            input[0] = bos;
        }
        let logits = score_chunk(backend.as_mut(), &input, first, settings.batch)?;
        // Positions first ..= n_ctx - 2 predict the tokens after them.
        for (offset, row) in logits.iter().take(n_ctx - 1 - first).enumerate() {
            let target = input[first + offset + 1] as usize;
            let v = negative_log_likelihood(row, target);
            nll += v;
            nll2 += v * v;
        }
        count += n_ctx - 1 - first;
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        progress(chunk + 1, ppl);
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let variance = nll2 / count as f64 - mean * mean;
    let error = if variance > 0.0 && count > 1 {
        (variance / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(PerplexityReport {
        tokens: tokens.len(),
        chunks: n_chunk,
        scored: count,
        ppl,
        error,
        running,
        seconds_per_chunk: started.elapsed().as_secs_f64() / n_chunk as f64,
    })
}

/// One chunk from an empty cache, in parts of at most `batch` tokens: the logits of positions
/// `first..` (the earlier parts only fill the cache).
fn score_chunk(
    backend: &mut dyn Backend,
    input: &[u32],
    first: usize,
    batch: usize,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let plan = backend.create_session_for_request(&RequestShape {
        prompt_len: input.len(),
        image_tokens: 0,
        max_new_tokens: MaxNewTokens::Limited(1),
    })?;
    let slot = backend.allocate_slot(&plan)?;
    let mut scores = Vec::with_capacity(input.len() - first);
    let mut outcome = Ok(());
    let mut start = 0;
    while start < input.len() {
        let end = (start + batch).min(input.len());
        let step = SequenceStep {
            slot,
            tokens: &input[start..end],
            start_position: start,
        };
        let result = if end > first {
            backend
                .score(step, first.saturating_sub(start))
                .map(|rows| scores.extend(rows))
        } else {
            backend.step(&[step]).map(drop)
        };
        if let Err(err) = result {
            outcome = Err(err);
            break;
        }
        start = end;
    }
    backend.release_slot(slot);
    outcome.map(|()| scores)
}

/// `−log softmax(logits)[target]` as llama-perplexity computes it: the maximum subtracted, the
/// exponentials summed in f64.
fn negative_log_likelihood(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    -(f64::from(logits[target] - max) - sum.ln())
}

#[cfg(test)]
mod tests {
    use super::negative_log_likelihood;

    #[test]
    fn negative_log_likelihood_is_minus_log_softmax() {
        let logits = [1.0f32, 2.0, 3.0];
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        for (i, &l) in logits.iter().enumerate() {
            let expected = -(f64::from(l).exp() / z).ln();
            assert!((negative_log_likelihood(&logits, i) - expected).abs() < 1e-6);
        }
        // Shift-invariant, and finite for large logits.
        let big = [1000.0f32, 1001.0, 1002.0];
        assert!(
            (negative_log_likelihood(&big, 2) - negative_log_likelihood(&logits, 2)).abs() < 1e-6
        );
    }
}
