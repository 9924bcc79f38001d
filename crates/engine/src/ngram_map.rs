//! llama.cpp's `ngram-map-k` and `ngram-map-k4v` proposers (its `common_ngram_map`), rebuilt
//! from their description and behaviour so that they propose the same drafts for the same token
//! history and acceptance feedback.
//!
//! Both look up the key n-gram that ends with the token just sampled (its last `size_n` tokens)
//! in the sequence's history, newest occurrence first (a hash of n-grams to one position each
//! answers before the scan), and propose the `size_m` tokens that followed that occurrence:
//! - `ngram-map-k` (key only) proposes as soon as the key occurred before;
//! - `ngram-map-k4v` (key and up to four values) counts the key's occurrences and, for each
//!   distinct m-gram that followed it (at most four), how often; it proposes only once the key
//!   has been seen `min_hits` times and the most frequent m-gram occurs at least twice as often
//!   as the others together. What it proposes is still the m-gram after the newest occurrence
//!   (as llama.cpp does), the statistics only gate it.
//!
//! After a verification, the number of accepted proposals caps the next draft taken from the
//! same key (and value): a key whose continuation was rejected at its third token proposes two.

/// The most values (distinct m-grams) counted per key.
pub const MAX_VALUES: usize = 4;
/// Entries of the hash from n-grams to their newest indexed position.
const HASH_ENTRIES: usize = 262_144;
/// Where occurrence counts stop growing.
const MAX_COUNT: u16 = 16_380;
/// The multiplier of the n-gram hash (near (√5 − 1)/2 · 2³², a prime).
const HASH_FACTOR: u32 = 2_654_435_761;

/// One map's settings: `--spec-ngram-map-k-size-n/-size-m/-min-hits` (or the `k4v` ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramMapConfig {
    /// The key n-gram's length (1 to 1024).
    pub size_n: u16,
    /// The proposed m-gram's length (1 to 1024).
    pub size_m: u16,
    /// Occurrences of the key before `k4v` proposes (at least 1; `k` does not read it, as in
    /// llama.cpp).
    pub min_hits: u16,
}

impl Default for NgramMapConfig {
    /// llama.cpp's defaults: 12, 48, 1.
    fn default() -> Self {
        Self {
            size_n: 12,
            size_m: 48,
            min_hits: 1,
        }
    }
}

impl NgramMapConfig {
    /// Refuses sizes llama.cpp refuses, naming the flag (`prefix`: `--spec-ngram-map-k` or
    /// `--spec-ngram-map-k4v`).
    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        for (what, value) in [("size-n", self.size_n), ("size-m", self.size_m)] {
            if !(1..=1024).contains(&value) {
                return Err(format!("{prefix}-{what} {value}: expected 1 to 1024"));
            }
        }
        if self.min_hits == 0 {
            return Err(format!("{prefix}-min-hits 0: expected at least 1"));
        }
        Ok(())
    }
}

/// A distinct m-gram seen after a key.
#[derive(Debug, Clone, Copy)]
struct Value {
    /// Where it starts in the history (0: an unused slot).
    at: usize,
    /// How often it followed the key.
    count: u16,
    /// Proposals of it accepted at its last draft (caps the next draft).
    accepted: i16,
}

/// A key n-gram that occurred more than once.
#[derive(Debug, Clone)]
struct Key {
    /// Where it occurs in the history (its contents are compared there).
    at: usize,
    /// Values are counted up to this position (inclusive of the next scan's start).
    counted_to: usize,
    /// Its occurrences found by drafts.
    count: u16,
    values: [Value; MAX_VALUES],
}

/// One sequence's map (llama.cpp keeps one per server slot and type).
#[derive(Debug, Clone)]
pub struct NgramMap {
    n: usize,
    m: usize,
    key_only: bool,
    min_hits: u16,
    keys: Vec<Key>,
    /// History length at the generation's start (the prompt's).
    begin_len: usize,
    /// History length at the last draft (or the start).
    last_check: usize,
    /// The key and value of the last draft, if it produced one.
    last_draft: Option<(usize, usize)>,
    /// Hash of n-gram → newest position indexed (0: empty), and the last position indexed.
    hashed: Vec<u32>,
    hashed_to: usize,
}

impl NgramMap {
    /// A fresh map: `key_only` for `ngram-map-k`, else `ngram-map-k4v`.
    pub fn new(config: NgramMapConfig, key_only: bool) -> Self {
        Self {
            n: usize::from(config.size_n),
            m: usize::from(config.size_m),
            key_only,
            min_hits: config.min_hits,
            keys: Vec::new(),
            begin_len: 0,
            last_check: 0,
            last_draft: None,
            hashed: vec![0; HASH_ENTRIES],
            hashed_to: 0,
        }
    }

