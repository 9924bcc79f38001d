//! Speculative decoding by prompt lookup (llama.cpp's `--spec-type ngram-simple`): the tokens that
//! followed the latest earlier occurrence of the sequence's last n-gram (in its prompt or its own
//! output) are proposed, and one forward pass over the pending token and the proposals verifies
//! them all; every accepted proposal is a token decoded without a pass of its own. Decode on a CPU
//! reads every weight once per pass, so a pass over a few tokens costs little more than one: what
//! repeats (code being edited, quoted documents, structured text) decodes several tokens a pass.
//!
//! Greedy output is the same token for token with and without speculation (bit for bit with int8
//! activations, whose logits do not depend on how a sequence is chunked); sampled output keeps its
//! distribution (the acceptance rule of [`crate::Sampler::verify`]).

/// Prompt-lookup speculation's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// Most tokens proposed per pass (`--draft-max`).
    pub draft_max: usize,
    /// Fewer proposals than this are not worth a verification pass (`--draft-min`).
    pub draft_min: usize,
    /// The longest and shortest n-grams looked up, longest first.
    pub ngram_max: usize,
    pub ngram_min: usize,
}

impl Default for SpeculativeConfig {
    /// Up to 16 proposals (llama.cpp's `--draft-max`), from n-grams of 4 down to 2 tokens (a
    /// single matching token predicts little: its proposals were mostly rejected in our runs).
    fn default() -> Self {
        Self {
            draft_max: 16,
            draft_min: 1,
            ngram_max: 4,
            ngram_min: 2,
        }
    }
}

impl SpeculativeConfig {
    /// Refuses settings that cannot work, naming the setting.
    pub fn validate(&self) -> Result<(), crate::EngineError> {
        let bad = |field: &'static str, value: usize, expected: &'static str| {
            Err(crate::EngineError::InvalidConfig {
                field,
                value,
                expected,
            })
        };
        if self.draft_max == 0 {
            return bad("draft_max", 0, "at least 1");
        }
        if self.draft_min > self.draft_max {
            return bad("draft_min", self.draft_min, "at most draft_max");
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return bad("ngram_min", self.ngram_min, "between 1 and ngram_max");
        }
        Ok(())
    }

    /// The proposals after `tokens` (prompt and output so far), at most `limit`: what followed
    /// the latest earlier occurrence of its last n-gram, the longest n-gram that has one; empty
    /// when none does or too few tokens follow it.
    pub fn propose(&self, tokens: &[u32], limit: usize) -> Vec<u32> {
        let limit = limit.min(self.draft_max);
        if limit == 0 || limit < self.draft_min {
            return Vec::new();
        }
        let len = tokens.len();
        for n in (self.ngram_min..=self.ngram_max).rev() {
            if len <= n {
                continue;
            }
            let suffix = &tokens[len - n..];
            // Latest occurrence strictly before the suffix itself.
            let found = (0..len - n).rev().find(|&i| &tokens[i..i + n] == suffix);
            if let Some(start) = found {
                let from = start + n;
                let proposals: Vec<u32> = tokens[from..len.min(from + limit)].to_vec();
                if proposals.len() >= self.draft_min.max(1) {
                    return proposals;
                }
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::SpeculativeConfig;

    #[test]
    fn proposes_what_followed_the_latest_match_of_the_longest_ngram() {
        let config = SpeculativeConfig {
            draft_max: 4,
            draft_min: 1,
            ngram_max: 3,
            ngram_min: 1,
        };
        // "a b c d e ... a b c" → after the 3-gram "a b c": "d e f x".
        let tokens = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
        assert_eq!(config.propose(&tokens, 10), [4, 5, 6, 7]);
        assert_eq!(config.propose(&tokens, 2), [4, 5]);
        // The latest occurrence wins.
        let tokens = [5, 8, 5, 9, 5];
        assert_eq!(config.propose(&tokens, 10), [9, 5]);
        // Nothing repeats: no proposal.
        assert!(config.propose(&[1, 2, 3, 4], 10).is_empty());
        // Too few to bother.
        let picky = SpeculativeConfig {
            draft_min: 3,
            ..config
        };
        assert!(picky.propose(&[7, 8, 7], 10).is_empty());
        assert!(picky.validate().is_ok());
        assert!(
            SpeculativeConfig {
                draft_max: 0,
                ..config
            }
            .validate()
            .is_err()
        );
    }
}
