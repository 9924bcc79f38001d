//! The continuous batcher over a deterministic mock backend.
//!
//! The mock keeps each slot's tokens as its "KV cache", checks every position it is handed, and
//! derives logits from the slot's contents only, so a sequence's output cannot depend on its
//! batch-mates unless the scheduler mixes them up.

use std::collections::HashMap;
use std::sync::Arc;

use mlxcel_capacity::route;
use mlxcel_engine::*;

const VOCAB: usize = 32;
const EOS: u32 = 31;

/// Token `t` decodes to one character; 0..=25 are letters, 26..=30 are multi-byte pieces.
struct Letters;

struct LetterStream;

impl TextDecoder for Letters {
    fn stream(&self, _prompt: &[u32]) -> Box<dyn DecodeStream> {
        Box::new(LetterStream)
    }
}

impl DecodeStream for LetterStream {
    fn push(&mut self, token: u32) -> String {
        match token {
            0..=25 => char::from(b'a' + token as u8).to_string(),
            26..=30 => "é".to_owned(),
            _ => "<eos>".to_owned(),
        }
    }
}

#[derive(Default)]
struct Mock {
    window: usize,
    buckets: Option<Vec<Bucket>>,
    slots: HashMap<SlotId, (SessionPlan, Vec<u32>)>,
    next_slot: SlotId,
    /// Per step: (slot, tokens) of each batch entry.
    steps: Vec<Vec<(SlotId, usize)>>,
    /// Greedy continuation: next = (last + 1) % 26, or EOS after `eos_after` tokens in a slot.
    eos_after: Option<usize>,
    fail_next_step: bool,
    /// Refuse this many slot allocations with an error other than a full backend (as a module
    /// that does not compile).
    fail_allocations: usize,
    max_slots: Option<usize>,
    /// Serves the prefix cache: copies prefixes between slots, 100 bytes of KV per position.
    prefix: bool,
    /// The greedy continuation is a hash of every token in the slot (not of the last alone), so
    /// that a wrong cached position changes the output.
    hash_contents: bool,
    /// Scores every position and rolls positions back (speculative decoding).
    scores: bool,
    /// Prefixes copied between slots, and kept slots given to new sequences (with `prefix`).
    copies: usize,
    adoptions: usize,
    /// The LoRA scales each slot was last given (`Backend::set_slot_adapters`).
    adapters: HashMap<SlotId, Vec<f32>>,
}

impl Mock {
    fn new(window: usize) -> Self {
        Self {
            window,
            ..Self::default()
        }
    }
}