    /// Starts a generation after `prompt`. (llama.cpp also prunes what a previous request of
    /// the same slot left past a shorter new prompt; a map here serves one sequence, so there
    /// is nothing to prune.)
    pub fn begin(&mut self, prompt: &[u32]) {
        self.last_check = prompt.len();
        self.begin_len = prompt.len();
    }

    fn hash(tokens: &[u32]) -> u32 {
        tokens
            .iter()
            .fold(0u32, |h, &t| h.wrapping_mul(HASH_FACTOR).wrapping_add(t))
    }

    fn slot(&self, tokens: &[u32]) -> usize {
        Self::hash(tokens) as usize % self.hashed.len()
    }

    /// The draft after `history` (the tokens whose positions are computed) and `sampled` (the
    /// token just sampled, not yet in `history`): empty when none.
    pub fn draft(&mut self, history: &[u32], sampled: u32) -> Vec<u32> {
        self.last_draft = None;
        let (len, n, m) = (history.len(), self.n, self.m);
        if len < 2 * n + m {
            return Vec::new();
        }
        debug_assert!(self.last_check <= len && self.begin_len <= len);
        self.last_check = len;
        let key: Vec<u32> = history[len - n + 1..]
            .iter()
            .copied()
            .chain([sampled])
            .collect();
        let is_key = |at: usize| history[at..at + n] == key[..];
        // The newest position of a complete key and value before the sampled token.
        let newest = len - n - m - 1;
        let mut found = 0;
        let indexed = self.hashed[self.slot(&key)] as usize;
        if indexed != 0 && indexed < newest && is_key(indexed) {
            found = indexed;
        }
        let (begin, hashed_to) = (self.begin_len, self.hashed_to);
        let in_prompt = || (hashed_to + 1..=begin.saturating_sub(n + m + 1)).rev();
        let generated = || (begin.max(hashed_to) + 1..=newest).rev();
        if found == 0 && begin > n + m + 1 {
            found = in_prompt().find(|&j| is_key(j)).unwrap_or(0);
        }
        if found == 0 {
            found = generated().find(|&j| is_key(j)).unwrap_or(0);
        }
        // Index the n-grams not indexed yet, newest first (a slot keeps its first writer).
        let positions: Vec<usize> = if begin > n + m + 1 {
            in_prompt().chain(generated()).collect()
        } else {
            generated().collect()
        };
        for j in positions {
            let slot = self.slot(&history[j..j + n]);
            if self.hashed[slot] == 0 {
                self.hashed[slot] = j as u32;
            }
        }
        self.hashed_to = self.hashed_to.max(newest);
        if found == 0 {
            return Vec::new();
        }

        let index = match self.keys.iter().position(|k| is_key(k.at)) {
            Some(index) => index,
            None => {
                let unused = Value {
                    at: 0,
                    count: 0,
                    accepted: m as i16,
                };
                self.keys.push(Key {
                    at: found,
                    counted_to: 0,
                    count: 0,
                    values: [unused; MAX_VALUES],
                });
                self.keys.len() - 1
            }
        };
        let entry = &mut self.keys[index];
        entry.count = (entry.count + 1).min(MAX_COUNT);
        let propose = |accepted: i16| -> Vec<u32> {
            let count = (m as i32).min(i32::from(accepted)).max(0) as usize;
            history[found + n..found + n + count].to_vec()
        };
        if self.key_only {
            self.last_draft = Some((index, 0));
            return propose(entry.values[0].accepted);
        }
        if entry.count < self.min_hits {
            return Vec::new();
        }
        // Count the values after each occurrence of the key since the last count.
        for i in entry.counted_to..=found {
            if !is_key(i) {
                continue;
            }
            let value = &history[i + n..i + n + m];
            let mut slot = None;
            for (v, known) in entry.values.iter_mut().enumerate() {
                if known.at == 0 {
                    *known = Value {
                        at: i + n,
                        count: 0,
                        accepted: m as i16,
                    };
                    slot = Some(v);
                    break;
                }
                if history[known.at..known.at + m] == *value {
                    slot = Some(v);
                    break;
                }
            }
            if let Some(v) = slot {
                entry.values[v].count = (entry.values[v].count + 1).min(MAX_COUNT);
            }
        }
        entry.counted_to = found;
        let (mut best, mut best_count) = (0, 0);
        for (v, value) in entry.values.iter().enumerate() {
            if value.count > best_count {
                (best, best_count) = (v, value.count);
            }
        }
        let others: u32 = entry
            .values
            .iter()
            .enumerate()
            .filter(|&(v, _)| v != best)
            .map(|(_, value)| u32::from(value.count))
            .sum();
        if others > 0 && u32::from(best_count) < 2 * others {
            // No value clearly more frequent than the others.
            return Vec::new();
        }
        self.last_draft = Some((index, best));
        propose(entry.values[best].accepted)
    }

