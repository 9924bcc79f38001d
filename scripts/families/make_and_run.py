"""The mlx-lm side of scripts/check-families (run inside its pinned venv).

    make_and_run.py make OUT_DIR [FAMILY...]      build each variant's checkpoint, oracle.json and
                                                  prompt (ids, comma-separated) under
                                                  OUT_DIR/<variant>/; print the variants
    make_and_run.py compare DIR BACKEND TOLERANCE  compare DIR/ours-BACKEND.json with
                                                  DIR/oracle.json; print one line, exit 1 on failure
    make_and_run.py bench OUT_DIR [FAMILY...]     build one ~50 M-parameter 4-bit model per family,
                                                  all at the same shape, under OUT_DIR/<family>/
                                                  (for scripts/bench-families; no oracle)

A variant is a tiny random model of one family built with mlx-lm's own classes
(`mlx_lm.models.<module>.Model(ModelArgs(...))`), every feature of the family switched on, saved as
mlx-lm saves a model (config.json in Hugging Face's keys, `model.safetensors` with mlx-lm's tensor
names, metadata `format: mlx`), loaded back the way `mlx_lm.utils.load_model` does, and run: a
24-token prefill (longer where a variant says) through mlx-lm's KV caches (`make_prompt_cache`), then 8 greedy decode steps.
oracle.json holds the 9 last-position logit vectors (f32) and the 9 greedy tokens.

Only the model modules are imported, never the `mlx_lm` package itself: its `__init__` pulls in
transformers for the tokenizer, which the oracle does not need (we feed token ids).
"""

import importlib
import importlib.util
import json
import math
import os
import sys
import types

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten


def mlx_lm_module(name):
    """`mlx_lm.<name>` without running `mlx_lm/__init__.py` (which imports transformers)."""
    if "mlx_lm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")
        package = types.ModuleType("mlx_lm")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mlx_lm"] = package
    return importlib.import_module(f"mlx_lm.{name}")


# mlx-lm runs some Hugging Face model types with another family's module (its MODEL_REMAPPING).
MODULE_OF_MODEL_TYPE = {"mistral": "llama"}

PROMPT_LEN = 24
DECODE_STEPS = 8
VOCAB = 384
BOS, EOS = 257, 256
# Keys written as null when a family's checkpoints carry them so (e.g. `sliding_window: null`);
# other None values are left out of config.json.
NULLABLE = {"rope_scaling", "sliding_window", "final_logit_softcapping", "attn_logit_softcapping"}


def prompt_tokens(length=PROMPT_LEN):
    """`length` (24 unless a variant says) deterministic, irregular byte-range ids (a linear
    congruential sequence)."""
    x, ids = 20261201, []
    for _ in range(length):
        x = (x * 1103515245 + 12345) % 2**31
        ids.append(x % 256)
    return ids


def base_config(**overrides):
    config = {
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": VOCAB,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "torch_dtype": "float32",
    }
    config.update(overrides)
    return config


def llama_config(**overrides):
    # Llama 3.1's rope scaling, with an original window short enough (64) that the 32 positions
    # here rotate differently with and without it: a period of 4.4k is stretched 8x, one of 33
    # interpolated.
    return base_config(**{
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "attention_bias": True,
        **overrides,
    })


def qwen2_config(**overrides):
    # As Qwen2.5's checkpoints say: a sliding window that is not used (use_sliding_window false).
    return base_config(**{
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": 2,
        **overrides,
    })


def lfm2_config(**overrides):
    return base_config(**{
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "num_hidden_layers": 4,
        "layer_types": ["conv", "full_attention"] * 2,
        "rms_norm_eps": None,
        "norm_eps": 1e-5,
        "tie_word_embeddings": None,
        "tie_embedding": True,
        "rope_theta": 1000000.0,
        "conv_L_cache": 3,
        "conv_bias": False,
        "block_dim": 64,
        "block_ff_dim": 200,
        "block_multiple_of": 32,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True,
        **overrides,
    })


def gemma4_config(**overrides):
    """The gemma4_text variant's config (below), with `overrides`."""
    return base_config(**{
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "num_hidden_layers": 4, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "rope_theta": None, "global_head_dim": 16,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": VOCAB,
        "num_kv_shared_layers": 0, "attention_k_eq_v": False, "enable_moe_block": False,
        "use_double_wide_mlp": False, "sliding_window": 8, "final_logit_softcapping": 2.0,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        **overrides,
    })


