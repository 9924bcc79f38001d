"""Writes a tiny random Qwen3-Reranker GGUF for scripts/check-rerank and the server suite.

The file has what llama.cpp's convert_hf_to_gguf.py writes for a Qwen3-Reranker (its Qwen3Model
with `is_rerank`): the `qwen3` architecture, `qwen3.pooling_type` RANK, the classifier's output
labels `yes` and `no`, the rerank prompt as `tokenizer.chat_template.rerank`, tied embeddings
(no `output.weight`), and `cls.output.weight`, the embedding rows of "yes" and of "no" stacked
(the converter's `_get_cls_out_tensor`). It is written by llama.cpp's own gguf-py (the pinned
gguf package), with Qwen's real vocabulary: the tokenizer keys of llama.cpp's
models/ggml-vocab-qwen2.gguf, copied. The weights are random (a fixed seed), so only how the
score is computed is compared, not what it means.

    python make_reranker.py VOCAB.gguf OUT.gguf [SEED]
"""

import sys

import numpy as np
import gguf

# The prompt convert_hf_to_gguf.py writes for Qwen3-Reranker (conversion/qwen.py).
RERANK_PROMPT = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer "
    "the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 4, 2, 16, 128


def field_value(field):
    return field.contents()


def main():
    vocab_path, out_path = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    rng = np.random.default_rng(seed)
    vocab = gguf.GGUFReader(vocab_path)
    tokens = field_value(vocab.fields["tokenizer.ggml.tokens"])
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(out_path, "qwen3")
    w.add_name("tiny-qwen3-reranker")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(["yes", "no"])

    w.add_tokenizer_model(field_value(vocab.fields["tokenizer.ggml.model"]))
    w.add_tokenizer_pre(field_value(vocab.fields["tokenizer.ggml.pre"]))
    w.add_token_list(tokens)
    w.add_token_types(field_value(vocab.fields["tokenizer.ggml.token_type"]))
    w.add_token_merges(field_value(vocab.fields["tokenizer.ggml.merges"]))
    for key, add in [
        ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
        ("tokenizer.ggml.padding_token_id", w.add_pad_token_id),
        ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
    ]:
        add(field_value(vocab.fields[key]))
    w.add_add_bos_token(False)
    w.add_chat_template(
        [
            {"name": "default", "template": field_value(vocab.fields["tokenizer.chat_template"])},
            {"name": "rerank", "template": RERANK_PROMPT},
        ]
    )

    def normal(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    embed = normal(n_vocab, HIDDEN)
    w.add_tensor("token_embd.weight", embed)
    yes, no = tokens.index("yes"), tokens.index("no")
    w.add_tensor("cls.output.weight", np.stack([embed[yes], embed[no]]))
    w.add_tensor("output_norm.weight", norm(HIDDEN))
    for layer in range(LAYERS):
        b = f"blk.{layer}."
        w.add_tensor(b + "attn_norm.weight", norm(HIDDEN))
        w.add_tensor(b + "attn_q.weight", normal(HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(b + "attn_k.weight", normal(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(b + "attn_v.weight", normal(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(b + "attn_output.weight", normal(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(b + "attn_q_norm.weight", norm(HEAD_DIM))
        w.add_tensor(b + "attn_k_norm.weight", norm(HEAD_DIM))
        w.add_tensor(b + "ffn_norm.weight", norm(HIDDEN))
        w.add_tensor(b + "ffn_gate.weight", normal(FFN, HIDDEN))
        w.add_tensor(b + "ffn_up.weight", normal(FFN, HIDDEN))
        w.add_tensor(b + "ffn_down.weight", normal(HIDDEN, FFN))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