    /// After a verification of the last draft: `accepted` of its proposals were accepted.
    pub fn accept(&mut self, accepted: usize) {
        if let Some((key, value)) = self.last_draft {
            self.keys[key].values[value].accepted = accepted.min(i16::MAX as usize) as i16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{NgramMap, NgramMapConfig};

    fn map(size_n: u16, size_m: u16, min_hits: u16, key_only: bool) -> NgramMap {
        NgramMap::new(
            NgramMapConfig {
                size_n,
                size_m,
                min_hits,
            },
            key_only,
        )
    }

    /// ngram-map-k, traced by hand through llama.cpp's `common_ngram_map_draft`: the key "1 2"
    /// (the last history token and the sampled one) is found in the prompt at 1 and proposes
    /// the 3 tokens after it; a key first seen across the prompt's end is not searched (the
    /// prompt scan stops at `begin − n − m − 1`, the output scan starts after `begin`); after 2
    /// of a draft were accepted, the same key proposes 2 (found through the hash now).
    #[test]
    fn key_only_map_proposes_what_followed_and_learns_the_accepted_length() {
        let mut k = map(2, 3, 1, true);
        let prompt = [10, 1, 2, 3, 4, 5, 6, 7];
        k.begin(&prompt);
        let mut history = prompt.to_vec();
        history.push(1);
        assert_eq!(k.draft(&history, 2), [3, 4, 5]);
        k.accept(2);
        history.extend([2, 3, 4]);
        assert!(k.draft(&history, 9).is_empty());
        history.extend([9, 1]);
        assert_eq!(k.draft(&history, 2), [3, 4]);
        // Too short a history (under 2n + m) never proposes.
        let mut short = map(2, 3, 1, true);
        short.begin(&[1, 2]);
        assert!(short.draft(&[1, 2, 3, 1, 2, 3], 1).is_empty());
    }

    /// ngram-map-k4v, by hand: after "1" the prompt has "5" twice and "6" once; the most
    /// frequent value is twice the others, so it proposes — the newest occurrence's
    /// continuation ("6"), as llama.cpp does, not the most frequent one. With values seen
    /// equally often it proposes nothing; below `min_hits` occurrences of the key neither.
    #[test]
    fn key_value_map_gates_on_hits_and_value_counts() {
        let prompt = [0, 1, 5, 1, 5, 1, 6, 2];
        let mut k4v = map(1, 1, 1, false);
        k4v.begin(&prompt);
        assert_eq!(k4v.draft(&prompt, 1), [6]);

        let tied = [0, 1, 5, 1, 6, 2];
        let mut k4v = map(1, 1, 1, false);
        k4v.begin(&tied);
        assert!(k4v.draft(&tied, 1).is_empty());

        let mut picky = map(1, 1, 2, false);
        picky.begin(&prompt);
        assert!(picky.draft(&prompt, 1).is_empty(), "one hit of the key");
        // The second hit: found through the hash now (position 5, below len − n − m − 1).
        let longer: Vec<u32> = prompt.iter().copied().chain([1, 5]).collect();
        assert_eq!(picky.draft(&longer, 1), [6], "the second hit");
        // The same history again: the count resumes at the last match (inclusive, as in
        // llama.cpp), so "6" is counted twice and ties with "5": nothing proposed.
        assert!(picky.draft(&longer, 1).is_empty());
    }

    #[test]
    fn sizes_are_refused_out_of_llama_cpp_range() {
        let bad = NgramMapConfig {
            size_n: 0,
            ..NgramMapConfig::default()
        };
        assert!(
            bad.validate("--spec-ngram-map-k")
                .unwrap_err()
                .contains("-size-n 0")
        );
        let bad = NgramMapConfig {
            min_hits: 0,
            ..NgramMapConfig::default()
        };
        assert!(
            bad.validate("--spec-ngram-map-k4v")
                .unwrap_err()
                .contains("k4v-min-hits")
        );
        assert!(NgramMapConfig::default().validate("x").is_ok());
    }
}