def variants():
    """Every variant: (name, family, config, options). `quantize` is (group_size, bits)."""
    return [
        ("llama", "llama", llama_config(), {}),
        ("llama-q4", "llama", llama_config(attention_bias=False, tie_word_embeddings=True),
         {"quantize": (32, 4)}),
        ("qwen2", "qwen2", qwen2_config(), {}),
        ("qwen2-q4", "qwen2", qwen2_config(tie_word_embeddings=False), {"quantize": (64, 4)}),
        # head_dim 32 is not hidden / heads (16), as in Qwen3's checkpoints.
        ("qwen3", "qwen3", base_config(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32,
            rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
            sliding_window=None, max_window_layers=3), {}),
        ("qwen3-q4", "qwen3", base_config(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32,
            rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
            sliding_window=None, max_window_layers=3), {"quantize": (32, 4)}),
        # Every layer slides (window 8 < the 24-token prompt), as Hugging Face's Mistral does.
        ("mistral", "mistral", base_config(
            architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=8),
         {"every_layer_slides": True}),
        # NoPE on every second layer (interval 2; SmolLM3-3B has 4), listed explicitly too.
        ("smollm3", "smollm3", base_config(
            architectures=["SmolLM3ForCausalLM"], model_type="smollm3", num_hidden_layers=4,
            rope_theta=5000000.0, tie_word_embeddings=True, no_rope_layer_interval=2,
            no_rope_layers=[1, 0, 1, 0], use_sliding_window=False, sliding_window=None,
            layer_types=["full_attention"] * 4), {}),
        # Soft-capping low enough to bend these tiny models' scores and logits (Gemma 2 has 50 and
        # 30); query_pre_attn_scalar differs from head_dim; the window (mlx-lm has none for
        # Gemma 2) longer than the 32 positions here, so that it cannot matter.
        ("gemma2", "gemma2", base_config(
            architectures=["Gemma2ForCausalLM"], model_type="gemma2", num_hidden_layers=4,
            hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6, tie_word_embeddings=True, query_pre_attn_scalar=24,
            attn_logit_softcapping=5.0, final_logit_softcapping=2.0, sliding_window=4096,
            layer_types=["sliding_attention", "full_attention"] * 2,
            cache_implementation="hybrid"), {"norm_neutral": 0.0, "embedding_std": 0.05}),
        # Local layers 0, 1, 3 (window 8, local RoPE base), global layer 2 (linear RoPE scaling x8
        # as Gemma 3 4B+), q/k norms, embeddings scaled by sqrt(64) = 8 (exact in bf16, which
        # mlx-lm rounds the scale to).
        ("gemma3_text", "gemma3_text", base_config(
            architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=4,
            hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6, tie_word_embeddings=True, query_pre_attn_scalar=24,
            rope_theta=1000000.0, rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=8,
            sliding_window_pattern=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
            final_logit_softcapping=None, attn_logit_softcapping=None),
         {"norm_neutral": 0.0, "embedding_std": 0.05}),
        # Fused qkv_proj and gate_up_proj; partial rotary (12 of 16 dims, as Phi-4-mini's 0.75);
        # LongRoPE over 131072 / 4096 positions (attention factor sqrt(1 + ln 32 / ln 4096)).
        # mlx-lm always rotates with long_factor where Hugging Face picks short_factor below
        # 4096 positions, so the two lists are equal here (and not all ones).
        ("phi3", "phi3", base_config(
            architectures=["Phi3ForCausalLM"], model_type="phi3", head_dim=None,
            max_position_embeddings=131072, original_max_position_embeddings=4096,
            partial_rotary_factor=0.75, sliding_window=262144,
            rope_scaling={"type": "longrope",
                          "short_factor": [1.0, 1.25, 1.6, 2.5, 4.0, 6.5],
                          "long_factor": [1.0, 1.25, 1.6, 2.5, 4.0, 6.5]}), {}),
        # Mixtures of experts: 8 experts, saved the way mlx-lm saves them (stacked `switch_mlp`
        # tensors, which mlxcel reads as per-expert views). The OpenXLA backend refuses them by
        # name, and scripts/check-families accepts exactly that refusal there.
        # Qwen3-MoE: top-2 renormalised (`norm_topk_prob`), layer 2 dense (`mlp_only_layers`).
        ("qwen3_moe", "qwen3_moe", base_config(
            architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_hidden_layers=4,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[2],
            rope_theta=1000000.0), {}),
        # 4-bit, top-4 not renormalised; mlx-lm's quantization covers the router and the stacked
        # experts alike.
        ("qwen3_moe-q4", "qwen3_moe", base_config(
            architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=8,
            num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=False,
            decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1000000.0),
         {"quantize": (32, 4)}),
        # Mixtral: the softmax of the top-2 router logits; experts of `intermediate_size`.
        ("mixtral", "mixtral", base_config(
            architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=8,
            num_experts_per_tok=2, intermediate_size=48, rope_theta=1000000.0,
            sliding_window=None), {}),
        # OLMoE: one q norm over all heads and one k norm, biases on q/k/v/o, top-4 renormalised.
        ("olmoe", "olmoe", base_config(
            architectures=["OlmoeForCausalLM"], model_type="olmoe", num_experts=8,
            num_experts_per_tok=4, intermediate_size=32, norm_topk_prob=True, clip_qkv=None,
            attention_bias=True), {}),
        # Qwen2-MoE: q/k/v biases, top-4 not renormalised (mlx-lm never renormalises it), and a
        # shared expert behind its sigmoid gate.
        ("qwen2_moe", "qwen2_moe", base_config(
            architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_experts=8,
            num_experts_per_tok=4, moe_intermediate_size=32, shared_expert_intermediate_size=96,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
            use_sliding_window=False, sliding_window=32768, max_window_layers=3,
            rope_theta=1000000.0), {}),
        # Gated-DeltaNet hybrids: linear attention on layers 0 and 2 (full_attention_interval 2),
        # gated softmax attention with q/k norms and partial RoPE (half of each head) on 1 and 3;
        # a 100-token prompt, so that the chunked delta rule (chunks of 64) crosses a chunk. The
        # OpenXLA backend refuses them by name.
        # Qwen3-Next: fused, key-head-grouped projections (in_proj_qkvz, in_proj_ba); routed
        # experts (top-2 of 4, renormalised) with a gated shared expert, layer 1 dense.
        ("qwen3_next", "qwen3_next", base_config(
            architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", num_hidden_layers=4,
            full_attention_interval=2, partial_rotary_factor=0.5, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[1], rms_norm_eps=1e-6),
         {"prompt_len": 100}),
        # Qwen3.5 (dense): split projections; RoPE from rope_parameters.
        ("qwen3_5", "qwen3_5", base_config(
            architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5", num_hidden_layers=4,
            full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
            rms_norm_eps=1e-6, rope_theta=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]}),
         {"prompt_len": 100}),
        # 4-bit groups of 32: every projection quantized (the convolution stays dense), untied.
        ("qwen3_5-q4", "qwen3_5", base_config(
            architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5", num_hidden_layers=4,
            full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
            rms_norm_eps=1e-6, rope_theta=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}),
         {"prompt_len": 100, "quantize": (32, 4)}),
        # Qwen3.5-MoE: every layer routed (top-2 of 4, renormalised) beside a gated shared expert.
        ("qwen3_5_moe", "qwen3_5_moe", base_config(
            architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe",
            num_hidden_layers=4, full_attention_interval=2, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
            rms_norm_eps=1e-6, rope_theta=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}),
         {"prompt_len": 100}),
        # 4-bit groups of 32: the routed experts, the shared expert and every projection
        # quantized, so that the linear-attention layers' MoE MLPs run the fused routed-expert
        # node as the attention layers' do.
        ("qwen3_5_moe-q4", "qwen3_5_moe", base_config(
            architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe",
            num_hidden_layers=4, full_attention_interval=2, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
            rms_norm_eps=1e-6, rope_theta=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}),
         {"prompt_len": 100, "quantize": (32, 4)}),
        # LFM2: short-convolution layers (3 taps) at 0 and 2, attention with per-head q/k norms
        # at 1 and 3 (`layer_types`), LFM2's own keys (`norm_eps`, `tie_embedding`), and the MLP
        # sized from block_ff_dim 200 (two thirds, 133, rounded up to block_multiple_of 32: 160).
        # The OpenXLA backend refuses it by name.
        ("lfm2", "lfm2", lfm2_config(), {}),
        # 4-bit groups of 32: every projection quantized (the convolution's taps stay dense).
        ("lfm2-q4", "lfm2", lfm2_config(), {"quantize": (32, 4)}),
        # LFM2-MoE: layer 0 dense (num_dense_layers 1), the others routed: top-2 of 4 by sigmoid
        # scores, picked with a random expert bias, renormalised; layers placed by full_attn_idxs.
        ("lfm2_moe", "lfm2_moe", lfm2_config(
            architectures=["Lfm2MoeForCausalLM"], model_type="lfm2_moe", layer_types=None,
            full_attn_idxs=[1, 3], intermediate_size=96, block_ff_dim=None, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, num_dense_layers=1,
            norm_topk_prob=True, use_expert_bias=True, routed_scaling_factor=1.0), {}),
        # gpt-oss: a sink logit per head, biases on q/k/v/o, the router and every expert's three
        # projections; layers 0 and 2 sliding (window 8 < the 24-token prompt); YaRN x4 over an
        # original window of 16 (so that 32 positions feel it; `truncate: true` because mlx-lm
        # always rounds the band's edges); top-4 of 8 by the softmax of the top-k logits; the
        # clamped SwiGLU at mlx-lm's fixed limit 7, with the experts' gate and up weights scaled
        # up so that a quarter of their outputs pass the clamp.
        ("gpt_oss", "gpt_oss", base_config(
            architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_hidden_layers=4,
            num_local_experts=8, num_experts_per_tok=4, experts_per_token=4,
            intermediate_size=32, attention_bias=True, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2, rope_theta=150000.0,
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                          "beta_slow": 1.0, "original_max_position_embeddings": 16,
                          "truncate": True},
            swiglu_limit=7.0), {"expert_gain": 3.0, "seed": 16}),
        # The same, 4-bit groups of 32 (the router and every projection quantized; the biases and
        # sinks stay f32): the fused decoder-layer node's path (o's bias, the routed experts'
        # biases, router bias and clamped SwiGLU inside the layer node).
        ("gpt_oss-q4", "gpt_oss", base_config(
            architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_hidden_layers=4,
            num_local_experts=8, num_experts_per_tok=4, experts_per_token=4,
            intermediate_size=32, attention_bias=True, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2, rope_theta=150000.0,
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                          "beta_slow": 1.0, "original_max_position_embeddings": 16,
                          "truncate": True},
            swiglu_limit=7.0), {"expert_gain": 3.0, "seed": 16, "quantize": (32, 4)}),
        # A reported Gemma 3 case: every other layer sliding (`sliding_window_pattern: 2`, no
        # `layer_types`), the window longer than the text, query_pre_attn_scalar = head_dim, no
        # rope_scaling, and no `tie_word_embeddings` key over a checkpoint that stores its own
        # `lm_head` (as mlx-lm's gemma3_text saves it unless told to tie). transformers' default
        # ties, but both it (when the two tensors differ) and mlx-lm use the stored lm_head;
        # mlxcel used the embeddings until it did the same.
        ("gemma3_text-untied", "gemma3_text", base_config(
            architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=4,
            hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6, tie_word_embeddings=None, query_pre_attn_scalar=16,
            rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=512,
            sliding_window_pattern=2, final_logit_softcapping=None,
            attn_logit_softcapping=None),
         {"norm_neutral": 0.0, "embedding_std": 0.05, "seed": 16}),
        # Gemma 4 (text) without what mlxcel refuses (per-layer inputs, shared KV layers, a
        # larger head on the full layers, keys as values, experts): plain-weight norms, v norm,
        # attention scale 1, layer scalars, RoPE per layer type (sliding: base 1e4; full:
        # proportional, 2 of 8 pairs rotating, base 1e6), a window (8) shorter than the text,
        # final soft-capping low enough to bend these logits.
        ("gemma4_text", "gemma4_text", base_config(
            architectures=["Gemma4ForCausalLM"], model_type="gemma4_text", num_hidden_layers=4,
            hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=None, global_head_dim=16,
            hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB,
            num_kv_shared_layers=0, attention_k_eq_v=False, enable_moe_block=False,
            use_double_wide_mlp=False, sliding_window=8, final_logit_softcapping=2.0,
            layer_types=["sliding_attention", "full_attention"] * 2,
            rope_parameters={
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
         {"embedding_std": 0.05, "seed": 17}),
        # The hybrids in the form llama.cpp can hold (scripts/check-families-gguf): its qwen35,
        # qwen35moe and qwen3next graphs take value heads of the key heads' size (a square
        # state) and route every layer, so these have key and value heads of 16 and no dense
        # layers; more value heads than key heads, so that qwen35's tiled order is exercised.
        ("qwen3_next-square", "qwen3_next", base_config(
            architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", num_hidden_layers=4,
            full_attention_interval=2, partial_rotary_factor=0.5, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6),
         {"prompt_len": 100}),
        ("qwen3_5-square", "qwen3_5", base_config(
            architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5", num_hidden_layers=4,
            full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
            rms_norm_eps=1e-6, rope_theta=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}),
         {"prompt_len": 100}),
        ("qwen3_5_moe-square", "qwen3_5_moe", base_config(
            architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe",
            num_hidden_layers=4, full_attention_interval=2, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
            rms_norm_eps=1e-6, rope_theta=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}),
         {"prompt_len": 100, "seed": 41}),
        # OLMoE as llama.cpp's olmoe holds it (OLMoE-1B-7B's form): its k norm is the hidden
        # size wide, so as many key/value heads as query heads; no attention biases; the top-k
        # weights not renormalised.
        ("olmoe-mha", "olmoe", base_config(
            architectures=["OlmoeForCausalLM"], model_type="olmoe", num_experts=8,
            num_experts_per_tok=4, intermediate_size=32, norm_topk_prob=False, clip_qkv=None,
            attention_bias=False, num_key_value_heads=4), {}),
        # The same in 4-bit groups of 32: the fused decoder-layer node's path (q/k norms over the
        # whole projections inside the layer node), and a GGUF form llama.cpp can hold.
        ("olmoe-mha-q4", "olmoe", base_config(
            architectures=["OlmoeForCausalLM"], model_type="olmoe", num_experts=8,
            num_experts_per_tok=4, intermediate_size=32, norm_topk_prob=False, clip_qkv=None,
            attention_bias=False, num_key_value_heads=4), {"quantize": (32, 4)}),
        # (Variants are added at the end: a variant's place is its seed unless it pins one.)
        # Gemma 4 as its released models are built: the full layers' head (32) twice the
        # sliding layers' (16), proportional RoPE over it (4 of 16 pairs rotate), and the rest
        # of the gemma4_text variant above.
        ("gemma4_text-global", "gemma4_text", gemma4_config(global_head_dim=32),
         {"embedding_std": 0.05, "seed": 17}),
        # Per-layer token inputs (8 per layer and token), as Gemma 4 E2B and E4B have them.
        ("gemma4_text-per-layer", "gemma4_text", gemma4_config(
            hidden_size_per_layer_input=8), {"embedding_std": 0.05, "seed": 17}),
        # Six layers, the last two reusing the keys and values of layers 2 (sliding) and 3
        # (full), with twice as wide an MLP there (`use_double_wide_mlp`).
        ("gemma4_text-shared", "gemma4_text", gemma4_config(
            num_hidden_layers=6, num_kv_shared_layers=2, use_double_wide_mlp=True,
            layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                         "full_attention", "sliding_attention", "full_attention"]),
         {"embedding_std": 0.05, "seed": 17}),
        # The 31B's form: the full layers' keys are their values (no v_proj; the v norm over
        # the unnormed, unrotated k projection) with one key/value head where the sliding
        # layers have two (`num_global_key_value_heads`), and their head of 32.
        ("gemma4_text-k-eq-v", "gemma4_text", gemma4_config(
            global_head_dim=32, attention_k_eq_v=True, num_global_key_value_heads=1),
         {"embedding_std": 0.05, "seed": 17}),
        # E2B's form: all three at once, in 4-bit groups of 32 (the per-layer table and
        # projection quantized too).
        ("gemma4_text-e2b-q4", "gemma4_text", gemma4_config(
            global_head_dim=32, hidden_size_per_layer_input=8, num_hidden_layers=6,
            num_kv_shared_layers=2, use_double_wide_mlp=True,
            layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                         "full_attention", "sliding_attention", "full_attention"]),
         {"embedding_std": 0.05, "seed": 18, "quantize": (32, 4)}),
        # The 26B-A4B's block (`enable_moe_block`): four experts of 32, two per token, beside
        # the dense MLP, each side with its own norms; the router's input norm and scale and
        # its per-expert scales (randomized near 1 below, so that each matters).
        ("gemma4_text-moe", "gemma4_text", gemma4_config(
            enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32),
         {"embedding_std": 0.05, "seed": 17}),
    ]


