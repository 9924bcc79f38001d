//! The chain's filters over a candidate list (`(token, logit)`, most likely first unless a stage
//! says otherwise) and the top-k and argmax passes over a whole vocabulary. Each filter sees the
//! logits multiplied by `scale` (the product of the temperature stages run so far), so that a
//! temperature before a filter changes what it sees without rewriting every logit, and keeps at
//! least `min_keep` candidates where llama.cpp's does.

/// A candidate: its token and its (untempered) logit.
pub(super) type Candidate = (u32, f32);

/// Every non-NaN token of `logits`, most likely first.
pub(super) fn materialize(candidates: &mut Vec<Candidate>, logits: &[f32]) {
    candidates.clear();
    candidates.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l)),
    );
    candidates.sort_unstable_by(by_logit_desc);
}

/// Each candidate's weight `exp((logit - max) * scale)` (the most likely one's is 1) and their
/// sum; `candidates` is sorted most likely first and not empty.
pub(super) fn weights(candidates: &[Candidate], scale: f64) -> (Vec<f64>, f64) {
    let max = candidates[0].1;
    let weights: Vec<f64> = candidates
        .iter()
        .map(|&(_, l)| (f64::from(l - max) * scale).exp())
        .collect();
    let total = weights.iter().sum();
    (weights, total)
}

/// The candidates' probabilities at `scale` (sorted most likely first, not empty).
pub(super) fn probabilities(candidates: &[Candidate], scale: f64) -> Vec<f64> {
    let (weights, total) = weights(candidates, scale);
    weights.into_iter().map(|w| w / total).collect()
}

/// Top-p: the smallest prefix whose probability mass reaches `top_p`, at least `min_keep` long.
pub(super) fn top_p_filter(
    candidates: &mut Vec<Candidate>,
    top_p: f32,
    min_keep: usize,
    scale: f64,
) {
    if candidates.is_empty() {
        return;
    }
    let (weights, total) = weights(candidates, scale);
    let mut mass = 0.0;
    for (i, w) in weights.iter().enumerate() {
        mass += w / total;
        if mass >= f64::from(top_p) && i + 1 >= min_keep {
            candidates.truncate(i + 1);
            return;
        }
    }
}

/// Min-p: the tokens at least `min_p` times as likely as the most likely one (always that one,
/// and at least `min_keep`).
pub(super) fn min_p_filter(
    candidates: &mut Vec<Candidate>,
    min_p: f32,
    min_keep: usize,
    scale: f64,
) {
    if candidates.is_empty() {
        return;
    }
    let (weights, _) = weights(candidates, scale);
    let floor = f64::from(min_p);
    let keep = weights.iter().take_while(|&&w| w >= floor).count();
    candidates.truncate(keep.max(min_keep).max(1));
}

/// Locally typical sampling (Meister et al., as llama.cpp's `llama_sampler_typical`): with `p_i`
/// the softmax and `H = -Σ p_i ln p_i` its entropy, the tokens are ordered by `|-ln p_i - H|`
/// (ties by likelihood) and kept until their mass exceeds `typical_p` (and there are at least
/// `min_keep`); the survivors are left most likely first.
pub(super) fn typical_filter(
    candidates: &mut Vec<Candidate>,
    typical_p: f32,
    min_keep: usize,
    scale: f64,
) {
    if candidates.is_empty() {
        return;
    }
    let probs = probabilities(candidates, scale);
    let entropy: f64 = probs
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| -p * p.ln())
        .sum();
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    let score = |i: usize| (-probs[i].ln() - entropy).abs();
    order.sort_by(|&a, &b| score(a).total_cmp(&score(b)));
    let mut mass = 0.0;
    let mut keep = order.len();
    for (n, &i) in order.iter().enumerate() {
        mass += probs[i];
        if mass > f64::from(typical_p) && (min_keep == 0 || n + 1 >= min_keep) {
            keep = n + 1;
            break;
        }
    }
    let mut kept: Vec<Candidate> = order[..keep].iter().map(|&i| candidates[i]).collect();
    kept.sort_unstable_by(by_logit_desc);
    *candidates = kept;
}

