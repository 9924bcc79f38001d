//! A limit on how long a reply may reason: once a reasoning block (`<think>` … `</think>`) has
//! run for its budget of tokens, the engine writes the block's end itself (after an optional
//! message such as "I must answer now."), so that the reply goes on to its answer. The same end
//! can be asked for at any time while the reply reasons ([`BudgetTracker::force`]: llama-server's
//! `reasoning_end` control action).
//!
//! The tracker watches the reply's tokens, not its text: the tags are token sequences (a
//! reasoning model writes `</think>` as the one special token it was trained on, which is what
//! tokenizing the tag gives), so a tag is found however the detokenizer groups its text.
//!
//! States, in order: `Idle` (waiting for the start tag) → `Counting` (inside the block; each
//! token spends one of the budget; an end tag the model writes itself ends it: `Done`) →
//! `Waiting` (the budget is spent but the last token left a character unfinished: its bytes
//! complete first, so no character is cut) → `Forcing` (the forced tokens, one per step, whatever
//! the model's logits say) → `Done`. A start tag after `Done` opens a new block with a fresh
//! budget, as a model may reason more than once in a reply.

/// A request's reasoning budget: the tags as token sequences and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningBudget {
    /// The tokens that open a reasoning block (`<think>`).
    pub start: Vec<u32>,
    /// Token sequences any of which closes it (`</think>`).
    pub ends: Vec<Vec<u32>>,
    /// What the engine writes when the budget runs out or the end is asked for: an optional
    /// message's tokens, then the first end tag's. Never empty.
    pub forced: Vec<u32>,
    /// Tokens the block may take; `None` for no count (the end comes only when the model writes
    /// it or when it is asked for).
    pub tokens: Option<usize>,
    /// The reply starts inside the block, whatever the prompt holds. Without it, the reply
    /// starts inside when the prompt's last start tag has no end tag after it (a template that
    /// writes `<think>` at the start of the reply).
    pub inside: bool,
}

impl ReasoningBudget {
    /// Why this budget cannot be used, if it cannot: an empty start tag, no end tag, or nothing
    /// to force.
    pub fn check(&self) -> Result<(), String> {
        if self.start.is_empty() && !self.inside {
            return Err("the reasoning budget's start tag has no tokens".into());
        }
        if self.ends.iter().all(Vec::is_empty) {
            return Err("the reasoning budget has no end tag".into());
        }
        if self.forced.is_empty() {
            return Err("the reasoning budget has nothing to force at its end".into());
        }
        Ok(())
    }
}

/// What asking a request to end its reasoning ([`crate::Engine::end_reasoning`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningEnd {
    /// The block's end is written next.
    Ended,
    /// No running request has that id.
    UnknownRequest,
    /// The request has no reasoning budget to end its block with (llama-server's
    /// `reasoning_control` was not asked for).
    NoBudget,
    /// The request is not inside a reasoning block (not opened yet, or already closed).
    NotReasoning,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    /// Inside a block; `left` tokens of its budget remain (`None`: no count).
    Counting {
        left: Option<usize>,
    },
    /// The budget is spent; the last token's character is unfinished.
    Waiting,
    /// Writing the forced tokens; `at` is the next one's index.
    Forcing {
        at: usize,
    },
    Done,
}

/// One reply's reasoning budget in progress.
#[derive(Debug, Clone)]
pub(crate) struct BudgetTracker {
    budget: ReasoningBudget,
    state: State,
    /// The reply's last tokens, as many as the longest tag: where a tag is looked for.
    recent: Vec<u32>,
    longest: usize,
}

impl BudgetTracker {
    /// The tracker of a reply to `prompt`.
    pub(crate) fn new(budget: ReasoningBudget, prompt: &[u32]) -> Self {
        let longest = budget
            .ends
            .iter()
            .map(Vec::len)
            .chain([budget.start.len()])
            .max()
            .unwrap_or(0);
        let mut tracker = Self {
            state: State::Idle,
            recent: Vec::with_capacity(longest),
            longest,
            budget,
        };
        if tracker.budget.inside || tracker.left_open(prompt) {
            tracker.open();
        }
        tracker
    }

