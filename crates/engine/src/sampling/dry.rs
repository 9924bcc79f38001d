//! DRY ("don't repeat yourself", as llama.cpp's `llama_sampler_dry`, from koboldcpp): a token
//! that would extend a sequence already present in the recent context is penalised by
//! `multiplier * base^(length - allowed_length)`, where `length` is the longest such repetition
//! it would extend. Sequence breakers (texts such as a newline) cap how far back a repetition may
//! reach, so that a repeated structure across lines is not punished.
//!
//! The cost per token is linear in the scanned context (a Z-function over it, reversed) and does
//! not depend on the vocabulary: the penalty lands on the few tokens that would extend a
//! repetition. Resolving the breakers to token sequences scans the vocabulary once per set of
//! breakers ([`resolve_breakers`]).

use std::collections::HashMap;

/// Longest breaker text looked at, in bytes (llama.cpp's `MAX_CHAR_LEN`).
const MAX_BREAKER_BYTES: usize = 40;
/// Longest tail kept for a breaker that starts inside a token (llama.cpp's `MAX_SEQ_LEN`).
const MAX_TAIL_TOKENS: usize = 20;

/// Sequence breakers as token sequences: a head token and, for each way the breaker can start
/// in it, the tokens that must follow (empty when the head token contains the whole breaker).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DryBreakers {
    by_head: HashMap<u32, Vec<Vec<u32>>>,
}

impl DryBreakers {
    /// Breakers given directly as token sequences (the first token is the head).
    pub fn from_sequences(sequences: &[Vec<u32>]) -> Self {
        let mut breakers = Self::default();
        for sequence in sequences {
            if let Some((&head, tail)) = sequence.split_first() {
                breakers.add(head, tail.to_vec());
            }
        }
        breakers
    }

    fn add(&mut self, head: u32, tail: Vec<u32>) {
        let tails = self.by_head.entry(head).or_default();
        if !tails.contains(&tail) {
            tails.push(tail);
        }
    }

    /// Whether `token` alone is a breaker (its text contains a whole breaker).
    fn is_single_token(&self, token: u32) -> bool {
        self.by_head
            .get(&token)
            .is_some_and(|tails| tails.iter().any(Vec::is_empty))
    }
}

/// Resolves breaker texts against a vocabulary, as llama.cpp's `get_overlapping_token_sequences`:
/// a token whose text (`token_texts[id]`, special tokens as their text) contains the breaker is a
/// breaker by itself; a token whose text ends with a proper prefix of the breaker is the head of
/// a breaker whose tail is `tokenize(the rest)`, at most 20 tokens. A breaker is cut to 40 bytes.
pub fn resolve_breakers(
    breakers: &[String],
    token_texts: &[Vec<u8>],
    tokenize: &dyn Fn(&str) -> Vec<u32>,
) -> DryBreakers {
    let mut out = DryBreakers::default();
    for breaker in breakers.iter().filter(|b| !b.is_empty()) {
        let mut end = breaker.len().min(MAX_BREAKER_BYTES);
        while !breaker.is_char_boundary(end) {
            end -= 1;
        }
        let needle = &breaker.as_bytes()[..end];
        for (id, word) in token_texts.iter().enumerate() {
            let id = id as u32;
            if word.windows(needle.len()).any(|w| w == needle) {
                out.add(id, Vec::new());
                continue;
            }
            // Every position where the word's tail is a proper prefix of the breaker.
            for pos in (0..word.len()).filter(|&p| word[p] == needle[0]) {
                let overlap = word.len() - pos;
                if overlap >= needle.len() || word[pos..] != needle[..overlap] {
                    continue;
                }
                let rest = String::from_utf8_lossy(&needle[overlap..]);
                let mut tail = tokenize(&rest);
                tail.truncate(MAX_TAIL_TOKENS);
                out.add(id, tail);
            }
        }
    }
    out
}

/// DRY's settings for one request.
#[derive(Debug, Clone, Copy)]
pub(super) struct DrySettings {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    pub last_n: usize,
}

