//! Which decoder layers each rank of a pipeline holds: contiguous ranges, rank 0's first, split
//! so that the ranks hold about as many bytes of weights each (rank 0 also holds the embedding
//! table, the last rank the final norm and an untied output projection), or as the user says.

use std::ops::Range;

use mlxcel_model::Checkpoint;

/// Bytes of weights per decoder layer, and the bytes rank 0 and the last rank hold besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WeightBytes {
    pub(crate) layers: Vec<u64>,
    pub(crate) first_extra: u64,
    pub(crate) last_extra: u64,
}

impl WeightBytes {
    /// Counted from the checkpoint's tensor sizes (nothing is read).
    pub(crate) fn of(checkpoint: &Checkpoint) -> WeightBytes {
        let config = checkpoint.config();
        let mut bytes = WeightBytes {
            layers: vec![0; config.num_hidden_layers],
            first_extra: 0,
            last_extra: 0,
        };
        for tensor in checkpoint.tensor_infos() {
            let size = tensor.byte_len as u64;
            let layer = tensor
                .name
                .strip_prefix("model.layers.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|index| index.parse::<usize>().ok());
            match layer {
                Some(i) if i < bytes.layers.len() => bytes.layers[i] += size,
                _ if tensor.name.starts_with("model.embed_tokens.") => bytes.first_extra += size,
                _ if tensor.name.starts_with("lm_head.") || tensor.name == "model.norm.weight" => {
                    bytes.last_extra += size
                }
                _ => {}
            }
        }
        bytes
    }
}

/// Ends of `ranks` contiguous, non-empty ranges of the layers (`ends[r]` is one past rank `r`'s
/// last layer) that make the largest rank's bytes as small as they can be.
pub(crate) fn split_by_bytes(bytes: &WeightBytes, ranks: usize) -> Result<Vec<usize>, String> {
    let n = bytes.layers.len();
    if ranks == 0 || ranks > n {
        return Err(format!(
            "{n} decoder layers cannot be split over {ranks} ranks: each rank needs at least one"
        ));
    }
    let mut prefix = vec![0u64; n + 1];
    for (i, &b) in bytes.layers.iter().enumerate() {
        prefix[i + 1] = prefix[i] + b;
    }
    let cost = |r: usize, from: usize, to: usize| {
        let mut c = prefix[to] - prefix[from];
        if r == 0 {
            c += bytes.first_extra;
        }
        if r + 1 == ranks {
            c += bytes.last_extra;
        }
        c
    };
    // best[r][i]: the smallest largest-rank bytes with ranks 0..=r holding layers 0..i.
    let mut best = vec![vec![u64::MAX; n + 1]; ranks];
    let mut from = vec![vec![0usize; n + 1]; ranks];
    for (i, slot) in best[0].iter_mut().enumerate().skip(1) {
        *slot = cost(0, 0, i);
    }
    for r in 1..ranks {
        for i in (r + 1)..=n {
            for j in r..i {
                if best[r - 1][j] == u64::MAX {
                    continue;
                }
                let c = best[r - 1][j].max(cost(r, j, i));
                if c < best[r][i] {
                    best[r][i] = c;
                    from[r][i] = j;
                }
            }
        }
    }
    let mut ends = vec![0; ranks];
    let mut end = n;
    for r in (0..ranks).rev() {
        ends[r] = end;
        end = from[r][end];
    }
    Ok(ends)
}

/// Ends of the ranges `counts` layers long, in rank order (`--pipeline-layers`).
pub(crate) fn split_by_counts(
    counts: &[usize],
    layers: usize,
    ranks: usize,
) -> Result<Vec<usize>, String> {
    if counts.len() != ranks {
        return Err(format!(
            "--pipeline-layers gives {} counts for {ranks} ranks: give one per rank, rank 0's first",
            counts.len()
        ));
    }
    if counts.contains(&0) || counts.iter().sum::<usize>() != layers {
        return Err(format!(
            "--pipeline-layers {counts:?} must be positive and add up to the model's {layers} \
             decoder layers"
        ));
    }
    Ok(counts
        .iter()
        .scan(0, |end, &c| {
            *end += c;
            Some(*end)
        })
        .collect())
}

/// The sequences of a step (`tokens[i]`: sequence `i`'s new tokens) in at most `parts`
/// contiguous, non-empty micro-batches of about as many tokens each, in order.
pub(crate) fn split_micro_batches(tokens: &[usize], parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, tokens.len().max(1));
    let total: usize = tokens.iter().sum();
    let mut ranges = Vec::with_capacity(parts);
    let (mut start, mut sum) = (0, 0);
    for (i, &n) in tokens.iter().enumerate() {
        sum += n;
        let left = parts - ranges.len() - 1;
        // Cut once this part holds its share of the tokens, keeping a sequence for each part
        // still to come.
        let due = sum * parts >= total * (ranges.len() + 1);
        if left > 0 && (due || tokens.len() - i - 1 == left) {
            ranges.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < tokens.len() {
        ranges.push(start..tokens.len());
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_split_balances_the_largest_rank_and_counts_the_ends() {
        let even = WeightBytes {
            layers: vec![10; 30],
            first_extra: 0,
            last_extra: 0,
        };
        assert_eq!(split_by_bytes(&even, 2).unwrap(), [15, 30]);
        assert_eq!(split_by_bytes(&even, 3).unwrap(), [10, 20, 30]);
        // A large embedding table on rank 0 moves layers to the others.
        let table = WeightBytes {
            first_extra: 100,
            ..even.clone()
        };
        let ends = split_by_bytes(&table, 2).unwrap();
        assert_eq!(ends, [10, 30]);
        let head = WeightBytes {
            last_extra: 100,
            ..even
        };
        assert_eq!(split_by_bytes(&head, 2).unwrap(), [20, 30]);
        assert!(
            split_by_bytes(&head, 31)
                .unwrap_err()
                .contains("at least one")
        );
    }

    #[test]
    fn counts_split_in_rank_order_and_must_cover_every_layer() {
        assert_eq!(split_by_counts(&[4, 26], 30, 2).unwrap(), [4, 30]);
        assert!(
            split_by_counts(&[4, 26], 30, 3)
                .unwrap_err()
                .contains("one per rank")
        );
        assert!(
            split_by_counts(&[4, 25], 30, 2)
                .unwrap_err()
                .contains("add up")
        );
        assert!(
            split_by_counts(&[0, 30], 30, 2)
                .unwrap_err()
                .contains("positive")
        );
    }

    #[test]
    fn micro_batches_are_contiguous_and_hold_about_as_many_tokens() {
        assert_eq!(split_micro_batches(&[1; 8], 2), [0..4, 4..8]);
        assert_eq!(split_micro_batches(&[1; 8], 3), [0..3, 3..6, 6..8]);
        assert_eq!(
            split_micro_batches(&[1; 3], 1),
            [Range { start: 0, end: 3 }]
        );
        // More parts than sequences: one sequence each.
        assert_eq!(split_micro_batches(&[1, 1], 4), [0..1, 1..2]);
        assert_eq!(split_micro_batches(&[7], 2), [Range { start: 0, end: 1 }]);
        // A long prefill chunk is a part of its own; the decode tokens share the other.
        assert_eq!(split_micro_batches(&[64, 1, 1, 1], 2), [0..1, 1..4]);
        assert_eq!(split_micro_batches(&[1, 1, 1, 64], 2), [0..3, 3..4]);
        assert!(split_micro_batches(&[], 2).is_empty());
        for parts in 1..6 {
            let tokens = [3, 1, 4, 1, 5, 9, 2, 6];
            let ranges = split_micro_batches(&tokens, parts);
            assert_eq!(ranges.len(), parts);
            assert_eq!(ranges.first().unwrap().start, 0);
            assert_eq!(ranges.last().unwrap().end, tokens.len());
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
            assert!(ranges.iter().all(|r| !r.is_empty()));
        }
    }
}