def model_type_module(config):
    model_type = config["model_type"]
    return mlx_lm_module("models." + MODULE_OF_MODEL_TYPE.get(model_type, model_type))


def randomize(model, seed, norm_neutral, embedding_std, expert_gain=1.0):
    """Fresh weights: linears N(0, 4/in) (twice the usual gain, so that attention depends on the
    context and greedy decoding wanders instead of repeating one token), embeddings
    N(0, embedding_std²) (small: a tied output projection otherwise favours the token just fed),
    norms neutral + N(0, 0.1²), biases N(0, 0.1²), Gemma 4's layer scalars 1 + N(0, 0.1²) and
    its router's input and per-expert scales 1 + N(0, 0.3²); the
    stacked experts' gate and up weights (`mlp.experts.{gate,up}_proj`) times `expert_gain`."""
    mx.random.seed(seed)
    fresh = []
    for name, value in tree_flatten(model.parameters()):
        noise = mx.random.normal(value.shape, dtype=mx.float32)
        if name.endswith("layer_scalar"):
            value = 1.0 + 0.1 * noise
        elif name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
            value = 1.0 + 0.3 * noise
        elif name.endswith("norm.weight"):
            value = norm_neutral + 0.1 * noise
        elif name.endswith(".bias"):
            value = 0.1 * noise
        elif "embed_tokens" in name:
            value = embedding_std * noise
        else:
            value = 2 * noise / math.sqrt(value.shape[-1])
            if "mlp.experts." in name and ("gate_proj" in name or "up_proj" in name):
                value = expert_gain * value
        fresh.append((name, value))
    model.update(tree_unflatten(fresh))