impl Backend for Mock {
    fn name(&self) -> &'static str {
        "mock"
    }
    fn window(&self) -> usize {
        self.window
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn shape_policy(&self) -> ShapePolicy {
        match &self.buckets {
            Some(buckets) => ShapePolicy::Static {
                buckets: buckets.clone(),
            },
            None => ShapePolicy::Dynamic,
        }
    }
    fn create_session_for_request(&self, shape: &RequestShape) -> Result<SessionPlan, EngineError> {
        let Some(buckets) = &self.buckets else {
            let admitted = mlxcel_capacity::admit(
                shape.effective_prompt_len(),
                shape.max_new_tokens,
                self.window,
            )?;
            return Ok(SessionPlan {
                context_capacity: None,
                max_positions: self.window,
                admitted_max_new_tokens: admitted,
            });
        };
        let capacities: Vec<usize> = buckets.iter().map(|b| b.context_capacity).collect();
        let r = route(
            &capacities,
            self.window,
            shape.effective_prompt_len(),
            shape.max_new_tokens,
        )?;
        Ok(SessionPlan {
            context_capacity: Some(r.bucket),
            max_positions: r.bucket,
            admitted_max_new_tokens: r.admitted_max_new_tokens,
        })
    }
    fn allocate_slot(&mut self, plan: &SessionPlan) -> Result<SlotId, EngineError> {
        if self.max_slots.is_some_and(|m| self.slots.len() >= m) {
            return Err(EngineError::NoFreeSlot);
        }
        if self.fail_allocations > 0 {
            self.fail_allocations -= 1;
            return Err(EngineError::backend("mock", "the module failed to compile"));
        }
        let slot = self.next_slot;
        self.next_slot += 1;
        self.slots.insert(slot, (*plan, Vec::new()));
        Ok(slot)
    }
    fn step(&mut self, batch: &[SequenceStep<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.steps
            .push(batch.iter().map(|s| (s.slot, s.tokens.len())).collect());
        if std::mem::take(&mut self.fail_next_step) {
            return Err(EngineError::backend("mock", "device lost"));
        }
        let mut out = Vec::new();
        for entry in batch {
            let (plan, cache) = self.slots.get_mut(&entry.slot).expect("a live slot");
            assert_eq!(
                entry.start_position,
                cache.len(),
                "positions are contiguous"
            );
            cache.extend_from_slice(entry.tokens);
            assert!(cache.len() <= plan.max_positions, "slot overflow");
            out.push(self.logits(&self.slots[&entry.slot].1));
        }
        Ok(out)
    }
    fn can_score(&self) -> bool {
        self.scores
    }
    fn truncate(&mut self, slot: SlotId, len: usize) -> Result<(), EngineError> {
        let cache = &mut self.slots.get_mut(&slot).expect("a live slot").1;
        assert!(len <= cache.len(), "truncating forward");
        cache.truncate(len);
        Ok(())
    }
    fn step_scored(
        &mut self,
        batch: &[SequenceStep<'_>],
        firsts: &[usize],
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        assert!(
            self.scores,
            "scored steps only where the backend says it scores"
        );
        self.steps
            .push(batch.iter().map(|s| (s.slot, s.tokens.len())).collect());
        let mut out = Vec::new();
        for (entry, &first) in batch.iter().zip(firsts) {
            let start = self.slots[&entry.slot].1.len();
            assert_eq!(entry.start_position, start, "positions are contiguous");
            let mut rows = Vec::new();
            for (i, &token) in entry.tokens.iter().enumerate() {
                self.slots
                    .get_mut(&entry.slot)
                    .expect("a live slot")
                    .1
                    .push(token);
                if i >= first {
                    rows.push(self.logits(&self.slots[&entry.slot].1));
                }
            }
            out.push(rows);
        }
        Ok(out)
    }
    fn set_slot_adapters(&mut self, slot: SlotId, scales: Vec<f32>) {
        self.adapters.insert(slot, scales);
    }
    fn release_slot(&mut self, slot: SlotId) {
        self.slots.remove(&slot);
    }
    fn can_copy_prefix(&self) -> bool {
        self.prefix
    }
    fn kv_bytes(&self, positions: usize) -> usize {
        positions * 100
    }
    fn copy_prefix(&mut self, from: SlotId, to: SlotId, len: usize) -> Result<(), EngineError> {
        let prefix = self.slots[&from].1[..len].to_vec();
        self.slots.get_mut(&to).expect("a live slot").1 = prefix;
        self.copies += 1;
        Ok(())
    }
    fn adopt_slot(
        &mut self,
        slot: SlotId,
        plan: &SessionPlan,
        len: usize,
    ) -> Result<(), EngineError> {
        assert!(
            self.prefix,
            "take-overs only where the backend keeps a prefix cache"
        );
        let (kept_plan, cache) = self.slots.get_mut(&slot).expect("a live slot");
        assert!(
            len <= cache.len(),
            "a take-over keeps positions the slot holds"
        );
        cache.truncate(len);
        *kept_plan = *plan;
        self.adoptions += 1;
        Ok(())
    }
    /// The mock's "keys and values": each position's token, as a float.
    fn export_kv(&mut self, slot: SlotId, len: usize) -> Result<Vec<f32>, EngineError> {
        Ok(self.slots[&slot].1[..len]
            .iter()
            .map(|&t| t as f32)
            .collect())
    }
    fn import_kv(&mut self, slot: SlotId, len: usize, data: &[f32]) -> Result<(), EngineError> {
        assert_eq!(data.len(), len);
        self.slots.get_mut(&slot).expect("a live slot").1 =
            data.iter().map(|&f| f as u32).collect();
        Ok(())
    }
}

impl Mock {
    /// The logits after a slot holding `cache`.
    fn logits(&self, cache: &[u32]) -> Vec<f32> {
        let last = *cache.last().expect("non-empty");
        let next = match self.eos_after {
            Some(n) if cache.len() >= n => EOS,
            _ if self.hash_contents => {
                let h = cache.iter().fold(17u64, |h, &t| {
                    h.wrapping_mul(1_000_003).wrapping_add(u64::from(t))
                });
                ((h >> 7) % 26) as u32
            }
            _ => (last + 1) % 26,
        };
        // A peaked but non-degenerate distribution that depends on the slot's contents only.
        let mut logits: Vec<f32> = (0..VOCAB as u32)
            .map(|t| ((t * 7 + cache.len() as u32 * 3) % 11) as f32 * 0.3)
            .collect();
        logits[next as usize] += 4.0;
        logits
    }
}

fn scheduler(mock: Mock, config: SchedulerConfig) -> Scheduler<Mock> {
    Scheduler::new(mock, Arc::new(Letters), config).unwrap()
}

fn greedy(prompt: Vec<u32>, max_new: MaxNewTokens) -> GenerationRequest {
    GenerationRequest {
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::new(prompt, max_new)
    }
}

/// Per request: concatenated text, tokens, and the finish event's reason and usage.
#[derive(Debug, Default, Clone, PartialEq)]
struct Outcome {
    text: String,
    tokens: Vec<u32>,
    finish: Option<(FinishReason, Usage)>,
    error: Option<String>,
    finished_at_step: usize,
}

fn run_to_end(s: &mut Scheduler<Mock>) -> HashMap<RequestId, Outcome> {
    let mut outcomes: HashMap<RequestId, Outcome> = HashMap::new();
    let mut step = 0;
    while s.has_work() {
        step += 1;
        assert!(step < 10_000, "the scheduler stopped making progress");
        collect(&mut outcomes, s.step(), step);
    }
    outcomes
}

fn collect(
    outcomes: &mut HashMap<RequestId, Outcome>,
    events: Vec<(RequestId, Event)>,
    step: usize,
) {
    for (id, event) in events {
        let outcome = outcomes.entry(id).or_default();
        assert!(outcome.finish.is_none(), "no event after Finished");
        match event {
            Event::Token { token, text, .. } => {
                outcome.tokens.push(token);
                outcome.text.push_str(&text);
            }
            Event::Finished {
                reason,
                text,
                usage,
                error,
            } => {
                outcome.text.push_str(&text);
                outcome.finish = Some((reason, usage));
                outcome.error = error;
                outcome.finished_at_step = step;
            }
        }
    }
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Usage {
    Usage {
        prompt_tokens,
        completion_tokens,
        cached_tokens: 0,
        drafted_tokens: 0,
        accepted_tokens: 0,
    }
}

#[test]
fn one_request_runs_to_its_budget() {
    let mut s = scheduler(Mock::new(100), SchedulerConfig::default());
    let id = s
        .submit(greedy(vec![0, 1, 2], MaxNewTokens::Limited(5)))
        .unwrap();
    let outcome = &run_to_end(&mut s)[&id];
    assert_eq!(outcome.tokens, vec![3, 4, 5, 6, 7]);
    assert_eq!(outcome.text, "defgh");
    assert_eq!(outcome.finish, Some((FinishReason::Length, usage(3, 5))));
    assert!(s.backend().slots.is_empty(), "the slot is released");
}

#[test]
fn unlimited_budget_runs_to_the_end_of_the_window() {
    let mut s = scheduler(Mock::new(10), SchedulerConfig::default());
    let id = s
        .submit(greedy(vec![0, 1, 2], MaxNewTokens::Unlimited))
        .unwrap();
    assert_eq!(s.plan(id).unwrap().admitted_max_new_tokens, 7);
    let outcome = &run_to_end(&mut s)[&id];
    assert_eq!(outcome.finish, Some((FinishReason::Length, usage(3, 7))));
}

#[test]
fn eos_stops_without_text() {
    let mut mock = Mock::new(100);
    mock.eos_after = Some(5);
    let mut s = scheduler(mock, SchedulerConfig::default());
    let mut request = greedy(vec![0, 1, 2], MaxNewTokens::Limited(50));
    request.stop_token_ids = vec![EOS];
    let id = s.submit(request).unwrap();
    let outcome = &run_to_end(&mut s)[&id];
    assert_eq!(outcome.tokens, vec![3, 4, EOS]);
    assert_eq!(outcome.text, "de");
    assert_eq!(outcome.finish, Some((FinishReason::Stop, usage(3, 3))));
}

#[test]
fn stop_string_spanning_tokens_is_withheld() {
    let mut s = scheduler(Mock::new(100), SchedulerConfig::default());
    let mut request = greedy(vec![0], MaxNewTokens::Limited(20));
    request.stop = vec!["def".to_owned()];
    let id = s.submit(request).unwrap();
    let outcome = &run_to_end(&mut s)[&id];
    assert_eq!(outcome.text, "bc");
    assert_eq!(outcome.tokens, vec![1, 2, 3, 4, 5]);
    assert_eq!(outcome.finish, Some((FinishReason::Stop, usage(1, 5))));
}

#[test]
fn held_back_text_is_released_at_the_end() {
    let mut s = scheduler(Mock::new(100), SchedulerConfig::default());
    let mut request = greedy(vec![0], MaxNewTokens::Limited(2));
    request.stop = vec!["cX".to_owned()];
    let id = s.submit(request).unwrap();
    assert_eq!(run_to_end(&mut s)[&id].text, "bc");
}

#[test]
fn first_come_first_served_with_one_slot() {
    let config = SchedulerConfig {
        max_batch: 1,
        ..SchedulerConfig::default()
    };
    let mut s = scheduler(Mock::new(100), config);
    let ids: Vec<_> = (0..3)
        .map(|i| s.submit(greedy(vec![i], MaxNewTokens::Limited(3))).unwrap())
        .collect();
    let outcomes = run_to_end(&mut s);
    let order: Vec<usize> = ids.iter().map(|id| outcomes[id].finished_at_step).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    assert!(s.backend().steps.iter().all(|batch| batch.len() == 1));
}

#[test]
fn token_budget_and_prefill_chunk_are_respected() {
    let config = SchedulerConfig {
        max_batch: 4,
        prefill_chunk: 8,
        token_budget: 10,
        max_waiting: 16,
    };
    let mut s = scheduler(Mock::new(1000), config);
    let ids: Vec<_> = (0..4)
        .map(|i| {
            s.submit(greedy(vec![i; 30], MaxNewTokens::Limited(6)))
                .unwrap()
        })
        .collect();
    let outcomes = run_to_end(&mut s);
    for id in &ids {
        assert_eq!(
            outcomes[id].finish,
            Some((FinishReason::Length, usage(30, 6)))
        );
    }
    for batch in &s.backend().steps {
        let total: usize = batch.iter().map(|&(_, n)| n).sum();
        assert!(total <= 10, "step of {total} tokens: {batch:?}");
        assert!(batch.iter().all(|&(_, n)| n <= 8), "{batch:?}");
    }
    // Decoding sequences keep decoding while others prefill: some step mixes both.
    assert!(
        s.backend()
            .steps
            .iter()
            .any(|b| b.iter().any(|e| e.1 == 1) && b.iter().any(|e| e.1 > 1))
    );
}

#[test]
fn cancel_mid_prefill_frees_the_slot() {
    let config = SchedulerConfig {
        prefill_chunk: 4,
        token_budget: 8,
        ..SchedulerConfig::default()
    };
    let mut s = scheduler(Mock::new(1000), config);
    let id = s
        .submit(greedy(vec![1; 40], MaxNewTokens::Limited(5)))
        .unwrap();
    let mut outcomes = HashMap::new();
    collect(&mut outcomes, s.step(), 1);
    assert_eq!(s.backend().slots.len(), 1);
    assert!(s.cancel(id));
    collect(&mut outcomes, s.step(), 2);
    assert_eq!(
        outcomes[&id].finish,
        Some((FinishReason::Cancelled, usage(40, 0)))
    );
    assert!(s.backend().slots.is_empty());
    assert!(!s.has_work());
    assert!(!s.cancel(id), "a finished request is unknown");
}

#[test]
fn cancel_mid_decode_frees_the_slot_within_one_step() {
    let mut s = scheduler(Mock::new(1000), SchedulerConfig::default());
    let id = s
        .submit(greedy(vec![1, 2], MaxNewTokens::Limited(100)))
        .unwrap();
    let mut outcomes = HashMap::new();
    for step in 1..=3 {
        collect(&mut outcomes, s.step(), step);
    }
    assert_eq!(outcomes[&id].tokens.len(), 3);
    s.cancel(id);
    collect(&mut outcomes, s.step(), 4);
    assert_eq!(
        outcomes[&id].finish,
        Some((FinishReason::Cancelled, usage(2, 3)))
    );
    assert!(s.backend().slots.is_empty());
}

#[test]
fn cancel_while_waiting() {
    let config = SchedulerConfig {
        max_batch: 1,
        ..SchedulerConfig::default()
    };
    let mut s = scheduler(Mock::new(100), config);
    let first = s.submit(greedy(vec![1], MaxNewTokens::Limited(3))).unwrap();
    let second = s.submit(greedy(vec![2], MaxNewTokens::Limited(3))).unwrap();
    s.cancel(second);
    let outcomes = run_to_end(&mut s);
    assert_eq!(
        outcomes[&second].finish,
        Some((FinishReason::Cancelled, usage(1, 0)))
    );
    assert!(outcomes[&second].tokens.is_empty());
    assert_eq!(outcomes[&first].finish.unwrap().0, FinishReason::Length);
}

#[test]
fn a_full_queue_is_refused() {
    let config = SchedulerConfig {
        max_waiting: 2,
        ..SchedulerConfig::default()
    };
    let mut s = scheduler(Mock::new(100), config);
    s.submit(greedy(vec![1], MaxNewTokens::Limited(1))).unwrap();
    s.submit(greedy(vec![1], MaxNewTokens::Limited(1))).unwrap();
    let err = s
        .submit(greedy(vec![1], MaxNewTokens::Limited(1)))
        .unwrap_err();
    assert!(
        matches!(err, EngineError::QueueFull { capacity: 2 }),
        "{err}"
    );
    // Once the queue drains, requests are accepted again.
    run_to_end(&mut s);
    s.submit(greedy(vec![1], MaxNewTokens::Limited(1))).unwrap();
}

#[test]
fn refusals_happen_at_submission() {
    let mut s = scheduler(Mock::new(10), SchedulerConfig::default());
    let err = s
        .submit(greedy(vec![1; 8], MaxNewTokens::Limited(5)))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "effective_prompt_len=8 + max_new_tokens=5 > context_capacity=10"
    );
    assert!(matches!(
        s.submit(greedy(vec![], MaxNewTokens::Limited(1))),
        Err(EngineError::EmptyPrompt)
    ));
    let mut bad = greedy(vec![1], MaxNewTokens::Limited(1));
    bad.sampling.top_p = 0.0;
    assert!(s.submit(bad).unwrap_err().to_string().contains("top_p"));
    assert!(!s.has_work());
}

#[test]
fn zero_budget_finishes_without_running() {
    let mut s = scheduler(Mock::new(10), SchedulerConfig::default());
    let id = s
        .submit(greedy(vec![1, 2], MaxNewTokens::Limited(0)))
        .unwrap();
    let outcomes = run_to_end(&mut s);
    assert_eq!(
        outcomes[&id].finish,
        Some((FinishReason::Length, usage(2, 0)))
    );
    assert!(s.backend().steps.is_empty());
}

#[test]
fn buckets_route_clamp_and_limit_their_batch() {
    let mut mock = Mock::new(131_072);
    mock.buckets = Some(vec![
        Bucket {
            context_capacity: 256,
            max_batch: 2,
        },
        Bucket {
            context_capacity: 4096,
            max_batch: 1,
        },
    ]);
    let mut s = scheduler(mock, SchedulerConfig::default());
    let short = s
        .submit(greedy(vec![1; 6], MaxNewTokens::Limited(64)))
        .unwrap();
    let long = s
        .submit(greedy(vec![1; 415], MaxNewTokens::Limited(8)))
        .unwrap();
    let unlimited = s
        .submit(greedy(vec![1; 6], MaxNewTokens::Unlimited))
        .unwrap();
    assert_eq!(s.plan(short).unwrap().context_capacity, Some(256));
    assert_eq!(s.plan(long).unwrap().context_capacity, Some(4096));
    let clamp = s.plan(unlimited).unwrap();
    assert_eq!(
        (clamp.context_capacity, clamp.admitted_max_new_tokens),
        (Some(4096), 4090)
    );
    let err = s
        .submit(greedy(vec![1; 5000], MaxNewTokens::Limited(1)))
        .unwrap_err();
    assert!(
        err.to_string().contains("> largest context capacity=4096"),
        "{err}"
    );

    // Before any step nothing runs; after one, each bucket reports its sequences and positions.
    assert!(s.bucket_occupancy().iter().all(|b| b.running == 0));
    let mut outcomes = HashMap::new();
    collect(&mut outcomes, s.step(), 1);
    let occupancy = s.bucket_occupancy();
    assert_eq!(occupancy.len(), 2);
    assert_eq!(
        (occupancy[0].context_capacity, occupancy[0].running),
        (256, 1)
    );
    assert_eq!(
        (occupancy[1].context_capacity, occupancy[1].running),
        (4096, 1)
    );
    assert_eq!(occupancy[0].positions_used, 6);
    assert_eq!(occupancy[1].positions_used, 415);

    // The 4096 bucket holds one sequence at a time: `unlimited` waits for `long`.
    let mut step = 1;
    while s.has_work() {
        step += 1;
        collect(&mut outcomes, s.step(), step);
    }
    assert!(outcomes[&unlimited].finished_at_step > outcomes[&long].finished_at_step);
    assert_eq!(
        outcomes[&unlimited].finish,
        Some((FinishReason::Length, usage(6, 4090)))
    );
}

#[test]
fn a_seeded_request_ignores_its_batch_mates() {
    let sampled = |seed| GenerationRequest {
        sampling: SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(seed),
            ..SamplingParams::default()
        },
        ..GenerationRequest::new(vec![3, 4], MaxNewTokens::Limited(24))
    };
    let mut alone = scheduler(Mock::new(1000), SchedulerConfig::default());
    let id = alone.submit(sampled(99)).unwrap();
    let expected = run_to_end(&mut alone)[&id].tokens.clone();

    let config = SchedulerConfig {
        prefill_chunk: 3,
        token_budget: 9,
        ..SchedulerConfig::default()
    };
    let mut crowd = scheduler(Mock::new(1000), config);
    crowd.submit(sampled(1)).unwrap();
    crowd
        .submit(greedy(vec![5; 20], MaxNewTokens::Limited(7)))
        .unwrap();
    let id = crowd.submit(sampled(99)).unwrap();
    crowd.submit(sampled(2)).unwrap();
    let outcomes = run_to_end(&mut crowd);
    assert_eq!(outcomes[&id].tokens, expected);
    // The stream is genuinely random: another seed differs.
    let other = outcomes
        .values()
        .find(|o| o.tokens.len() == 24 && o.tokens != expected);
    assert!(other.is_some());
}

#[test]
fn a_backend_failure_ends_the_batch_and_serving_continues() {
    let mut s = scheduler(Mock::new(100), SchedulerConfig::default());
    let a = s.submit(greedy(vec![1], MaxNewTokens::Limited(5))).unwrap();
    let b = s.submit(greedy(vec![2], MaxNewTokens::Limited(5))).unwrap();
    let mut outcomes = HashMap::new();
    collect(&mut outcomes, s.step(), 1);
    s.backend_mut().fail_next_step = true;
    collect(&mut outcomes, s.step(), 2);
    for id in [a, b] {
        assert_eq!(outcomes[&id].finish.unwrap().0, FinishReason::Error);
        assert!(
            outcomes[&id]
                .error
                .as_deref()
                .unwrap()
                .contains("device lost")
        );
    }
    assert!(s.backend().slots.is_empty());
    let c = s.submit(greedy(vec![3], MaxNewTokens::Limited(2))).unwrap();
    assert_eq!(
        run_to_end(&mut s)[&c].finish.unwrap().0,
        FinishReason::Length
    );
}

#[test]
fn a_failed_allocation_ends_that_request_and_serving_continues() {
    let mut mock = Mock::new(100);
    mock.fail_allocations = 1;
    let mut s = scheduler(mock, SchedulerConfig::default());
    let a = s.submit(greedy(vec![1], MaxNewTokens::Limited(3))).unwrap();
    let b = s.submit(greedy(vec![2], MaxNewTokens::Limited(3))).unwrap();
    let outcomes = run_to_end(&mut s);
    assert_eq!(outcomes[&a].finish.unwrap().0, FinishReason::Error);
    assert!(
        outcomes[&a]
            .error
            .as_deref()
            .unwrap()
            .contains("the module failed to compile")
    );
    // Not retried: one failure for one allocation, and the next request runs.
    assert_eq!(s.backend().fail_allocations, 0);
    assert_eq!(outcomes[&b].finish.unwrap().0, FinishReason::Length);
}

#[test]
fn no_free_slot_keeps_requests_waiting() {
    let mut mock = Mock::new(100);
    mock.max_slots = Some(1);
    let mut s = scheduler(mock, SchedulerConfig::default());
    let a = s.submit(greedy(vec![1], MaxNewTokens::Limited(3))).unwrap();
    let b = s.submit(greedy(vec![2], MaxNewTokens::Limited(3))).unwrap();
    let outcomes = run_to_end(&mut s);
    assert!(outcomes[&b].finished_at_step > outcomes[&a].finished_at_step);
    assert_eq!(outcomes[&b].finish.unwrap().0, FinishReason::Length);
}

#[test]
fn logprobs_are_log_softmax_of_the_raw_logits() {
    let mut s = scheduler(Mock::new(100), SchedulerConfig::default());
    let mut request = greedy(vec![0], MaxNewTokens::Limited(1));
    request.logprobs = Some(3);
    s.submit(request).unwrap();
    let events = s.step();
    let Event::Token {
        token,
        logprob,
        top_logprobs,
        ..
    } = &events[0].1
    else {
        panic!("{events:?}");
    };
    let logprob = logprob.unwrap();
    assert_eq!(logprob.token, *token);
    assert_eq!(top_logprobs.len(), 3);
    assert_eq!(
        top_logprobs[0], logprob,
        "greedy picks the most likely token"
    );
    assert!(
        top_logprobs
            .windows(2)
            .all(|w| w[0].logprob >= w[1].logprob)
    );
    assert!(logprob.logprob < 0.0 && logprob.logprob > -1.0);
}

/// The prefix cache's budget bounds the memory its kept slots hold: a slot is counted for its
/// whole allocation (its plan's positions), not for the positions its request computed, so a
/// request that stopped early in a large slot is not kept under a budget its allocation exceeds.
#[test]
fn kept_slots_count_their_whole_allocation_against_the_prefix_budget() {
    let run = |budget: usize| {
        let mock = Mock {
            prefix: true,
            eos_after: Some(20),
            ..Mock::new(64)
        };
        let mut s = scheduler(mock, SchedulerConfig::default()).with_prefix_cache(budget);
        // 16 prompt tokens, stops at its end token after 4 more: 20 positions computed in a slot
        // of 64 (the window: an unlimited budget).
        let prompt: Vec<u32> = (0..16).collect();
        let mut request = greedy(prompt.clone(), MaxNewTokens::Unlimited);
        request.stop_token_ids = vec![EOS];
        let first = s.submit(request).unwrap();
        let outcome = run_to_end(&mut s)[&first].clone();
        assert_eq!(outcome.finish.unwrap().0, FinishReason::Stop);
        let kept = s.backend().slots.len();
        let second = s.submit(greedy(prompt, MaxNewTokens::Limited(2))).unwrap();
        let cached = run_to_end(&mut s)[&second].finish.unwrap().1.cached_tokens;
        (kept, cached)
    };
    // 64 positions x 100 bytes = 6400: a budget of 2500 (enough for the 20 computed positions,
    // which is what was counted before) keeps nothing, ...
    assert_eq!(run(2_500), (0, 0));
    // ... one of 6400 keeps the slot, and the same prompt reuses all of it but its last token.
    assert_eq!(run(6_400), (1, 15));
}

/// A finished request's kept slot exports as its tokens with their keys and values; restored
/// into another scheduler (a restarted server on the same model) it serves a request that starts
/// with those tokens, which then runs exactly as it does without any cache; erasing drops it.
#[test]
fn an_exported_prefix_restores_into_another_scheduler_and_is_reused() {
    let cached = || {
        let mock = Mock {
            prefix: true,
            ..Mock::new(64)
        };
        scheduler(mock, SchedulerConfig::default()).with_prefix_cache(1 << 20)
    };
    let mut s = cached();
    let prompt: Vec<u32> = (3..19).collect();
    let first = s
        .submit(greedy(prompt.clone(), MaxNewTokens::Limited(4)))
        .unwrap();
    let original = run_to_end(&mut s)[&first].clone();
    let CachedPrefix { tokens, kv, state } =
        s.export_cached(first).unwrap().expect("the slot was kept");
    // A model without recurrent state saves none.
    assert!(state.is_empty());
    // The prompt and the generated tokens but the last (never fed back).
    assert_eq!(tokens[..16], prompt[..]);
    assert_eq!(tokens[16..], original.tokens[..3]);
    assert_eq!(kv, tokens.iter().map(|&t| t as f32).collect::<Vec<_>>());
    assert_eq!(s.export_cached(first + 100).unwrap(), None);

    let mut t = cached();
    let id = t.restore_cached(tokens.clone(), &kv).unwrap();
    assert_eq!(
        t.export_cached(id).unwrap(),
        Some(CachedPrefix {
            tokens: tokens.clone(),
            kv: kv.clone(),
            state: Vec::new(),
        })
    );
    let mut follow_up = tokens.clone();
    follow_up.extend([7, 8, 9]);
    let second = t
        .submit(greedy(follow_up.clone(), MaxNewTokens::Limited(5)))
        .unwrap();
    let steps_before = t.backend().steps.len();
    let reused = run_to_end(&mut t)[&second].clone();
    assert_eq!(
        reused.finish.as_ref().unwrap().1.cached_tokens,
        tokens.len()
    );
    // Only the 3 new prompt tokens were prefilled.
    assert_eq!(t.backend().steps[steps_before][0].1, 3);
    let mut plain = scheduler(Mock::new(64), SchedulerConfig::default());
    let third = plain
        .submit(greedy(follow_up, MaxNewTokens::Limited(5)))
        .unwrap();
    let fresh = run_to_end(&mut plain)[&third].clone();
    assert_eq!(reused.tokens, fresh.tokens);
    assert_eq!(reused.text, fresh.text);

    assert_eq!(t.erase_cached(id), tokens.len());
    assert_eq!(t.erase_cached(id), 0);
    assert_eq!(t.export_cached(id).unwrap(), None);
}

/// Restoring needs a prefix cache with room for the entry; the refusal names the fix.
#[test]
fn restoring_is_refused_without_the_prefix_cache_or_beyond_its_budget() {
    let tokens: Vec<u32> = (0..20).collect();
    let kv: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
    let mock = || Mock {
        prefix: true,
        ..Mock::new(64)
    };
    let mut off = scheduler(mock(), SchedulerConfig::default());
    let err = off.restore_cached(tokens.clone(), &kv).unwrap_err();
    assert!(err.to_string().contains("--cache-ram"), "{err}");
    // A backend that cannot copy prefixes (the OpenXLA backend's static slots) says so.
    let mut fixed = scheduler(Mock::new(64), SchedulerConfig::default()).with_prefix_cache(1 << 20);
    let err = fixed.restore_cached(tokens.clone(), &kv).unwrap_err();
    assert!(
        err.to_string()
            .contains("the mock backend keeps no prefix cache"),
        "{err}"
    );
    // 20 positions x 100 bytes = 2000 > 1500.
    let mut small = scheduler(mock(), SchedulerConfig::default()).with_prefix_cache(1_500);
    let err = small.restore_cached(tokens.clone(), &kv).unwrap_err();
    assert!(err.to_string().contains("20 tokens need"), "{err}");
    // Room for one: a second restore evicts the first (least recently used).
    let mut one = scheduler(mock(), SchedulerConfig::default()).with_prefix_cache(2_000);
    let a = one.restore_cached(tokens.clone(), &kv).unwrap();
    let b = one.restore_cached(tokens.clone(), &kv).unwrap();
    assert_ne!(a, b);
    assert_eq!(one.export_cached(a).unwrap(), None);
    assert!(one.export_cached(b).unwrap().is_some());
    assert_eq!(one.backend().slots.len(), 1);
    let stats = one.stats();
    assert_eq!(
        (
            stats.prefix.evictions,
            stats.prefix.entries,
            stats.prefix.bytes
        ),
        (1, 1, 2_000)
    );
    assert_eq!(stats.prefix.budget, 2_000);
}

/// A chat's next turn (its whole history, then a new message) takes the last turn's kept slot
/// over: no copy, one slot for the whole conversation instead of one entry per turn, the same
/// tokens as without a cache; an earlier turn's entry stays readable under its id while the
/// conversation holds its positions, and erasing that id leaves the conversation's entry be.
#[test]
fn a_chats_next_turn_takes_over_its_last_turns_slot() {
    let mock = |prefix| Mock {
        prefix,
        hash_contents: true,
        ..Mock::new(400)
    };
    let mut cached = scheduler(mock(true), SchedulerConfig::default()).with_prefix_cache(1 << 20);
    let mut plain = scheduler(mock(false), SchedulerConfig::default());
    let mut history: Vec<u32> = (0..16).map(|t| (t * 5 + 3) % 26).collect();
    let mut ids = Vec::new();
    for turn in 0..8u32 {
        let request = greedy(history.clone(), MaxNewTokens::Limited(6));
        let id = cached.submit(request.clone()).unwrap();
        let with = run_to_end(&mut cached)[&id].clone();
        let reference = plain.submit(request).unwrap();
        let without = run_to_end(&mut plain)[&reference].clone();
        assert_eq!(with.tokens, without.tokens, "turn {turn}");
        let cached_tokens = with.finish.as_ref().unwrap().1.cached_tokens;
        if turn > 0 {
            // Everything the last turn computed: its prompt and its output but the last token.
            assert_eq!(cached_tokens, history.len() - 4, "turn {turn}");
        }
        assert_eq!(cached.backend().slots.len(), 1, "turn {turn}: one slot");
        history.extend(&with.tokens);
        history.extend([turn % 26, (turn + 7) % 26, 11]);
        ids.push(id);
    }
    let stats = cached.stats().prefix;
    assert_eq!((stats.hits, stats.takeovers, stats.entries), (7, 7, 1));
    assert_eq!(
        (cached.backend().adoptions, cached.backend().copies),
        (7, 0)
    );
    // The first turn's entry reads from the last turn's slot: the first turn's positions.
    let first = cached.export_cached(ids[0]).unwrap().expect("still held");
    assert_eq!(first.tokens.len(), 16 + 5);
    assert_eq!(first.tokens[..], history[..21]);
    assert_eq!(
        first.kv,
        first.tokens.iter().map(|&t| t as f32).collect::<Vec<_>>()
    );
    assert_eq!(cached.erase_cached(ids[0]), 21);
    assert_eq!(cached.export_cached(ids[0]).unwrap(), None);
    let last = cached.export_cached(ids[7]).unwrap().expect("kept");
    assert_eq!(last.tokens[..], history[..last.tokens.len()]);
    // A prompt that shares only part of the kept history copies it into a new slot instead
    // (taking the slot over would lose the rest), and the conversation stays kept.
    let mut branch = history[..30].to_vec();
    branch.push(25);
    let id = cached
        .submit(greedy(branch, MaxNewTokens::Limited(2)))
        .unwrap();
    assert_eq!(
        run_to_end(&mut cached)[&id].finish.unwrap().1.cached_tokens,
        30
    );
    assert_eq!(cached.backend().copies, 1);
    assert!(cached.export_cached(ids[7]).unwrap().is_some());
    // Dropping the conversation's entry leaves nothing under any of its turns' ids.
    assert_eq!(cached.erase_cached(ids[7]), last.tokens.len());
    for &id in &ids[1..] {
        assert_eq!(cached.export_cached(id).unwrap(), None, "turn id {id}");
    }
}

/// Requests that arrive together with a shared system prompt compute it once: the later ones
/// wait for the first to compute it (the first prefill chunks are the first request's alone),
/// then copy it and prefill only their own tokens; the outputs are those without a cache. A
/// request that opted out of the cache (`reuse_cached_prefix: false`) neither waits nor copies.
#[test]
fn requests_arriving_together_compute_their_shared_prefix_once() {
    let mock = |prefix| Mock {
        prefix,
        hash_contents: true,
        ..Mock::new(400)
    };
    let config = SchedulerConfig {
        prefill_chunk: 16,
        token_budget: 64,
        ..SchedulerConfig::default()
    };
    let system: Vec<u32> = (0..40).map(|t| (t * 7 + 1) % 26).collect();
    let requests: Vec<GenerationRequest> = (0..5u32)
        .map(|i| {
            let mut prompt = system.clone();
            prompt.extend([i, i + 3, 20, i + 1, 7]);
            let mut request = greedy(prompt, MaxNewTokens::Limited(4));
            request.reuse_cached_prefix = i != 4;
            request
        })
        .collect();
    let mut cached = scheduler(mock(true), config).with_prefix_cache(1 << 20);
    let mut plain = scheduler(mock(false), config);
    let with: Vec<RequestId> = requests
        .iter()
        .map(|r| cached.submit(r.clone()).unwrap())
        .collect();
    let without: Vec<RequestId> = requests
        .iter()
        .map(|r| plain.submit(r.clone()).unwrap())
        .collect();
    let got = run_to_end(&mut cached);
    let want = run_to_end(&mut plain);
    for (i, (a, b)) in with.iter().zip(&without).enumerate() {
        assert_eq!(got[a].tokens, want[b].tokens, "request {i}");
    }
    let cached_tokens: Vec<usize> = with
        .iter()
        .map(|id| got[id].finish.as_ref().unwrap().1.cached_tokens)
        .collect();
    // The first computes the system prompt; the next three copy all of it; the fifth opted out.
    assert_eq!(cached_tokens, vec![0, 40, 40, 40, 0]);
    assert_eq!(cached.backend().copies, 3);
    // Prompt positions computed: the system prompt twice (the first request's, the opted-out
    // one's) and each request's own 5 tokens, against 5 x 45 without the cache.
    // (All positions fed, less the 3 generated tokens each request feeds back.)
    let prompt_positions = |steps: &[Vec<(SlotId, usize)>]| -> usize {
        steps.iter().flatten().map(|&(_, n)| n).sum::<usize>() - 5 * 3
    };
    assert_eq!(prompt_positions(&plain.backend().steps), 5 * 45);
    let computed = prompt_positions(&cached.backend().steps);
    assert!(computed <= 2 * 45 + 3 * 5 + 3, "{computed}");
    // While the first computed the shared part, the three that wait for it ran nothing.
    let first_steps = &cached.backend().steps[..2];
    for batch in first_steps {
        assert!(
            batch.len() <= 2,
            "{batch:?}: only the first and the opted-out one"
        );
    }
    let stats = cached.stats();
    assert_eq!(stats.reused_tokens, 120);
    assert_eq!(stats.prefix.hits, 3);
}

/// Property: with random prompts sharing random prefixes of a few bases, random budgets (so
/// entries are evicted at arbitrary moments, or never kept) and requests submitted in random
/// waves (so newcomers share with running sequences as well as kept ones), every request's tokens
/// equal the same request's without a cache, on a backend whose output hashes the whole slot; and
/// the per-request cached counts add up to the scheduler's.
#[test]
fn cached_outputs_equal_uncached_ones_under_random_sharing_and_eviction() {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut draw = move |n: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) % n as u64) as usize
    };
    let mock = |prefix| Mock {
        prefix,
        hash_contents: true,
        ..Mock::new(96)
    };
    let (mut hits, mut takeovers) = (0, 0);
    for case in 0..60 {
        let bases: Vec<Vec<u32>> = (0..3)
            .map(|_| (0..8 + draw(24)).map(|_| draw(26) as u32).collect())
            .collect();
        let budget = [0, 1_500, 4_000, 20_000, 1 << 20][draw(5)];
        let mut cached =
            scheduler(mock(true), SchedulerConfig::default()).with_prefix_cache(budget);
        let mut plain = scheduler(mock(false), SchedulerConfig::default());
        let mut reported = 0;
        // Finished requests' prompts and outputs: a third of the later requests continue one
        // (a chat's next turn: its whole history, then new tokens), which can take its slot over.
        let mut finished: Vec<Vec<u32>> = Vec::new();
        for wave in 0..4 {
            let requests: Vec<GenerationRequest> = (0..1 + draw(4))
                .map(|_| {
                    let mut prompt = if !finished.is_empty() && draw(3) == 0 {
                        finished[draw(finished.len())].clone()
                    } else {
                        let base = &bases[draw(3)];
                        base[..draw(base.len() + 1)].to_vec()
                    };
                    prompt.extend((0..1 + draw(8)).map(|_| draw(26) as u32));
                    greedy(prompt, MaxNewTokens::Limited(1 + draw(6)))
                })
                .collect();
            let with: Vec<RequestId> = requests
                .iter()
                .map(|r| cached.submit(r.clone()).unwrap())
                .collect();
            let without: Vec<RequestId> = requests
                .iter()
                .map(|r| plain.submit(r.clone()).unwrap())
                .collect();
            let got = run_to_end(&mut cached);
            let want = run_to_end(&mut plain);
            for (a, b) in with.iter().zip(&without) {
                assert_eq!(
                    got[a].tokens, want[b].tokens,
                    "case {case} wave {wave} budget {budget}"
                );
                let used = got[a].finish.as_ref().unwrap().1.cached_tokens;
                reported += used as u64;
                hits += usize::from(used > 0);
            }
            for (request, id) in requests.iter().zip(&with) {
                let mut history = request.prompt.clone();
                history.extend(&got[id].tokens);
                finished.push(history);
            }
        }
        assert_eq!(reported, cached.stats().reused_tokens, "case {case}");
        let stats = cached.stats().prefix;
        assert_eq!(
            stats.takeovers as usize,
            cached.backend().adoptions,
            "case {case}"
        );
        takeovers += stats.takeovers;
        // The budget bounds what stays kept (take-overs leave the cache, so they add nothing).
        assert!(stats.bytes <= budget, "case {case}: {stats:?}");
    }
    // The draws do exercise the cache, take-overs included.
    assert!(hits >= 40, "{hits} requests reused a prefix");
    assert!(takeovers >= 10, "{takeovers} take-overs");
}