/// Top-n-sigma (Tang et al., as llama.cpp's `llama_sampler_top_n_sigma`): the logit below which
/// a token is dropped, `max - n * σ`, over the finite logits of `logits` (-inf, banned tokens,
/// and NaN do not count). The test does not depend on the temperature (it scales max and σ
/// alike). `None` when nothing is finite.
pub(super) fn top_n_sigma_floor(logits: impl Iterator<Item = f32> + Clone, n: f32) -> Option<f32> {
    let finite = logits.filter(|l| l.is_finite());
    let (mut count, mut sum, mut max) = (0usize, 0.0f64, f32::NEG_INFINITY);
    for l in finite.clone() {
        count += 1;
        sum += f64::from(l);
        max = max.max(l);
    }
    if count == 0 {
        return None;
    }
    let mean = sum / count as f64;
    let variance = finite.map(|l| (f64::from(l) - mean).powi(2)).sum::<f64>() / count as f64;
    Some(max - n * variance.sqrt() as f32)
}

/// XTC, once its chance has come up: the candidates with probability at least `threshold` are
/// removed but the least likely of them, unless fewer than `min_keep` would be left.
pub(super) fn xtc_filter(
    candidates: &mut Vec<Candidate>,
    threshold: f32,
    min_keep: usize,
    scale: f64,
) {
    if candidates.len() < 2 {
        return;
    }
    let probs = probabilities(candidates, scale);
    let above = probs
        .iter()
        .take_while(|&&p| p >= f64::from(threshold))
        .count();
    let last_above = above.saturating_sub(1);
    if last_above > 0 && candidates.len() - last_above >= min_keep {
        candidates.drain(..last_above);
    }
}

/// Dynamic temperature (llama.cpp's `llama_sampler_temp_ext`): the temperature between
/// `temperature - range` (at least 0) and `temperature + range` that the candidates' entropy,
/// normalised by its largest possible value `ln n`, raised to `exponent`, points at. `None` when
/// there is at most one candidate (nothing to scale).
pub(super) fn dynamic_temperature(
    candidates: &[Candidate],
    temperature: f32,
    range: f32,
    exponent: f32,
    scale: f64,
) -> Option<f32> {
    if candidates.len() <= 1 {
        return None;
    }
    let low = (temperature - range).max(0.0);
    let high = temperature + range;
    let max_entropy = (candidates.len() as f64).ln();
    let entropy: f64 = probabilities(candidates, scale)
        .into_iter()
        .filter(|&p| p > 0.0)
        .map(|p| -p * p.ln())
        .sum();
    let normalized = (entropy / max_entropy) as f32;
    Some(low + (high - low) * normalized.powf(exponent))
}

/// Most likely first; equal logits by lower token id.
pub(super) fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// A candidate in the top-k heap, ordered so that the heap's top is the worst one kept.
struct Kept((u32, f32));

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Kept {}

impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Kept {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        by_logit_desc(&self.0, &other.0)
    }
}

/// The `k` most likely tokens of `logits` (NaN never kept), in no particular order: one pass with
/// a bounded heap, where almost every token is rejected by one comparison with the worst kept.
/// The same set as sorting the whole vocabulary and keeping the first `k`.
pub(super) fn top_k_into(out: &mut Vec<(u32, f32)>, logits: &[f32], k: usize) {
    let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
    let mut worst = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        if heap.len() == k {
            // Ids only grow, so a tie with the worst kept loses to it.
            if l.total_cmp(&worst).is_le() {
                continue;
            }
            heap.pop();
        }
        heap.push(Kept((i as u32, l)));
        if heap.len() == k {
            worst = heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.1);
        }
    }
    out.extend(heap.into_iter().map(|kept| kept.0));
}

/// The index of the largest logit, the lowest index on ties; NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &value) in logits.iter().enumerate() {
        if value > best_value {
            best = i;
            best_value = value;
        }
    }
    best as u32
}