def save(directory, model, config):
    weights = dict(tree_flatten(model.parameters()))
    if config.get("tie_word_embeddings"):
        for suffix in ("weight", "scales", "biases"):
            weights.pop(f"lm_head.{suffix}", None)
    mx.save_safetensors(os.path.join(directory, "model.safetensors"), weights,
                        metadata={"format": "mlx"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(sorted(config.items())), f, indent=2)
    with open(os.path.join(directory, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(config["vocab_size"]), f, indent=1)


def load(directory):
    """The model as `mlx_lm.utils.load_model` builds it from the directory: config.json through
    ModelArgs.from_dict, sanitize, nn.quantize where the file has scales, strict load_weights."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    module = model_type_module(config)
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = mx.load(os.path.join(directory, "model.safetensors"))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    if (quantization := config.get("quantization")) is not None:
        nn.quantize(
            model,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            mode=quantization.get("mode", "affine"),
            class_predicate=lambda p, m: hasattr(m, "to_quantized") and f"{p}.scales" in weights,
        )
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model


def slide_every_layer(model):
    """Hugging Face's Mistral slides every layer. mlx-lm runs Mistral with its llama module, which
    slides only the layers `layer_types` marks `sliding_attention` and needs one full layer (it
    ignores `sliding_window` otherwise); marking every layer is what its loader would do if
    `layer_types` could say so. The window arithmetic (RotatingKVCache, windowed mask) is
    mlx-lm's."""
    for layer in model.model.layers:
        layer.use_sliding = True
    model.model.swa_idx = 0


def run(model, prompt):
    cache_module = mlx_lm_module("models.cache")
    cache = cache_module.make_prompt_cache(model)
    logits, tokens = [], []
    step = model(mx.array([prompt]), cache=cache)
    for position in range(DECODE_STEPS + 1):
        last = step[0, -1].astype(mx.float32)
        token = int(mx.argmax(last).item())
        logits.append(last.tolist())
        tokens.append(token)
        if position < DECODE_STEPS:
            step = model(mx.array([[token]]), cache=cache)
    return logits, tokens


def check_oracle_is_useful(name, logits, tokens):
    """Fails loudly (at generation, so deterministic) if the random model's greedy path would be
    fragile or trivial: a top-2 margin a rounding could flip, or one repeated token."""
    for step, vector in enumerate(logits):
        top = sorted(vector, reverse=True)
        scale = max(abs(v) for v in vector)
        if top[0] - top[1] < 1e-3 * scale:
            sys.exit(f"{name}: greedy step {step} is a near tie ({top[0]} vs {top[1]}); "
                     "change the seed")
    if len(set(tokens)) < 3:
        sys.exit(f"{name}: greedy decoding repeats {sorted(set(tokens))}; rescale the weights")


def make_variants(out_dir, families):
    version = mlx_lm_module("_version").__version__
    known = {name for v in variants() for name in v[:2]}
    if unknown := set(families) - known:
        sys.exit(f"unknown families {sorted(unknown)}; known: "
                 f"{' '.join(dict.fromkeys(v[1] for v in variants()))} (or a variant's name)")
    # The seed is the variant's place in the whole list, so that naming families never changes
    # a variant's weights, unless the variant pins its own (`seed`): a variant added beside
    # others keeps the weights it was checked with, away from near ties between greedy tokens.
    for seed, (name, family, config, options) in enumerate(variants()):
        if families and name not in families and family not in families:
            continue
        seed = options.get("seed", seed)
        directory = os.path.join(out_dir, name)
        os.makedirs(directory, exist_ok=True)
        prompt = prompt_tokens(options.get("prompt_len", PROMPT_LEN))
        config = {k: v for k, v in config.items() if v is not None or k in NULLABLE}
        module = model_type_module(config)
        model = module.Model(module.ModelArgs.from_dict(config))
        randomize(model, 1000 + seed, options.get("norm_neutral", 1.0),
                  options.get("embedding_std", 0.1), options.get("expert_gain", 1.0))
        if config.get("tie_word_embeddings") and "lm_head" in model:
            model.pop("lm_head")
        if (quantize := options.get("quantize")) is not None:
            group_size, bits = quantize
            nn.quantize(model, group_size=group_size, bits=bits,
                        class_predicate=lambda _, m: hasattr(m, "to_quantized")
                        and m.weight.shape[-1] % group_size == 0)
            spec = {"group_size": group_size, "bits": bits, "mode": "affine"}
            config["quantization"] = spec
            config["quantization_config"] = spec
        save(directory, model, config)

        model = load(directory)
        if options.get("every_layer_slides"):
            slide_every_layer(model)
        logits, tokens = run(model, prompt)
        check_oracle_is_useful(name, logits, tokens)
        with open(os.path.join(directory, "prompt"), "w") as f:
            f.write(",".join(map(str, prompt)) + "\n")
        with open(os.path.join(directory, "oracle.json"), "w") as f:
            json.dump({"variant": name, "family": family, "mlx_lm": version,
                       "mlx": mx.__version__, "prompt": prompt, "tokens": tokens,
                       "logits": logits}, f)
        print(name)


def bytes_to_unicode():
    """GPT-2's map from bytes to printable characters (byte-level BPE's alphabet)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tokenizer_json(vocab_size):
    """A byte-level BPE without merges: ids 0..255 are the bytes, 256 `<|endoftext|>` (EOS),
    257 `<|begin_of_text|>` (BOS), then reserved specials up to `vocab_size`."""
    vocab = {char: b for b, char in bytes_to_unicode().items()}
    specials = ["<|endoftext|>", "<|begin_of_text|>"] + [
        f"<|reserved_{i}|>" for i in range(vocab_size - 258)]
    added = []
    for offset, content in enumerate(specials):
        vocab[content] = 256 + offset
        added.append({"id": 256 + offset, "content": content, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def compare(directory, backend, tolerance):
    with open(os.path.join(directory, "oracle.json")) as f:
        oracle = json.load(f)
    with open(os.path.join(directory, f"ours-{backend}.json")) as f:
        ours = json.load(f)
    name = oracle["variant"]
    problems = []
    if len(ours["logits"]) != len(oracle["logits"]):
        problems.append(f"{len(ours['logits'])} logit vectors, mlx-lm has {len(oracle['logits'])}")
    max_diff, max_logit = 0.0, 0.0
    for step, (a, b) in enumerate(zip(oracle["logits"], ours["logits"])):
        if len(a) != len(b):
            problems.append(f"step {step}: {len(b)} logits, mlx-lm has {len(a)}")
            continue
        max_logit = max(max_logit, max(abs(x) for x in a))
        for x, y in zip(a, b):
            diff = abs(x - y) if y is not None else math.inf
            max_diff = max(max_diff, diff if diff == diff else math.inf)
    relative = max_diff / max_logit if max_logit else math.inf
    if relative > tolerance:
        problems.append(f"relative diff {relative:.1e} > {tolerance:g}")
    same = sum(a == b for a, b in zip(oracle["tokens"], ours["tokens"]))
    first_diff = next((i for i, (a, b) in enumerate(zip(oracle["tokens"], ours["tokens"]))
                       if a != b), None)
    if first_diff is not None or len(ours["tokens"]) != len(oracle["tokens"]):
        problems.append(f"greedy tokens differ from step {first_diff}: "
                        f"ours {ours['tokens']}, mlx-lm {oracle['tokens']}")
    verdict = "PASS" if not problems else "FAIL: " + "; ".join(problems)
    print(f"check-families: {name:<12} {backend:<3} max|diff| {max_diff:.1e} "
          f"(max|logit| {max_logit:.2f}, relative {relative:.1e}), tokens {same}/"
          f"{len(oracle['tokens'])} same  {verdict}")
    return not problems


# One variant per family at a benchmark size (~50 M parameters, 4-bit): every family's layers at
# the same shape, so that tokens per second compare the families' own costs.
BENCH_SHAPE = {
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "intermediate_size": 2816,
    "vocab_size": 8192,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "attention_bias": False,
}
BENCH_VARIANTS = ["llama", "qwen2", "qwen3", "mistral", "smollm3", "gemma2", "gemma3_text",
                  "phi3"]


def make_bench(out_dir, families):
    """Writes the bench-size model of each family (random weights, 4-bit groups of 64) into
    `out_dir/<family>`; no oracle run."""
    for seed, (name, family, config, options) in enumerate(variants()):
        if name not in BENCH_VARIANTS or (families and family not in families):
            continue
        config = {k: v for k, v in config.items() if v is not None or k in NULLABLE}
        config.update(BENCH_SHAPE)
        if family == "phi3":
            config.pop("head_dim", None)
            config["rope_scaling"] = {
                "type": "longrope",
                "short_factor": [1.0 + i / 24 for i in range(24)],
                "long_factor": [1.0 + i / 24 for i in range(24)],
            }
        if family in ("gemma2", "gemma3_text"):
            config["query_pre_attn_scalar"] = 64
            config["sliding_window"] = 512
            config["layer_types"] = (["sliding_attention", "full_attention"] * 4
                                     if family == "gemma2" else
                                     (["sliding_attention"] * 5 + ["full_attention"]
                                      + ["sliding_attention"] * 2))
            config.pop("sliding_window_pattern", None)
            if family == "gemma3_text":
                config["sliding_window_pattern"] = 6
        if family == "smollm3":
            config["no_rope_layer_interval"] = 4
            config["no_rope_layers"] = [int((i + 1) % 4 != 0) for i in range(8)]
            config["layer_types"] = ["full_attention"] * 8
        if family == "mistral":
            config["sliding_window"] = 4096
        directory = os.path.join(out_dir, family)
        os.makedirs(directory, exist_ok=True)
        module = model_type_module(config)
        model = module.Model(module.ModelArgs.from_dict(config))
        randomize(model, 2000 + seed, options.get("norm_neutral", 1.0), 0.05)
        if "lm_head" in model:
            model.pop("lm_head")
        nn.quantize(model, group_size=64, bits=4,
                    class_predicate=lambda _, m: hasattr(m, "to_quantized")
                    and m.weight.shape[-1] % 64 == 0)
        spec = {"group_size": 64, "bits": 4, "mode": "affine"}
        config["quantization"] = spec
        config["quantization_config"] = spec
        save(directory, model, config)
        print(family)


def main(argv):
    if len(argv) >= 2 and argv[0] == "make":
        make_variants(argv[1], argv[2:])
    elif len(argv) >= 2 and argv[0] == "bench":
        make_bench(argv[1], argv[2:])
    elif len(argv) == 4 and argv[0] == "compare":
        sys.exit(0 if compare(argv[1], argv[2], float(argv[3])) else 1)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