    /// Whether `prompt`'s last start tag has no end tag after it.
    fn left_open(&self, prompt: &[u32]) -> bool {
        let start = &self.budget.start;
        if start.is_empty() {
            return false;
        }
        let Some(at) = prompt.windows(start.len()).rposition(|w| w == start) else {
            return false;
        };
        let after = &prompt[at + start.len()..];
        !self
            .budget
            .ends
            .iter()
            .filter(|end| !end.is_empty())
            .any(|end| after.windows(end.len()).any(|w| w == end))
    }

    /// The token the engine must write next, while it forces the block's end.
    pub(crate) fn forced(&self) -> Option<u32> {
        match self.state {
            State::Forcing { at } => self.budget.forced.get(at).copied(),
            _ => None,
        }
    }

    /// Whether the reply is inside a reasoning block whose end has not been forced yet: what
    /// [`BudgetTracker::force`] can act on.
    pub(crate) fn is_reasoning(&self) -> bool {
        matches!(self.state, State::Counting { .. } | State::Waiting)
    }

    /// Ends the block now (the forced tokens come next), if the reply is inside one. Returns
    /// whether it was.
    pub(crate) fn force(&mut self) -> bool {
        if !self.is_reasoning() {
            return false;
        }
        self.state = State::Forcing { at: 0 };
        self.recent.clear();
        true
    }

    /// Takes the reply's next token; `complete` is false when its text leaves a character
    /// unfinished.
    pub(crate) fn observe(&mut self, token: u32, complete: bool) {
        self.remember(token);
        match self.state {
            State::Idle | State::Done => {
                if self.ends_with(&self.budget.start) {
                    self.recent.clear();
                    self.open();
                }
            }
            State::Counting { left } => {
                if self.ends_with_any_end() {
                    self.finish();
                    return;
                }
                let left = left.map(|n| n.saturating_sub(1));
                self.state = match left {
                    Some(0) if complete => self.start_forcing(),
                    Some(0) => State::Waiting,
                    _ => State::Counting { left },
                };
            }
            State::Waiting => {
                if self.ends_with_any_end() {
                    self.finish();
                } else if complete {
                    self.state = self.start_forcing();
                }
            }
            State::Forcing { at } => {
                let at = at + 1;
                self.state = if at >= self.budget.forced.len() {
                    self.recent.clear();
                    State::Done
                } else {
                    State::Forcing { at }
                };
            }
        }
    }

    fn open(&mut self) {
        self.state = match self.budget.tokens {
            Some(0) => self.start_forcing(),
            left => State::Counting { left },
        };
    }

    fn start_forcing(&mut self) -> State {
        self.recent.clear();
        State::Forcing { at: 0 }
    }

    fn finish(&mut self) {
        self.recent.clear();
        self.state = State::Done;
    }

    fn remember(&mut self, token: u32) {
        if self.longest == 0 {
            return;
        }
        if self.recent.len() == self.longest {
            self.recent.remove(0);
        }
        self.recent.push(token);
    }

    fn ends_with(&self, tag: &[u32]) -> bool {
        !tag.is_empty() && self.recent.ends_with(tag)
    }