/// Speculating sequences verify their proposals in the same step as the other sequences' decode
/// (one batch, every proposal's position scored), and every sequence's tokens are those it gets
/// without speculation: proposals accepted where the text repeats (the alphabet continues),
/// rejected and rolled back where it does not (a continuation hashed from the whole slot).
#[test]
fn speculation_verifies_in_the_batch_of_the_others_and_keeps_the_tokens() {
    let alphabet: Vec<u32> = (0..26).chain(0..6).collect();
    let run = |speculate: bool, hash: bool| {
        let mut mock = Mock::new(200);
        mock.scores = true;
        mock.hash_contents = hash;
        let mut s = scheduler(mock, SchedulerConfig::default());
        let mut ids = Vec::new();
        for (prompt, spec) in [
            (alphabet.clone(), speculate),
            (alphabet.clone(), false),
            (vec![5, 9, 5, 9, 5], speculate),
        ] {
            let mut request = greedy(prompt, MaxNewTokens::Limited(40));
            request.speculative = spec.then(SpeculativeConfig::default);
            ids.push(s.submit(request).unwrap());
        }
        let outcomes = run_to_end(&mut s);
        let tokens: Vec<Vec<u32>> = ids.iter().map(|id| outcomes[id].tokens.clone()).collect();
        (tokens, s.stats(), s.backend().steps.clone())
    };
    for hash in [false, true] {
        let (plain, _, plain_steps) = run(false, hash);
        let (speculative, stats, steps) = run(true, hash);
        assert_eq!(speculative, plain, "hash {hash}");
        assert!(stats.drafts > 0, "hash {hash}: {stats:?}");
        // A step that verified proposals (an entry of several tokens after prefill) also ran
        // another sequence's one-token decode.
        let mixed = steps.iter().filter(|batch| {
            batch.iter().any(|&(_, n)| n == 1) && batch.iter().any(|&(_, n)| (2..=17).contains(&n))
        });
        assert!(mixed.count() > 0, "hash {hash}: {steps:?}");
        if hash {
            assert!(stats.accepted_tokens < stats.drafted_tokens, "{stats:?}");
        } else {
            assert!(stats.accepted_tokens > 40, "{stats:?}");
            // The first sequence (slot 0) took fewer passes than its 40 tokens.
            let passes = |steps: &[Vec<(SlotId, usize)>]| {
                steps
                    .iter()
                    .filter(|b| b.iter().any(|&(slot, _)| slot == 0))
                    .count()
            };
            assert!(
                passes(&steps) < passes(&plain_steps) / 2,
                "{} vs {}",
                passes(&steps),
                passes(&plain_steps)
            );
        }
    }
}

