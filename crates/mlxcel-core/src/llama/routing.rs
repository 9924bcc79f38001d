//! A routed-expert MLP's routing, on the host in f32: the router's logits of each normed token,
//! the experts each token goes to with their weights ([`Routing`], as mlx-lm's MoE models compute
//! them), and the step's tokens grouped by expert so that each expert's weights are read once.
//!
//! Every token's logits are a dot product in one fixed order, whatever the other tokens of the
//! step, so a token's route does not depend on the batch (with int8 activations a sequence's
//! logits are the same bits alone or batched; a router whose rounding moved with the batch could
//! send a token to another expert).

use mlxcel_model::Routing;

/// The router of one layer: `rows` rows of `hidden` f32 weights, the experts' then, with a
/// shared expert, its gate's row last.
#[derive(Debug)]
pub(super) struct Router {
    /// `[rows, hidden]`, row-major.
    pub(super) weights: Vec<f32>,
    pub(super) hidden: usize,
    pub(super) num_experts: usize,
    pub(super) top_k: usize,
    pub(super) routing: Routing,
    /// The last row is the shared expert's gate (`shared_expert_gate`, `[1, hidden]`).
    pub(super) shared_gate: bool,
    /// One bias per row added to its logit (gpt-oss's `gate.bias`), when the router has them.
    pub(super) bias: Option<Vec<f32>>,
    /// One value per expert added to its sigmoid to pick the experts, not to weight them
    /// (LFM2-MoE's `expert_bias`, [`Routing::SigmoidTopK`]).
    pub(super) selection_bias: Option<Vec<f32>>,
    /// One factor per expert that its weight is multiplied by once the experts are picked
    /// (Gemma 4's `router.per_expert_scale`).
    pub(super) expert_scales: Option<Vec<f32>>,
}

/// The routes of a step's tokens.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Routes {
    /// Per token, its `top_k` experts, the highest-weighted first.
    pub(super) experts: Vec<u32>,
    /// Per token, the weights of `experts`, in their order.
    pub(super) scores: Vec<f32>,
    /// Per token, `sigmoid(x · shared_expert_gateᵀ)`, with a shared expert.
    pub(super) shared: Option<Vec<f32>>,
}

/// One expert's share of a step: the tokens routed to it and their weights, and where each of
/// its rows goes among the step's routed rows.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ExpertGroup {
    pub(super) expert: u32,
    /// Token indices (rows of the step), ascending.
    pub(super) tokens: Vec<u32>,
    /// The weight of this expert for each of `tokens`.
    pub(super) scores: Vec<f32>,
    /// For each of `tokens`, which of the step's routes it is (`token · top_k + slot`, an index
    /// into [`Routes::experts`]).
    pub(super) routes: Vec<u32>,
}

/// Below this many multiply-adds the router runs on the calling thread.
const PARALLEL_WORK: usize = 1 << 22;

impl Router {
    /// The routes of the `h.len() / hidden` normed tokens in `h` (row-major), computed on up to
    /// `threads` threads.
    pub(super) fn route(&self, h: &[f32], threads: usize) -> Routes {
        self.route_split(h, threads, PARALLEL_WORK)
    }

    /// [`Router::route`], a thread per `work` multiply-adds at most.
    fn route_split(&self, h: &[f32], threads: usize, work: usize) -> Routes {
        let tokens = h.len() / self.hidden;
        let rows = self.weights.len() / self.hidden;
        let mut logits = vec![0.0f32; tokens * rows];
        let threads = threads
            .min((tokens * rows * self.hidden).div_ceil(work.max(1)))
            .max(1);
        let per = tokens.div_ceil(threads).max(1);
        if threads == 1 {
            self.logits(h, &mut logits);
        } else {
            std::thread::scope(|scope| {
                for (h, out) in h
                    .chunks(per * self.hidden)
                    .zip(logits.chunks_mut(per * rows))
                {
                    scope.spawn(move || self.logits(h, out));
                }
            });
        }
        let k = self.top_k;
        let mut routes = Routes {
            experts: Vec::with_capacity(tokens * k),
            scores: Vec::with_capacity(tokens * k),
            shared: self.shared_gate.then(|| Vec::with_capacity(tokens)),
        };
        for row in logits.chunks_exact(rows) {
            let (experts, mut scores) = self.pick(&row[..self.num_experts]);
            if let Some(scales) = &self.expert_scales {
                for (score, &e) in scores.iter_mut().zip(&experts) {
                    *score *= scales[e as usize];
                }
            }
            routes.experts.extend(experts);
            routes.scores.extend(scores);
            if let Some(shared) = &mut routes.shared {
                shared.push(sigmoid(row[self.num_experts]));
            }
        }
        routes
    }