    fn ends_with_any_end(&self) -> bool {
        self.budget.ends.iter().any(|end| self.ends_with(end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: u32 = 100;
    const CLOSE: u32 = 101;

    fn budget(tokens: Option<usize>, inside: bool) -> ReasoningBudget {
        ReasoningBudget {
            start: vec![OPEN],
            ends: vec![vec![CLOSE], vec![7, 8]],
            forced: vec![50, 51, CLOSE],
            tokens,
            inside,
        }
    }

    /// Runs `reply` through a tracker, replacing each token by the forced one whenever the
    /// tracker forces: the reply the engine would write.
    fn written(tracker: &mut BudgetTracker, reply: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut model = reply.iter().copied();
        while let Some(token) = tracker.forced().or_else(|| model.next()) {
            tracker.observe(token, true);
            out.push(token);
        }
        out
    }

    /// A tracker of a reply to a prompt without tags.
    fn fresh(budget: ReasoningBudget) -> BudgetTracker {
        BudgetTracker::new(budget, &[1, 2])
    }

    #[test]
    fn a_prompt_whose_last_block_is_open_starts_the_reply_inside_it() {
        let open = |prompt: &[u32]| BudgetTracker::new(budget(Some(5), false), prompt);
        assert!(open(&[1, OPEN, 2]).is_reasoning());
        assert!(open(&[OPEN]).is_reasoning());
        assert!(!open(&[1, OPEN, 2, CLOSE, 3]).is_reasoning());
        assert!(!open(&[OPEN, 7, 8]).is_reasoning(), "a two-token end tag");
        assert!(
            open(&[OPEN, CLOSE, 4, OPEN]).is_reasoning(),
            "the last block counts"
        );
        assert!(!open(&[1, 2, 3]).is_reasoning());
    }

    #[test]
    fn a_spent_budget_forces_the_end_then_lets_the_answer_through() {
        let mut tracker = fresh(budget(Some(3), false));
        let reply = [OPEN, 1, 2, 3, 4, 5, 6];
        assert_eq!(
            written(&mut tracker, &reply),
            [OPEN, 1, 2, 3, 50, 51, CLOSE, 4, 5, 6]
        );
        assert_eq!(tracker.state, State::Done);
    }

    #[test]
    fn an_end_the_model_writes_within_the_budget_forces_nothing() {
        let mut tracker = fresh(budget(Some(5), false));
        let reply = [OPEN, 1, CLOSE, 2, 3, 4, 5, 6, 9];
        assert_eq!(written(&mut tracker, &reply), reply);
        // A multi-token end tag is found across tokens.
        let mut tracker = fresh(budget(Some(5), false));
        let reply = [OPEN, 1, 7, 8, 2, 3, 4, 5, 6];
        assert_eq!(written(&mut tracker, &reply), reply);
    }

    #[test]
    fn a_prompt_that_opened_the_block_counts_from_the_first_token() {
        let mut tracker = fresh(budget(Some(2), true));
        assert_eq!(written(&mut tracker, &[1, 2, 3]), [1, 2, 50, 51, CLOSE, 3]);
        // A budget of 0 forces at once.
        let mut tracker = fresh(budget(Some(0), true));
        assert_eq!(tracker.forced(), Some(50));
        assert_eq!(written(&mut tracker, &[9]), [50, 51, CLOSE, 9]);
    }

    #[test]
    fn a_reply_that_never_opens_a_block_is_left_alone() {
        let mut tracker = fresh(budget(Some(1), false));
        let reply = [1, 2, 3, 4, 5];
        assert_eq!(written(&mut tracker, &reply), reply);
        assert!(!tracker.is_reasoning());
    }

    #[test]
    fn a_second_block_gets_a_fresh_budget() {
        let mut tracker = fresh(budget(Some(2), false));
        let reply = [OPEN, 1, 2, 3, OPEN, 4, 5, 6];
        assert_eq!(
            written(&mut tracker, &reply),
            [OPEN, 1, 2, 50, 51, CLOSE, 3, OPEN, 4, 5, 50, 51, CLOSE, 6]
        );
    }

    #[test]
    fn an_unfinished_character_completes_before_the_end_is_forced() {
        let mut tracker = fresh(budget(Some(1), true));
        tracker.observe(1, false);
        assert_eq!(tracker.forced(), None);
        tracker.observe(2, false);
        assert_eq!(tracker.forced(), None);
        tracker.observe(3, true);
        assert_eq!(tracker.forced(), Some(50));
    }

    #[test]
    fn force_ends_a_block_without_a_count_and_only_inside_one() {
        let mut tracker = fresh(budget(None, false));
        assert!(!tracker.force(), "nothing to end before the block opens");
        tracker.observe(OPEN, true);
        for t in 10..60 {
            tracker.observe(t, true);
            assert_eq!(tracker.forced(), None, "no count: never forced by itself");
        }
        assert!(tracker.force());
        assert_eq!(written(&mut tracker, &[9]), [50, 51, CLOSE, 9]);
        assert!(!tracker.force(), "the block has ended");
    }

    #[test]
    fn check_refuses_budgets_that_cannot_work() {
        assert!(budget(Some(1), false).check().is_ok());
        let mut b = budget(Some(1), false);
        b.start.clear();
        assert!(b.check().unwrap_err().contains("start tag"));
        b.inside = true;
        assert!(b.check().is_ok(), "inside a block, no start tag is needed");
        let mut b = budget(Some(1), false);
        b.ends = vec![vec![]];
        assert!(b.check().unwrap_err().contains("end tag"));
        let mut b = budget(Some(1), false);
        b.forced.clear();
        assert!(b.check().unwrap_err().contains("force"));
    }
}