/// A backend that cannot score every position of a pass (OpenXLA's) refuses a request that asks
/// for speculation, saying why, instead of silently decoding without it.
#[test]
fn speculation_is_refused_where_the_backend_cannot_score() {
    let mut s = scheduler(Mock::new(100), SchedulerConfig::default());
    let mut request = greedy(vec![0, 1, 2], MaxNewTokens::Limited(4));
    request.speculative = Some(SpeculativeConfig::default());
    let err = s.submit(request).unwrap_err().to_string();
    assert!(
        err.contains("scores every position") && err.contains("--backend mlx"),
        "{err}"
    );
}

/// Sampled output keeps its distribution under speculation: 4,000 seeded requests each way
/// (temperature 1, the mock's peaked distribution, a prompt whose n-grams repeat so that
/// proposals come often and are accepted about a third of the time), the tokens at each of the
/// four generated positions compared by a two-sample chi-square test. Bound: the statistic stays
/// below 70 (p ≈ 1e-4 for the ≤ 31 degrees of freedom of 32 tokens), so this test fails by chance
/// about once in ten thousand runs of it, and fails for certain on a rule that biases towards
/// proposals (accepting every proposal it verifies, checked by hand: statistics in the
/// hundreds).
#[test]
fn sampled_output_keeps_its_distribution_under_speculation() {
    const N: usize = 4000;
    const TOKENS: usize = 4;
    let prompt: Vec<u32> = (0..26).chain(0..26).chain(0..3).collect();
    let run = |speculate: bool| {
        let mut mock = Mock::new(200);
        mock.scores = true;
        let config = SchedulerConfig {
            max_batch: 64,
            max_waiting: N,
            ..SchedulerConfig::default()
        };
        let mut s = scheduler(mock, config);
        let ids: Vec<RequestId> = (0..N as u64)
            .map(|seed| {
                let mut request =
                    GenerationRequest::new(prompt.clone(), MaxNewTokens::Limited(TOKENS));
                request.sampling = SamplingParams {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    seed: Some(seed + if speculate { 1 << 32 } else { 0 }),
                    ..SamplingParams::default()
                };
                request.speculative = speculate.then(SpeculativeConfig::default);
                s.submit(request).unwrap()
            })
            .collect();
        let outcomes = run_to_end(&mut s);
        let mut counts = vec![[0u32; VOCAB]; TOKENS];
        for id in ids {
            let tokens = &outcomes[&id].tokens;
            assert_eq!(tokens.len(), TOKENS);
            for (position, &token) in tokens.iter().enumerate() {
                counts[position][token as usize] += 1;
            }
        }
        (counts, s.stats())
    };
    let (plain, _) = run(false);
    let (speculative, stats) = run(true);
    assert!(
        stats.drafted_tokens > 1000 && stats.accepted_tokens > 100,
        "{stats:?}"
    );
    for position in 0..TOKENS {
        // Two-sample chi-square over the tokens either side drew (equal sample sizes).
        let statistic: f64 = (0..VOCAB)
            .map(|t| {
                let (a, b) = (
                    f64::from(plain[position][t]),
                    f64::from(speculative[position][t]),
                );
                if a + b > 0.0 {
                    (a - b).powi(2) / (a + b)
                } else {
                    0.0
                }
            })
            .sum();
        assert!(
            statistic < 70.0,
            "position {position}: chi-square {statistic:.1}\nplain {:?}\nspeculative {:?}",
            plain[position],
            speculative[position]
        );
    }
}

