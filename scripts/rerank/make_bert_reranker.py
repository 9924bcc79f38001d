"""Writes a tiny random BERT cross-encoder GGUF for scripts/check-rerank-bert.

The file has what llama.cpp's convert_hf_to_gguf.py writes for a BertForSequenceClassification
with one label (conversion/bert.py): the `bert` architecture, rank pooling, token types, the
post-norm layers with their biases, and the classifier as `cls.output` (with a `cls` dense layer
before it when asked, as for a RoBERTa-style head). The vocabulary is BERT's real WordPiece one:
the tokens of llama.cpp's models/ggml-vocab-bert-bge.gguf, copied, with the special tokens and
flags gguf-py's SpecialVocab derives from an uncased BERT tokenizer.json ([CLS] $A [SEP] and
[CLS] $A [SEP] $B [SEP]: BOS added, [SEP] the EOS and added, no separate SEP; lowercase, accents
stripped). The weights are random (a fixed seed), written by llama.cpp's own gguf-py.

    python make_bert_reranker.py VOCAB.gguf OUT.gguf [SEED [TYPE [POOLER]]]

TYPE is f32 (default), f16 or q8_0 for the matrices; POOLER 1 adds the `cls` layer.
"""

import sys

import numpy as np
import gguf

HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 64, 2, 4, 128, 512


def main():
    vocab_path, out_path = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    matrix_type = sys.argv[4] if len(sys.argv) > 4 else "f32"
    pooler = len(sys.argv) > 5 and sys.argv[5] == "1"
    rng = np.random.default_rng(seed)
    vocab = gguf.GGUFReader(vocab_path)
    tokens = vocab.fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(out_path, "bert")
    w.add_name("tiny-bert-reranker")
    w.add_block_count(LAYERS)
    w.add_context_length(POSITIONS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[matrix_type]
    w.add_file_type(file_type)
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre(vocab.fields["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens)
    w.add_token_types(vocab.fields["tokenizer.ggml.token_type"].contents())
    w.add_unk_token_id(100)
    w.add_sep_token_id(102)
    w.add_pad_token_id(0)
    # The keys of newer gguf-py writers, spelled out for the pinned one.
    w.add_uint32("tokenizer.ggml.cls_token_id", 101)
    w.add_mask_token_id(103)
    w.add_eos_token_id(102)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", True)

    def normal(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    def matrix(name, rows, cols):
        values = normal(rows, cols)
        if matrix_type == "f16":
            w.add_tensor(name, values.astype(np.float16))
        elif matrix_type == "q8_0":
            q = gguf.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, values)

    w.add_tensor("token_embd.weight", normal(n_vocab, HIDDEN))
    w.add_tensor("token_types.weight", normal(2, HIDDEN))
    w.add_tensor("position_embd.weight", normal(POSITIONS, HIDDEN))
    w.add_tensor("token_embd_norm.weight", norm(HIDDEN))
    w.add_tensor("token_embd_norm.bias", normal(HIDDEN))
    for layer in range(LAYERS):
        b = f"blk.{layer}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            matrix(b + part + ".weight", HIDDEN, HIDDEN)
            w.add_tensor(b + part + ".bias", normal(HIDDEN))
        w.add_tensor(b + "attn_output_norm.weight", norm(HIDDEN))
        w.add_tensor(b + "attn_output_norm.bias", normal(HIDDEN))
        matrix(b + "ffn_up.weight", FFN, HIDDEN)
        w.add_tensor(b + "ffn_up.bias", normal(FFN))
        matrix(b + "ffn_down.weight", HIDDEN, FFN)
        w.add_tensor(b + "ffn_down.bias", normal(HIDDEN))
        w.add_tensor(b + "layer_output_norm.weight", norm(HIDDEN))
        w.add_tensor(b + "layer_output_norm.bias", normal(HIDDEN))
    if pooler:
        matrix("cls.weight", HIDDEN, HIDDEN)
        w.add_tensor("cls.bias", normal(HIDDEN))
    w.add_tensor("cls.output.weight", normal(1, HIDDEN, scale=1.0))
    w.add_tensor("cls.output.bias", normal(1))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
