//! The sliding window's attention mask on the per-op graph's MLX attention.

use crate::array::Array;
use crate::error::Result;

/// The additive mask (`0` keeps, `-inf` drops) of `n` queries at positions `position..` over the
/// `position + n` keys of their cache, causal and within a sliding `window`.
pub(super) fn window_mask(position: usize, n: usize, window: usize) -> Result<Array> {
    let keys = position + n;
    let mut mask = vec![f32::NEG_INFINITY; n * keys];
    for i in 0..n {
        let query = position + i;
        let first = (query + 1).saturating_sub(window);
        mask[i * keys + first..=i * keys + query].fill(0.0);
    }
    Array::from_f32(&mask, &[n as i32, keys as i32])
}
