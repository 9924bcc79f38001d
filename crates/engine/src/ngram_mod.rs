//! llama.cpp's `ngram-mod` proposer (its `common_ngram_mod`), rebuilt from its description and
//! behaviour so that it proposes the same drafts for the same history.
//!
//! One hash table for every sequence and request of the server (4 Mi entries, 16 MiB): the
//! entry of each `n_match`-gram's hash holds the token that followed it last (collisions
//! overwrite). A draft chains lookups: the n-gram ending with the token just sampled gives the
//! next token, the n-gram ending with that one the next, until an empty entry or `n_max`
//! tokens; a chain that stops before `n_min` tokens proposes nothing. A sequence adds its
//! prompt's n-grams when it starts and its own output's in chunks of 32 tokens; the table is
//! emptied when a start finds it over a quarter full, and when a sequence's drafts have been
//! accepted below a quarter five times running.

/// The table's entries.
const ENTRIES: usize = 4 * 1024 * 1024;
/// An empty entry.
const EMPTY: i32 = -1;
/// The multiplier of the n-gram hash.
const HASH_FACTOR: u64 = 6_364_136_223_846_793_005;
/// Output tokens gathered before they are added to the table.
const CHUNK: usize = 32;
/// The table is emptied at a start that finds more than this fraction of it used.
const MAX_OCCUPANCY: f64 = 0.25;
/// Drafts accepted below this fraction count towards a reset…
const LOW_ACCEPTANCE: f64 = 0.25;
/// …after this many in a row.
const LOW_STREAK: u32 = 5;

/// `--spec-ngram-mod-n-match/-n-min/-n-max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramModConfig {
    /// The n-gram hashed (1 to 1024).
    pub n_match: u16,
    /// Drafts shorter than this are dropped (0 to 1024).
    pub n_min: u16,
    /// The longest draft (0 to 1024; 0 never proposes).
    pub n_max: u16,
}

impl Default for NgramModConfig {
    /// llama.cpp's defaults (and `--spec-default`'s): 24, 48, 64.
    fn default() -> Self {
        Self {
            n_match: 24,
            n_min: 48,
            n_max: 64,
        }
    }
}

impl NgramModConfig {
    /// Refuses values llama.cpp refuses, naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1024).contains(&self.n_match) {
            return Err(format!(
                "--spec-ngram-mod-n-match {}: expected 1 to 1024",
                self.n_match
            ));
        }
        for (flag, value) in [
            ("--spec-ngram-mod-n-min", self.n_min),
            ("--spec-ngram-mod-n-max", self.n_max),
        ] {
            if value > 1024 {
                return Err(format!("{flag} {value}: expected 0 to 1024"));
            }
        }
        Ok(())
    }
}

/// The shared table of one n-gram length.
#[derive(Debug, Clone)]
pub struct NgramModTable {
    n: usize,
    used: usize,
    entries: Vec<i32>,
}

impl NgramModTable {
    /// An empty table of `n`-grams.
    pub fn new(n: usize) -> Self {
        Self::with_entries(n, ENTRIES)
    }

    fn with_entries(n: usize, entries: usize) -> Self {
        Self {
            n,
            used: 0,
            entries: vec![EMPTY; entries],
        }
    }

    /// The n-gram length it hashes.
    pub fn n(&self) -> usize {
        self.n
    }

    fn index(&self, ngram: &[u32]) -> usize {
        let hash = ngram[..self.n].iter().fold(0u64, |h, &t| {
            h.wrapping_mul(HASH_FACTOR).wrapping_add(u64::from(t))
        });
        (hash % self.entries.len() as u64) as usize
    }

    /// Records that `tokens[n]` followed the n-gram `tokens[..n]`.
    fn add(&mut self, tokens: &[u32]) {
        let i = self.index(tokens);
        if self.entries[i] == EMPTY {
            self.used += 1;
        }
        self.entries[i] = tokens[self.n] as i32;
    }

    fn get(&self, ngram: &[u32]) -> Option<u32> {
        let entry = self.entries[self.index(ngram)];
        (entry != EMPTY).then_some(entry as u32)
    }

    fn reset(&mut self) {
        self.entries.fill(EMPTY);
        self.used = 0;
    }

    fn occupancy(&self) -> f64 {
        self.used as f64 / self.entries.len() as f64
    }
}

/// One sequence's place in the table.
#[derive(Debug, Clone, Copy, Default)]
pub struct NgramModState {
    /// The history up to here has been added.
    added_to: usize,
    /// The last draft's length.
    last_draft: usize,
    /// Drafts accepted below a quarter in a row.
    low_streak: u32,
}

impl NgramModState {
    /// Starts a generation after `prompt`: adds its n-grams, then empties the table if that
    /// left it over a quarter full.
    pub fn begin(&mut self, table: &mut NgramModTable, prompt: &[u32]) {
        self.added_to = 0;
        self.last_draft = 0;
        let n = table.n;
        if prompt.len() < n {
            return;
        }
        for i in 0..prompt.len() - n {
            table.add(&prompt[i..]);
        }
        self.added_to = prompt.len() - n;
        if table.occupancy() > MAX_OCCUPANCY {
            table.reset();
        }
    }