    /// Every row's logits of the tokens in `h` into `out` (`[tokens, rows]`). Blocked for the
    /// caches (a 256-expert router of width 2,048 is 2 MB, streamed once per token when every
    /// token took every row in turn): rows in runs of [`ROW_RUN`] (kept in L2 while every token
    /// passes over them), tokens [`TOKEN_GROUP`] at a time (each row read once for the group).
    /// Each logit is [`dot`]'s arithmetic whatever the blocking, so the bits are the same.
    fn logits(&self, h: &[f32], out: &mut [f32]) {
        let rows = self.weights.len() / self.hidden;
        let tokens = h.len() / self.hidden;
        for first_row in (0..rows).step_by(ROW_RUN) {
            let run = first_row..(first_row + ROW_RUN).min(rows);
            for first in (0..tokens).step_by(TOKEN_GROUP) {
                let group = first..(first + TOKEN_GROUP).min(tokens);
                if group.len() == TOKEN_GROUP {
                    let xs: [&[f32]; TOKEN_GROUP] = std::array::from_fn(|i| {
                        &h[(first + i) * self.hidden..(first + i + 1) * self.hidden]
                    });
                    for row in run.clone() {
                        let w = &self.weights[row * self.hidden..(row + 1) * self.hidden];
                        for (i, logit) in dot_group(&xs, w).into_iter().enumerate() {
                            out[(first + i) * rows + row] = logit;
                        }
                    }
                } else {
                    for token in group {
                        let x = &h[token * self.hidden..(token + 1) * self.hidden];
                        for row in run.clone() {
                            let w = &self.weights[row * self.hidden..(row + 1) * self.hidden];
                            out[token * rows + row] = dot(x, w);
                        }
                    }
                }
            }
        }
        if let Some(bias) = &self.bias {
            for out in out.chunks_exact_mut(rows) {
                for (logit, b) in out.iter_mut().zip(bias) {
                    *logit += b;
                }
            }
        }
    }

    /// One token's experts (highest weight first; ties to the lower index) and weights.
    fn pick(&self, logits: &[f32]) -> (Vec<u32>, Vec<f32>) {
        let k = self.top_k;
        match self.routing {
            Routing::SoftmaxTopK { renormalize } => {
                let probs = softmax(logits);
                let experts = top_k(&probs, k);
                let mut scores: Vec<f32> = experts.iter().map(|&e| probs[e as usize]).collect();
                if renormalize {
                    let total: f32 = scores.iter().sum();
                    scores.iter_mut().for_each(|s| *s /= total);
                }
                (experts, scores)
            }
            Routing::TopKSoftmax => {
                let experts = top_k(logits, k);
                let picked: Vec<f32> = experts.iter().map(|&e| logits[e as usize]).collect();
                (experts, softmax(&picked))
            }
            Routing::SigmoidTopK { renormalize, .. } => {
                let probs: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
                let experts = match &self.selection_bias {
                    Some(bias) => {
                        let biased: Vec<f32> = probs.iter().zip(bias).map(|(p, b)| p + b).collect();
                        top_k(&biased, k)
                    }
                    None => top_k(&probs, k),
                };
                let mut scores: Vec<f32> = experts.iter().map(|&e| probs[e as usize]).collect();
                if renormalize {
                    // mlx-lm's and transformers' 1e-6 beside the sum.
                    let total: f32 = scores.iter().sum::<f32>() + 1e-6;
                    scores.iter_mut().for_each(|s| *s /= total);
                }
                (experts, scores)
            }
        }
    }
}

impl Routes {
    /// The step's routed rows grouped by expert, experts ascending, each expert's tokens
    /// ascending; experts no token goes to are left out.
    pub(super) fn groups(&self, num_experts: usize, top_k: usize) -> Vec<ExpertGroup> {
        let mut groups: Vec<ExpertGroup> = (0..num_experts as u32)
            .map(|expert| ExpertGroup {
                expert,
                tokens: Vec::new(),
                scores: Vec::new(),
                routes: Vec::new(),
            })
            .collect();
        for (i, (&expert, &score)) in self.experts.iter().zip(&self.scores).enumerate() {
            let group = &mut groups[expert as usize];
            group.tokens.push((i / top_k) as u32);
            group.scores.push(score);
            group.routes.push(i as u32);
        }
        groups.retain(|g| !g.tokens.is_empty());
        groups
    }
}

