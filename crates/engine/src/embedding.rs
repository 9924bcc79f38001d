//! Embeddings: a text's final hidden states (after the model's last norm), pooled into one vector
//! and normalized, as llama-server computes them (`--pooling`, `--embd-normalize`), through the
//! same backend that generates: any loaded model embeds.

/// How the per-token hidden states become the embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The mean over every token (llama-server's default for most models).
    #[default]
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state.
    Last,
    /// No pooling: one vector per token.
    None,
}

impl std::str::FromStr for Pooling {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mean" => Ok(Self::Mean),
            "cls" => Ok(Self::Cls),
            "last" => Ok(Self::Last),
            "none" => Ok(Self::None),
            other => Err(format!("`{other}` is not one of none, mean, cls, last")),
        }
    }
}

/// llama-server's `--embd-normalize`: `-1` none, `0` max absolute value (scaled to int16's
/// range), `1` taxicab, `2` euclidean (the default), `p > 2` the p-norm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize(pub i32);

impl Default for Normalize {
    fn default() -> Self {
        Self(2)
    }
}

impl Normalize {
    /// Normalizes `v` in place, as llama.cpp's `common_embd_normalize` does.
    pub fn apply(self, v: &mut [f32]) {
        let norm: f64 = match self.0 {
            n if n < 0 => return,
            0 => {
                let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                f64::from(max) / 32760.0
            }
            2 => v
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                .sqrt(),
            p => {
                let p = f64::from(p);
                v.iter()
                    .map(|&x| f64::from(x).abs().powf(p))
                    .sum::<f64>()
                    .powf(1.0 / p)
            }
        };
        let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        for x in v.iter_mut() {
            *x = (f64::from(*x) * scale) as f32;
        }
    }
}

/// Pools per-token `states` (`[tokens][hidden]`) into embeddings: one vector, or one per token
/// with [`Pooling::None`]; each normalized.
pub fn pool(states: Vec<Vec<f32>>, pooling: Pooling, normalize: Normalize) -> Vec<Vec<f32>> {
    let mut out = match pooling {
        Pooling::None => states,
        Pooling::Cls => states.into_iter().take(1).collect(),
        Pooling::Last => states.into_iter().last().into_iter().collect(),
        Pooling::Mean => {
            let n = states.len().max(1) as f64;
            let width = states.first().map_or(0, Vec::len);
            let mut sum = vec![0.0f64; width];
            for row in &states {
                for (s, &x) in sum.iter_mut().zip(row) {
                    *s += f64::from(x);
                }
            }
            vec![sum.into_iter().map(|s| (s / n) as f32).collect()]
        }
    };
    for v in &mut out {
        normalize.apply(v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_and_norms() {
        let states = vec![vec![1.0, 2.0], vec![3.0, 6.0]];
        assert_eq!(
            pool(states.clone(), Pooling::Mean, Normalize(-1)),
            [[2.0, 4.0]]
        );
        assert_eq!(
            pool(states.clone(), Pooling::Cls, Normalize(-1)),
            [[1.0, 2.0]]
        );
        assert_eq!(
            pool(states.clone(), Pooling::Last, Normalize(-1)),
            [[3.0, 6.0]]
        );
        assert_eq!(pool(states.clone(), Pooling::None, Normalize(-1)).len(), 2);
        let unit = pool(states.clone(), Pooling::Last, Normalize(2));
        let length: f32 = unit[0].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((length - 1.0).abs() < 1e-6);
        let taxicab = pool(states, Pooling::Cls, Normalize(1));
        assert!((taxicab[0][0] - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!("cls".parse::<Pooling>(), Ok(Pooling::Cls));
        assert!("sum".parse::<Pooling>().is_err());
    }
}