/// Where proposals keep failing (a continuation hashed from the whole slot, so the n-grams that
/// repeat predict nothing), speculation backs off: most steps decode one token, yet it probes now
/// and then (one proposal after a run of plain steps), and the tokens are those without it.
#[test]
fn failing_speculation_backs_off_and_probes() {
    let run = |speculate: bool| {
        let mut mock = Mock::new(400);
        mock.scores = true;
        mock.hash_contents = true;
        let mut s = scheduler(mock, SchedulerConfig::default());
        let prompt: Vec<u32> = (0..8).cycle().take(40).collect();
        let mut request = greedy(prompt, MaxNewTokens::Limited(200));
        request.speculative = speculate.then(SpeculativeConfig::default);
        let id = s.submit(request).unwrap();
        let outcome = run_to_end(&mut s)[&id].tokens.clone();
        let verifying = s
            .backend()
            .steps
            .iter()
            .skip(1)
            .filter(|batch| batch[0].1 > 1)
            .count();
        (outcome, s.stats(), verifying)
    };
    let (plain, _, _) = run(false);
    let (speculative, stats, verifying) = run(true);
    assert_eq!(speculative, plain);
    assert!(
        stats.accepted_tokens * 2 < stats.drafted_tokens,
        "{stats:?}"
    );
    assert!(
        (5..=60).contains(&verifying),
        "{verifying} verification passes: {stats:?}"
    );
}

