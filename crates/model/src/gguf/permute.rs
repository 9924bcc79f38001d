//! llama.cpp's q/k row permutation.
//!
//! `convert_hf_to_gguf.py` reorders the rows of each head of `q_proj` and `k_proj` so that its RoPE
//! can rotate adjacent pairs: within a head of `head_dim` rows, Hugging Face row `s * head_dim/2 + i`
//! (half `s`, index `i`) becomes GGUF row `2 i + s`. Undoing it gives a plain Hugging Face llama.

/// The GGUF row that holds Hugging Face row `hf_row`.
pub fn gguf_row_of_hf_row(hf_row: usize, head_dim: usize) -> usize {
    let (head, r) = (hf_row / head_dim, hf_row % head_dim);
    let half = head_dim / 2;
    let (s, i) = (r / half, r % half);
    head * head_dim + 2 * i + s
}

/// Reorders whole rows of `data` (`rows` rows of equal byte length) from GGUF to Hugging Face order.
/// Rows may be quantized: a block never spans rows, so rows move as opaque byte strings.
pub fn unpermute_rows(data: &[u8], rows: usize, head_dim: usize) -> Vec<u8> {
    reorder(data, rows, |hf_row| gguf_row_of_hf_row(hf_row, head_dim))
}

/// The inverse of [`unpermute_rows`]: Hugging Face order to GGUF order (what llama.cpp writes).
pub fn permute_rows(data: &[u8], rows: usize, head_dim: usize) -> Vec<u8> {
    let mut inverse = vec![0; rows];
    for hf_row in 0..rows {
        inverse[gguf_row_of_hf_row(hf_row, head_dim)] = hf_row;
    }
    reorder(data, rows, |gguf_row| inverse[gguf_row])
}

/// Row `r` of the output is row `source(r)` of the input.
fn reorder(data: &[u8], rows: usize, source: impl Fn(usize) -> usize) -> Vec<u8> {
    let Some(row_len) = data.len().checked_div(rows) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        let from = source(r) * row_len;
        out.extend_from_slice(&data[from..from + row_len]);
    }
    out
}