    /// The draft after `history` (the tokens whose positions are computed) and `sampled`.
    pub fn draft(
        &mut self,
        table: &mut NgramModTable,
        config: NgramModConfig,
        history: &[u32],
        sampled: u32,
    ) -> Vec<u32> {
        self.last_draft = 0;
        let (len, n) = (history.len(), table.n);
        if len < n {
            return Vec::new();
        }
        if self.added_to + CHUNK < len {
            for i in self.added_to..len - n {
                table.add(&history[i..]);
            }
            self.added_to = len - n;
        }
        let (n_min, n_max) = (usize::from(config.n_min), usize::from(config.n_max));
        let mut chain: Vec<u32> = history[len - n + 1..].to_vec();
        chain.push(sampled);
        for i in 0..n_max {
            match table.get(&chain[i..]) {
                Some(token) => chain.push(token),
                None if i < n_min => return Vec::new(),
                None => break,
            }
        }
        let draft = chain.split_off(n);
        self.last_draft = draft.len();
        draft
    }

    /// After a verification of its draft: `accepted` proposals were accepted; the fifth draft
    /// in a row accepted below a quarter empties the table.
    pub fn accept(&mut self, table: &mut NgramModTable, accepted: usize) {
        if self.last_draft == 0 {
            return;
        }
        if (accepted as f64) / (self.last_draft as f64) < LOW_ACCEPTANCE {
            self.low_streak += 1;
            if self.low_streak >= LOW_STREAK {
                table.reset();
                self.low_streak = 0;
                self.added_to = 0;
            }
        } else {
            self.low_streak = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{NgramModConfig, NgramModState, NgramModTable};

    /// By hand through llama.cpp's `draft_one`: the prompt maps "1 2"→3, then "1 2"→5 (the
    /// later occurrence overwrites: 4 entries), "2 3"→4, "3 4"→1, "4 1"→2; after "3" and the sampled "4"
    /// the chain reads 1, 2, 5 and stops at "2 5" (never seen): three tokens, enough for
    /// `n_min` 1, not for 4. Five drafts accepted under a quarter empty the table.
    #[test]
    fn chains_lookups_and_resets_after_a_low_acceptance_streak() {
        let mut table = NgramModTable::new(2);
        let mut state = NgramModState::default();
        let prompt = [1, 2, 3, 4, 1, 2, 5];
        state.begin(&mut table, &prompt);
        let history = [1, 2, 3, 4, 1, 2, 5, 3];
        let config = NgramModConfig {
            n_match: 2,
            n_min: 1,
            n_max: 4,
        };
        assert_eq!(state.draft(&mut table, config, &history, 4), [1, 2, 5]);
        let at_most_two = NgramModConfig { n_max: 2, ..config };
        assert_eq!(state.draft(&mut table, at_most_two, &history, 4), [1, 2]);
        let at_least_four = NgramModConfig { n_min: 4, ..config };
        assert!(
            state
                .draft(&mut table, at_least_four, &history, 4)
                .is_empty()
        );
        assert!(state.draft(&mut table, config, &history, 7).is_empty());

        for round in 0..5 {
            assert_eq!(state.draft(&mut table, config, &history, 4), [1, 2, 5]);
            state.accept(&mut table, 0);
            let expected_used = if round < 4 { 4 } else { 0 };
            assert_eq!(table.used, expected_used, "round {round}");
        }
        assert!(state.draft(&mut table, config, &history, 4).is_empty());
        // A good draft ends a streak.
        state.begin(&mut table, &prompt);
        for _ in 0..4 {
            state.draft(&mut table, config, &history, 4);
            state.accept(&mut table, 0);
        }
        state.draft(&mut table, config, &history, 4);
        state.accept(&mut table, 3);
        state.draft(&mut table, config, &history, 4);
        state.accept(&mut table, 0);
        assert_eq!(table.used, 4);
    }

    /// Output n-grams join the table once 32 tokens have gathered past the last addition, and
    /// a start that finds the table over a quarter full empties it.
    #[test]
    fn output_is_added_in_chunks_and_a_full_table_is_emptied() {
        let mut table = NgramModTable::with_entries(1, 64);
        let mut state = NgramModState::default();
        let config = NgramModConfig {
            n_match: 1,
            n_min: 1,
            n_max: 1,
        };
        state.begin(&mut table, &[1, 2]);
        assert_eq!(table.used, 1);
        let mut history: Vec<u32> = vec![1, 2];
        history.extend(100..131);
        assert!(state.draft(&mut table, config, &history, 7).is_empty());
        assert_eq!(table.used, 1, "31 new tokens: not yet");
        history.push(131);
        state.draft(&mut table, config, &history, 7);
        // Tokens 2..=130 each got an entry (64 slots: some collide).
        assert!(table.used > 16, "{}", table.used);
        let mut other = NgramModState::default();
        other.begin(&mut table, &[1, 2]);
        assert_eq!(table.used, 0, "over a quarter full at a start: emptied");
    }
}