/// The penalty of every token that would extend a repetition in `history` (its last
/// `settings.last_n` tokens), as `(token, amount to subtract from its logit)`.
pub(super) fn penalties(
    history: &[u32],
    settings: DrySettings,
    breakers: &DryBreakers,
) -> Vec<(u32, f32)> {
    let n = history.len().min(settings.last_n);
    if n <= settings.allowed_length {
        return Vec::new();
    }
    // `recent[i]` is the token `i` places before the newest (`recent[0]` the newest).
    let window = &history[history.len() - n..];
    let recent = |i: usize| window[n - 1 - i];

    // A breaker starting `i` places back (and ending by the newest token) caps repetitions.
    let mut limit = n;
    for i in 0..n {
        let Some(tails) = breakers.by_head.get(&recent(i)) else {
            continue;
        };
        let longest = tails
            .iter()
            .filter(|tail| tail.len() <= i)
            .filter(|tail| {
                tail.iter()
                    .enumerate()
                    .all(|(k, &t)| recent(i - k - 1) == t)
            })
            .map(Vec::len)
            .max();
        if let Some(longest) = longest {
            limit = i - longest;
            break;
        }
    }
    if limit < settings.allowed_length {
        return Vec::new();
    }

    // z[k]: how many tokens ending `k` places back match the newest tokens (the Z-function of
    // the reversed window), capped at the limit.
    let mut z = vec![0usize; n];
    let (mut left, mut right) = (0usize, 0usize);
    for k in 1..n {
        let mut length = if k < right {
            z[k - left].min(right - k)
        } else {
            0
        };
        while k + length < n && recent(length) == recent(k + length) {
            length += 1;
        }
        if k + length > right {
            left = k;
            right = k + length;
        }
        z[k] = length;
    }

    // The token that followed a repeated run would extend it: it is the one `k - 1` places back.
    let mut longest: HashMap<u32, usize> = HashMap::new();
    for (k, &length) in z.iter().enumerate().skip(1) {
        let length = length.min(limit);
        if length >= settings.allowed_length {
            let entry = longest.entry(recent(k - 1)).or_default();
            *entry = (*entry).max(length);
        }
    }

    // Keeps `base^exponent` finite (llama.cpp's clamp).
    let max_exponent = if settings.base > 1.000_001 {
        (88.722_84 / settings.base.ln()) as usize
    } else {
        0
    };
    longest
        .into_iter()
        .filter(|&(token, _)| !breakers.is_single_token(token))
        .map(|(token, length)| {
            let mut exponent = length - settings.allowed_length;
            if max_exponent > 0 {
                exponent = exponent.min(max_exponent);
            }
            let penalty = settings.multiplier * settings.base.powi(exponent as i32);
            (token, penalty)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(allowed_length: usize) -> DrySettings {
        DrySettings {
            multiplier: 1.0,
            base: 2.0,
            allowed_length,
            last_n: usize::MAX,
        }
    }

    /// The worked example of llama.cpp's comments: context `a b c c b c y a b c` (a=0, b=1, c=2,
    /// y=3). Ending repeats: `a b c` (3) before `c`, `c` (1) before `b`, `b c` (2) before `y`.
    #[test]
    fn the_worked_example_penalises_the_extending_tokens() {
        let history = [0, 1, 2, 2, 1, 2, 3, 0, 1, 2];
        let mut got = penalties(&history, settings(1), &DryBreakers::default());
        got.sort_by_key(|&(t, _)| t);
        // c extends a 3-run: 2^(3-1) = 4; b a 1-run: 2^0 = 1; y a 2-run: 2^1 = 2.
        assert_eq!(got, vec![(1, 1.0), (2, 4.0), (3, 2.0)]);
        // Allowed length 2 lets the 1-run of b pass: c 2^(3-2), y 2^(2-2).
        let mut got = penalties(&history, settings(2), &DryBreakers::default());
        got.sort_by_key(|&(t, _)| t);
        assert_eq!(got, vec![(2, 2.0), (3, 1.0)]);
    }

    /// A breaker caps the run length; a breaker token itself is never penalised.
    #[test]
    fn breakers_cap_runs_and_are_never_penalised() {
        // x y z 9 x y z 9 x y z: token 9 would extend `x y z 9 x y z` (length 7): 2^(7-2).
        let history = [5, 6, 7, 9, 5, 6, 7, 9, 5, 6, 7];
        let got = penalties(&history, settings(2), &DryBreakers::default());
        assert_eq!(got, vec![(9, 32.0)]);
        // With 9 a breaker, the run stops at it (3 long), and 9 itself is spared.
        let breakers = DryBreakers::from_sequences(&[vec![9]]);
        assert!(penalties(&history, settings(2), &breakers).is_empty());
        let breakers = DryBreakers::from_sequences(&[vec![8]]);
        assert_eq!(penalties(&history, settings(2), &breakers), vec![(9, 32.0)]);
        // A breaker inside the newest run (token 6, two places back) limits it to 1 < 2.
        let breakers = DryBreakers::from_sequences(&[vec![6, 7]]);
        assert!(penalties(&history, settings(2), &breakers).is_empty());
    }

    #[test]
    fn breaker_texts_resolve_to_whole_and_overlapping_tokens() {
        let texts: Vec<Vec<u8>> = ["a", "\n", "x\n", "ab", "c:", ":"]
            .iter()
            .map(|t| t.as_bytes().to_vec())
            .collect();
        let tokenize = |s: &str| match s {
            "cd" => vec![7, 8],
            "d" => vec![8],
            _ => vec![99],
        };
        let breakers = resolve_breakers(&["\n".into(), "bcd".into()], &texts, &tokenize);
        assert!(breakers.is_single_token(1) && breakers.is_single_token(2));
        // "ab" ends with "b", the breaker's first byte: head 3, tail tokenize("cd").
        assert_eq!(breakers.by_head.get(&3), Some(&vec![vec![7, 8]]));
        assert!(!breakers.by_head.contains_key(&0) && !breakers.by_head.contains_key(&5));
    }
}