/// A budget that opens on token 3 ("d"), closes on 20 ("u"), and forces 25 then 20 after
/// `tokens` tokens of reasoning.
fn reasoning_budget(tokens: Option<usize>, inside: bool) -> ReasoningBudget {
    ReasoningBudget {
        start: vec![3],
        ends: vec![vec![20]],
        forced: vec![25, 20],
        tokens,
        inside,
    }
}

/// The mock's greedy reply to [0, 1, 2] is the alphabet on from 3 (the budget's start tag): four
/// tokens of reasoning after it, then the forced end, then the model's own reply to that end;
/// with speculation on (proposals from the repeating prompt), the same tokens.
#[test]
fn a_reasoning_budget_forces_the_end_of_the_block_and_the_reply_goes_on() {
    let prompt: Vec<u32> = (0..26).chain(0..3).collect();
    for speculate in [false, true] {
        let mut mock = Mock::new(200);
        mock.scores = true;
        let mut s = scheduler(mock, SchedulerConfig::default());
        let mut request = greedy(prompt.clone(), MaxNewTokens::Limited(12));
        request.reasoning_budget = Some(reasoning_budget(Some(4), false));
        request.speculative = speculate.then(SpeculativeConfig::default);
        let id = s.submit(request).unwrap();
        let outcome = run_to_end(&mut s).remove(&id).unwrap();
        assert_eq!(
            outcome.tokens,
            [3, 4, 5, 6, 7, 25, 20, 21, 22, 23, 24, 25],
            "speculate {speculate}"
        );
        assert_eq!(outcome.text, "defghzuvwxyz");
        if speculate {
            assert!(s.stats().drafts > 0, "{:?}", s.stats());
        }
    }
}