/// Router rows one run of [`Router::logits`] covers (256 KB of weights at width 2,048).
const ROW_RUN: usize = 32;
/// Tokens that share each read of a router row in [`Router::logits`].
const TOKEN_GROUP: usize = 4;

/// [`dot`] of each of `xs` with `w`: the same operations per token in the same order (so the
/// same bits), the tokens' partial sums side by side so that each `w` value is loaded once.
fn dot_group(xs: &[&[f32]; TOKEN_GROUP], w: &[f32]) -> [f32; TOKEN_GROUP] {
    let mut acc = [[0.0f32; 8]; TOKEN_GROUP];
    let full = w.len() / 8 * 8;
    for c in (0..full).step_by(8) {
        let b = &w[c..c + 8];
        for (acc, x) in acc.iter_mut().zip(xs) {
            let a = &x[c..c + 8];
            for i in 0..8 {
                acc[i] += a[i] * b[i];
            }
        }
    }
    std::array::from_fn(|t| {
        let acc = &acc[t];
        let mut total =
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (a, b) in xs[t][full..].iter().zip(&w[full..]) {
            total += a * b;
        }
        total
    })
}

/// `x · w` in f32, summed in eight interleaved partial sums (a fixed order the compiler can
/// vectorize).
fn dot(x: &[f32], w: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xc, wc) = (x.chunks_exact(8), w.chunks_exact(8));
    let (xr, wr) = (xc.remainder(), wc.remainder());
    for (a, b) in xc.zip(wc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i];
        }
    }
    let mut total =
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (a, b) in xr.iter().zip(wr) {
        total += a * b;
    }
    total
}

