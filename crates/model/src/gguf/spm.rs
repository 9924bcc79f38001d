//! `tokenizer.json` for SentencePiece BPE vocabularies (`tokenizer.ggml.model = llama`: Llama 2,
//! Mistral, TinyLlama), the way Hugging Face's `LlamaConverter` builds it.
//!
//! GGUF stores pieces with scores but no merges. As in Hugging Face's `SentencePieceExtractor`,
//! every split of a piece into two pieces of the vocabulary becomes a merge ranked by the piece's
//! score, so BPE merges the highest-scoring piece first, as SentencePiece (and llama.cpp) do.
//! Unknown characters fall back to the `<0xXX>` byte pieces.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::gguf::vocab::{GgufVocab, TokenType};

pub(crate) fn tokenizer_json(vocab: &GgufVocab) -> Value {
    let (pieces, added) = vocab.vocab_and_added_tokens();
    let unk = vocab.unk.map(|id| vocab.tokens[id as usize].clone());
    let mut normalizers = Vec::new();
    if vocab.add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if vocab.add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": vocab.bos_template(),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": pieces, "merges": merges(vocab),
        }
    })
}

/// Merges `[left, right]`, highest-scoring result first; ties keep vocabulary order.
fn merges(vocab: &GgufVocab) -> Vec<[String; 2]> {
    let mergeable = |id: usize| vocab.token_types[id] == TokenType::Normal;
    let ids: HashMap<&str, usize> = vocab
        .tokens
        .iter()
        .enumerate()
        .filter(|&(id, _)| mergeable(id))
        .map(|(id, t)| (t.as_str(), id))
        .rev() // The first id wins for duplicate pieces.
        .collect();
    let mut ranked: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, piece) in vocab.tokens.iter().enumerate() {
        if !mergeable(id) || vocab.token_types[id] == TokenType::Byte {
            continue;
        }
        let mut local = Vec::new();
        for (split, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(split);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                local.push((vocab.scores[id], l, r, id));
            }
        }
        local.sort_by_key(|&(_, l, r, _)| (l, r));
        ranked.extend(local);
    }
    // A stable sort by score, descending, as Python's `sorted(..., reverse=True)`.
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranked
        .into_iter()
        .map(|(_, l, r, _)| [vocab.tokens[l].clone(), vocab.tokens[r].clone()])
        .collect()
}