/// `end_reasoning` forces the end of a running request's block at once, only inside a block
/// and only for a request that carries a budget; unknown and finished requests are told apart.
#[test]
fn end_reasoning_forces_the_end_of_a_running_block() {
    let mut s = scheduler(Mock::new(200), SchedulerConfig::default());
    let mut request = greedy(vec![10, 11], MaxNewTokens::Limited(10));
    request.reasoning_budget = Some(reasoning_budget(None, true));
    let id = s.submit(request).unwrap();
    let plain = s
        .submit(greedy(vec![10, 11], MaxNewTokens::Limited(10)))
        .unwrap();
    let mut outcomes = HashMap::new();
    for step in 1..=3 {
        collect(&mut outcomes, s.step(), step);
    }
    assert_eq!(s.end_reasoning(plain), ReasoningEnd::NoBudget);
    assert_eq!(s.end_reasoning(id + 100), ReasoningEnd::UnknownRequest);
    let before = outcomes[&id].tokens.len();
    assert_eq!(s.end_reasoning(id), ReasoningEnd::Ended);
    assert_eq!(
        s.end_reasoning(id),
        ReasoningEnd::NotReasoning,
        "already ending"
    );
    let mut step = 3;
    while s.has_work() {
        step += 1;
        collect(&mut outcomes, s.step(), step);
    }
    let tokens = &outcomes[&id].tokens;
    assert_eq!(
        tokens[..before],
        (12..12 + before as u32).collect::<Vec<_>>()
    );
    assert_eq!(tokens[before..before + 2], [25, 20]);
    assert_eq!(tokens[before + 2], 21, "the model's own reply to the end");
    assert_eq!(
        s.end_reasoning(id),
        ReasoningEnd::UnknownRequest,
        "finished"
    );
}