/// Softmax in f32, the maximum subtracted first.
fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let total: f32 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The indices of the `k` largest values, largest first; among equal values the lower index
/// first. A NaN counts as smaller than every number.
fn top_k(values: &[f32], k: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    let key = |i: u32| {
        let v = values[i as usize];
        if v.is_nan() { f32::NEG_INFINITY } else { v }
    };
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order.truncate(k);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(routing: Routing, top_k: usize, shared_gate: bool) -> Router {
        // Three experts over a two-wide hidden state: logits x0, x1 and x0 + x1.
        let mut weights = vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        if shared_gate {
            weights.extend([0.5, -0.5]);
        }
        Router {
            weights,
            hidden: 2,
            num_experts: 3,
            top_k,
            routing,
            shared_gate,
            bias: None,
            selection_bias: None,
            expert_scales: None,
        }
    }

    #[test]
    fn sigmoid_scores_picked_with_the_selection_bias_and_weighted_without_it() {
        // Logits 3, -1, 2: the bias lifts expert 1 above expert 2 for the pick only.
        let routing = Routing::SigmoidTopK {
            renormalize: true,
            selection_bias: true,
        };
        let mut r = router(routing, 2, false);
        r.selection_bias = Some(vec![0.0, 1.0, 0.0]);
        let routes = r.route(&[3.0, -1.0], 1);
        assert_eq!(routes.experts, [1, 0]);
        let (a, b) = (sigmoid(-1.0), sigmoid(3.0));
        let total = a + b + 1e-6;
        assert_eq!(routes.scores, [a / total, b / total]);
        r.selection_bias = None;
        let plain = r.route(&[3.0, -1.0], 1);
        assert_eq!(plain.experts, [0, 2]);
    }

    #[test]
    fn softmax_then_top_k_with_and_without_renormalizing() {
        let h = [1.0, 2.0];
        let probs = softmax(&[1.0, 2.0, 3.0]);
        let plain = router(Routing::SoftmaxTopK { renormalize: false }, 2, false).route(&h, 1);
        assert_eq!(plain.experts, [2, 1]);
        assert_eq!(plain.scores, [probs[2], probs[1]]);
        let renorm = router(Routing::SoftmaxTopK { renormalize: true }, 2, false).route(&h, 1);
        let total = probs[2] + probs[1];
        assert_eq!(renorm.scores, [probs[2] / total, probs[1] / total]);
        assert_eq!(plain.shared, None);
    }

    #[test]
    fn top_k_then_softmax_over_the_picked_logits() {
        let routes = router(Routing::TopKSoftmax, 2, true).route(&[3.0, -1.0], 1);
        assert_eq!(routes.experts, [0, 2]);
        assert_eq!(routes.scores, softmax(&[3.0, 2.0]));
        assert_eq!(routes.shared, Some(vec![sigmoid(2.0)]));
    }

    #[test]
    fn per_expert_scales_weight_the_picked_experts_but_do_not_pick_them() {
        // Logits 3, -1, 2: experts 0 and 2, whatever their scales say.
        let mut r = router(Routing::TopKSoftmax, 2, false);
        r.expert_scales = Some(vec![0.5, 100.0, 3.0]);
        let routes = r.route(&[3.0, -1.0], 1);
        assert_eq!(routes.experts, [0, 2]);
        let p = softmax(&[3.0, 2.0]);
        assert_eq!(routes.scores, [p[0] * 0.5, p[1] * 3.0]);
    }

    #[test]
    fn the_router_bias_is_added_to_each_logit_before_routing() {
        // Logits x0, x1, x0 + x1 = 3, -1, 2; biases move expert 1 to the top.
        let mut r = router(Routing::TopKSoftmax, 2, false);
        r.bias = Some(vec![0.0, 5.0, -0.5]);
        let routes = r.route(&[3.0, -1.0], 1);
        assert_eq!(routes.experts, [1, 0]);
        assert_eq!(routes.scores, softmax(&[4.0, 3.0]));
    }

    #[test]
    fn ties_go_to_the_lower_expert_and_groups_list_each_expert_once() {
        let r = router(Routing::SoftmaxTopK { renormalize: true }, 1, false);
        // Token 0: x0 = x1 (expert 2 wins with x0 + x1); token 1: x0 = x0 + x1 > x1.
        let routes = r.route(&[1.0, 1.0, 2.0, 0.0], 1);
        assert_eq!(routes.experts, [2, 0]);
        let groups = routes.groups(3, 1);
        assert_eq!(
            groups,
            [
                ExpertGroup {
                    expert: 0,
                    tokens: vec![1],
                    scores: vec![1.0],
                    routes: vec![1],
                },
                ExpertGroup {
                    expert: 2,
                    tokens: vec![0],
                    scores: vec![1.0],
                    routes: vec![0],
                },
            ]
        );
    }

    #[test]
    fn threads_do_not_change_the_routes() {
        let hidden = 64;
        let mut state = 7u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        let weights: Vec<f32> = (0..9 * hidden).map(|_| next()).collect();
        let h: Vec<f32> = (0..300 * hidden).map(|_| next()).collect();
        let r = Router {
            weights,
            hidden,
            num_experts: 8,
            top_k: 3,
            routing: Routing::SoftmaxTopK { renormalize: false },
            shared_gate: true,
            bias: None,
            selection_bias: None,
            expert_scales: None,
        };
        let one = r.route_split(&h, 1, 1);
        let four = r.route_split(&h, 4, 1);
        assert_eq!(one, four);
        assert_eq!(one.experts.len(), 300 * 3);
    }

    #[test]
    fn blocked_logits_are_each_tokens_own_dot_products_bit_for_bit() {
        // A width with a remainder past the eight-wide chunks, more rows than one run, and a
        // token count that leaves a partial group.
        let hidden = 8 * 9 + 5;
        let rows = ROW_RUN + 7;
        let tokens = 3 * TOKEN_GROUP + 2;
        let mut state = 11u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        let weights: Vec<f32> = (0..rows * hidden).map(|_| next()).collect();
        let h: Vec<f32> = (0..tokens * hidden).map(|_| next()).collect();
        let bias: Vec<f32> = (0..rows).map(|_| next()).collect();
        let r = Router {
            weights,
            hidden,
            num_experts: rows,
            top_k: 2,
            routing: Routing::SoftmaxTopK { renormalize: false },
            shared_gate: false,
            bias: Some(bias),
            selection_bias: None,
            expert_scales: None,
        };
        let mut out = vec![0.0f32; tokens * rows];
        r.logits(&h, &mut out);
        let bias = r.bias.as_ref().expect("a bias");
        for t in 0..tokens {
            for row in 0..rows {
                let x = &h[t * hidden..(t + 1) * hidden];
                let w = &r.weights[row * hidden..(row + 1) * hidden];
                let want = dot(x, w) + bias[row];
                assert_eq!(
                    out[t * rows + row].to_bits(),
                    want.to_bits(),
                    "token {t} row {row}"
                );
            }
        }
        // Alone, a token gets the same bits as in the group.
        for t in 0..tokens {
            let mut alone = vec![0.0f32; rows];
            r.logits(&h[t * hidden..(t + 1) * hidden], &mut alone);
            let batched = &out[t * rows..(t + 1) * rows];
            assert!(
                alone
                    .iter()
                    .zip(batched)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
        }
    }
}