/// A budget that could not work is refused at submission, naming what is missing.
#[test]
fn a_reasoning_budget_without_tags_is_refused() {
    let mut s = scheduler(Mock::new(200), SchedulerConfig::default());
    let mut request = greedy(vec![1], MaxNewTokens::Limited(4));
    let mut budget = reasoning_budget(Some(2), false);
    budget.ends.clear();
    request.reasoning_budget = Some(budget);
    let err = s.submit(request).unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid reasoning budget: the reasoning budget has no end tag"
    );
}

/// llama.cpp's hashed proposers, each alone and chained in its order: every sequence's tokens are
/// those it gets without speculation, batched with a sequence that does not speculate, whether
/// the proposals are accepted (the alphabet continues: many accepted) or rolled back (a
/// continuation hashed from the whole slot, where keys seldom recur).
#[test]
fn hashed_proposers_keep_the_tokens() {
    let alphabet: Vec<u32> = (0..26).chain(0..6).collect();
    let map = NgramMapConfig {
        size_n: 2,
        size_m: 8,
        min_hits: 1,
    };
    let ngram_mod = NgramModConfig {
        n_match: 2,
        n_min: 1,
        n_max: 8,
    };
    let hashed = |k: bool, k4v: bool, m: bool| SpeculativeConfig {
        proposer: Proposer::Hashed,
        ngram_map_k: k.then_some(map),
        ngram_map_k4v: k4v.then_some(map),
        ngram_mod: m.then_some(ngram_mod),
        ..SpeculativeConfig::default()
    };
    let run = |config: Option<SpeculativeConfig>, hash: bool| {
        let mut mock = Mock::new(200);
        mock.scores = true;
        mock.hash_contents = hash;
        let mut s = scheduler(mock, SchedulerConfig::default());
        let mut ids = Vec::new();
        for (prompt, spec) in [
            (alphabet.clone(), config),
            (alphabet.clone(), None),
            (vec![5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5], config),
        ] {
            let mut request = greedy(prompt, MaxNewTokens::Limited(40));
            request.speculative = spec;
            ids.push(s.submit(request).unwrap());
        }
        let outcomes = run_to_end(&mut s);
        let tokens: Vec<Vec<u32>> = ids.iter().map(|id| outcomes[id].tokens.clone()).collect();
        (tokens, s.stats())
    };
    for hash in [false, true] {
        let (plain, _) = run(None, hash);
        for (k, k4v, m) in [
            (true, false, false),
            (false, true, false),
            (false, false, true),
            (true, true, true),
        ] {
            let (speculative, stats) = run(Some(hashed(k, k4v, m)), hash);
            let which = (k, k4v, m, hash);
            assert_eq!(speculative, plain, "{which:?}");
            assert!(stats.accepted_tokens <= stats.drafted_tokens, "{stats:?}");
            if !hash {
                assert!(stats.drafts > 0, "{which:?}: {stats:?}");
                assert!(stats.accepted_tokens > 20, "{which:?}: {stats:?}");
            }
        }
    }
}

/// ngram-mod's table outlives a request, as llama.cpp's lives as long as the server: a request
/// whose own tokens never repeat gets proposals from what an earlier request's prompt taught it,
/// and none on a fresh scheduler.
#[test]
fn ngram_mod_remembers_earlier_requests() {
    let config = SpeculativeConfig {
        proposer: Proposer::Hashed,
        ngram_mod: Some(NgramModConfig {
            n_match: 3,
            n_min: 1,
            n_max: 8,
        }),
        ..SpeculativeConfig::default()
    };
    let later = || {
        let mut request = greedy(vec![7, 8, 9], MaxNewTokens::Limited(12));
        request.speculative = Some(config);
        request
    };
    let scheduler_with_scores = || {
        let mut mock = Mock::new(200);
        mock.scores = true;
        scheduler(mock, SchedulerConfig::default())
    };
    let mut fresh = scheduler_with_scores();
    fresh.submit(later()).unwrap();
    let alone = run_to_end(&mut fresh);
    assert_eq!(fresh.stats().drafted_tokens, 0, "{:?}", fresh.stats());

    let mut s = scheduler_with_scores();
    let mut earlier = greedy((0..26).collect(), MaxNewTokens::Limited(2));
    earlier.speculative = Some(config);
    s.submit(earlier).unwrap();
    run_to_end(&mut s);
    let before = s.stats();
    let id = s.submit(later()).unwrap();
    let taught = run_to_end(&mut s);
    let after = s.stats();
    assert!(
        after.accepted_tokens - before.accepted_tokens >= 8,
        "{before:?} {after:?}"
    );
    assert_eq!(
        taught[&id].tokens,
        alone.values().next().unwrap().tokens,
        "same tokens either way"
    );
}

/// A request with LoRA scales runs its slot with them (trailing zeros dropped: all zeros is the
/// model alone), and neither reuses nor feeds the prefix cache, whose keys and values are the
/// model's alone; requests without adapters keep sharing it.
#[test]
fn requests_with_adapters_stay_out_of_the_prefix_cache() {
    let mock = Mock {
        prefix: true,
        ..Mock::new(64)
    };
    let mut s = scheduler(mock, SchedulerConfig::default()).with_prefix_cache(1 << 20);
    let prompt: Vec<u32> = (0..16).collect();
    let base = s
        .submit(greedy(prompt.clone(), MaxNewTokens::Limited(2)))
        .unwrap();
    run_to_end(&mut s);
    let kept = s.backend().slots.len();
    assert_eq!(kept, 1, "the base request's slot is kept");

    let mut adapted = greedy(prompt.clone(), MaxNewTokens::Limited(2));
    adapted.lora = vec![0.0, 0.5, 0.0];
    let id = s.submit(adapted).unwrap();
    let outcome = run_to_end(&mut s)[&id].clone();
    assert_eq!(
        outcome.finish.unwrap().1.cached_tokens,
        0,
        "an adapted request reuses nothing"
    );
    assert_eq!(s.backend().slots.len(), kept, "and its slot is not kept");
    assert!(s.backend().adapters.values().any(|v| v == &[0.0, 0.5]));

    let mut zeros = greedy(prompt.clone(), MaxNewTokens::Limited(2));
    zeros.lora = vec![0.0, 0.0];
    let id = s.submit(zeros).unwrap();
    let outcome = run_to_end(&mut s)[&id].clone();
    assert_eq!(
        outcome.finish.unwrap().1.cached_tokens,
        15,
        "all-zero scales are the model alone"
    );
    assert_ne!(base, id);
}
