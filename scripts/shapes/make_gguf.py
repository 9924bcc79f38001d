"""Writes a GGUF with random weights at a public model's shape (run by scripts/make-shapes inside
the pinned `gguf` venv of scripts/check-dequant).

    make_gguf.py SHAPE TYPE OUT.gguf [--layers N] [--damp-from L --damp EPS]
                                         TYPE: Q4_0 or Q8_0 (every weight matrix in it; norms,
                                         biases and expert routers F32)
    make_gguf.py --label SHAPE [--layers N]
                                         print the file label of SHAPE at N layers (the shape's
                                         default layer count without --layers): the shape's name,
                                         then `-<N>of<L>` where N is less than its L layers

The Qwen3.5 shapes (llama.cpp's qwen35, qwen35moe) write the linear-attention layers as
llama.cpp's converter does (`attn_qkv`, `attn_gate`, `ssm_beta`/`ssm_alpha`, `ssm_conv1d`,
`ssm_a`, `ssm_dt.bias`, `ssm_norm`, `ssm_out`, F32 where it keeps them so) with the `ssm.*` keys.

Mixture-of-experts shapes (OLMoE, Qwen3-MoE) write their experts as llama.cpp's conversion does:
per layer a router `ffn_gate_inp` (F32, as convert_hf_to_gguf.py keeps it) and the experts'
stacked 3-D `ffn_{gate,up,down}_exps` in the type, with `expert_count`, `expert_used_count` and,
where the model's config has a separate expert width, `expert_feed_forward_length`. A shape too
big for a 24 GB machine beside llama.cpp (Qwen3-30B-A3B: ~18 GB at Q4_K_M) defaults to its first
layers (`default_layers`), which `--layers` overrides; every layer has the same cost, so speeds
scale by the layer count.

Every tensor's values come from a generator seeded by its name, so a file made with
`--layers N` holds exactly the first N layers, the embeddings, the final norm and the output of
the full file: a draft model for it (`scripts/bench-spec --draft`). `--damp-from L --damp EPS`
multiplies the block scales of `attn_output` and `ffn_down` in layers L and above by EPS (0
zeroes them): those layers then add EPS times their usual output to the residual stream, so the
model's greedy tokens agree with its first-L-layers draft more often the smaller EPS is, while
every byte is still read and multiplied at the same cost.

Random weights give meaningless text and exact speed: every tensor has the shape, the type and
the byte size the real checkpoint's conversion has, so both engines read and multiply the same
bytes they would for the real model. Blocks hold finite f16 scales (about 0.02 / 127 per step,
the spread of trained weights) and uniform quants. The vocabulary is SentencePiece-style (the
`llama` tokenizer model): <unk>, <s>, </s>, the 256 byte tokens, then `▁w<i>` pieces up to the
shape's vocabulary size, so that both engines load it; text through it is meaningless too.

Not written, since they change no speed: Llama 3's rope frequency scaling (`rope_freqs`),
chat templates, and anything of the tokenizer beyond the sizes.
"""

import sys
import zlib

import numpy as np
import gguf

# The public config.json values of each model (hidden size, layers, heads, KV heads, MLP width,
# vocabulary, tied embeddings, q/k/v biases, rope theta, RMS-norm epsilon, trained context).
# Mixture-of-experts shapes add: experts (num_experts), experts_used (num_experts_per_tok),
# expert_ffn (moe_intermediate_size, where the config has one: written as
# expert_feed_forward_length), head_dim where it is not hidden / heads, qk_norm ("whole": RMS norms
# over the whole q and k projections, OLMoE's; "head": over each head, Qwen3's), and
# default_layers for a shape made by default at fewer layers than the model has.
SHAPES = {
    "llama-3.2-1b": dict(arch="llama", hidden=2048, layers=16, heads=32, kv_heads=8,
                         ffn=8192, vocab=128256, tied=True, qkv_bias=False,
                         rope_theta=500000.0, eps=1e-5, context=131072),
    "qwen2.5-3b": dict(arch="qwen2", hidden=2048, layers=36, heads=16, kv_heads=2,
                       ffn=11008, vocab=151936, tied=True, qkv_bias=True,
                       rope_theta=1000000.0, eps=1e-6, context=32768),
    "llama-3.1-8b": dict(arch="llama", hidden=4096, layers=32, heads=32, kv_heads=8,
                         ffn=14336, vocab=128256, tied=False, qkv_bias=False,
                         rope_theta=500000.0, eps=1e-5, context=131072),
    # allenai/OLMoE-1B-7B-0924: experts 1024 wide (its intermediate_size), router without top-k
    # renormalisation (norm_topk_prob false, llama.cpp's olmoe graph).
    "olmoe-1b-7b": dict(arch="olmoe", hidden=2048, layers=16, heads=16, kv_heads=16,
                        ffn=1024, vocab=50304, tied=False, qkv_bias=False,
                        rope_theta=10000.0, eps=1e-5, context=4096,
                        experts=64, experts_used=8, qk_norm="whole"),
    # Qwen/Qwen3-30B-A3B: 48 layers, head_dim 128 (32 heads of it over a 2048-wide stream),
    # experts 768 wide; 24 layers by default (half the file, ~9 GB at Q4_K_M).
    "qwen3-30b-a3b": dict(arch="qwen3moe", hidden=2048, layers=48, heads=32, kv_heads=4,
                          ffn=6144, vocab=151936, tied=False, qkv_bias=False,
                          rope_theta=1000000.0, eps=1e-6, context=40960, head_dim=128,
                          experts=128, experts_used=8, expert_ffn=768, qk_norm="head",
                          default_layers=24),
    # openai/gpt-oss-20b: 32 experts 2880 wide, top-4, head_dim 64, biases on q/k/v/o, the
    # router and the experts, per-head attention sinks, a 128-token sliding window on every other
    # layer (llama.cpp's default pattern for the arch), YaRN rope scaling (factor 32 over 4096).
    "gpt-oss-20b": dict(arch="gpt-oss", hidden=2880, layers=24, heads=64, kv_heads=8,
                        ffn=2880, vocab=201088, tied=False, qkv_bias=True,
                        rope_theta=150000.0, eps=1e-5, context=131072, head_dim=64,
                        experts=32, experts_used=4, expert_ffn=2880, gpt_oss=True,
                        sliding_window=128, yarn=dict(factor=32.0, original_context=4096,
                                                      beta_fast=32.0, beta_slow=1.0)),
    # The gated-DeltaNet hybrids (Qwen3.5's text models, llama.cpp's qwen35/qwen35moe): three
    # linear-attention layers in four (`linear`: key and value heads, their sizes, the
    # convolution's taps), every fourth layer gated softmax attention (q_proj twice as wide, for
    # the output gate) with q/k norms per head, RoPE on a quarter of each 256-wide head, norms
    # stored as 1 + w. Values from the released config.json files (text_config), checked against
    # public copies of them: every value below (hidden size, layers, heads, KV heads, head_dim,
    # MLP and expert widths, experts and top-k, vocabulary, untied output, rope theta 1e7 on a
    # quarter of each head, eps, the linear heads 16 key and 32 value of 128, conv 4, one
    # full-attention layer in four, context 262144) matches the text_config dicts that public
    # test fixtures copy from the checkpoints and THUDM/slime's launch scripts
    # (scripts/models/qwen3.5-35B-A3B.sh) give.
    # Qwen/Qwen3.5-9B.
    "qwen3.5-9b": dict(arch="qwen35", hidden=4096, layers=32, heads=16, kv_heads=4,
                       ffn=12288, vocab=248320, tied=False, qkv_bias=False,
                       rope_theta=10000000.0, eps=1e-6, context=262144, head_dim=256,
                       qk_norm="head", rotary=64,
                       linear=dict(key_heads=16, value_heads=32, key_dim=128, value_dim=128,
                                   conv=4)),
    # Qwen/Qwen3.5-35B-A3B: 256 experts 512 wide, top-8, beside a shared expert 512 wide; its
    # first 20 of 40 layers by default (the whole file, ~21 GB at Q4_K_M, would not fit beside
    # llama.cpp in 24 GB).
    "qwen3.5-35b-a3b": dict(arch="qwen35moe", hidden=2048, layers=40, heads=16, kv_heads=2,
                            ffn=512, vocab=248320, tied=False, qkv_bias=False,
                            rope_theta=10000000.0, eps=1e-6, context=262144, head_dim=256,
                            qk_norm="head", rotary=64, experts=256, experts_used=8,
                            expert_ffn=512, shared_ffn=512, default_layers=20,
                            linear=dict(key_heads=16, value_heads=32, key_dim=128,
                                        value_dim=128, conv=4)),
}

# Block layouts written directly: (ggml type, values per block, bytes per block, file type).
TYPES = {
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, 32, 18, gguf.LlamaFileType.MOSTLY_Q4_0),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, 32, 34, gguf.LlamaFileType.MOSTLY_Q8_0),
    # gpt-oss's checkpoint format: its experts in MXFP4 (an e8m0 power-of-two scale and 32 fp4
    # values per block), every other matrix in Q8_0 (the `experts` type below).
    "MXFP4": (gguf.GGMLQuantizationType.MXFP4, 32, 17, gguf.LlamaFileType.MOSTLY_MXFP4_MOE),
}

def rng(name):
    """The generator of one tensor's values: the same for the same name in every file."""
    return np.random.default_rng([20261202, zlib.crc32(name.encode())])


def blocks(qtype, rows, cols, gen, damp=1.0):
    """`rows` rows of `cols` values as random blocks of `qtype`: a (rows, bytes per row) u8 array
    (the scales times `damp`)."""
    ggml, per_block, nbytes, _ = TYPES[qtype]
    nblocks = rows * (cols // per_block)
    data = np.empty((nblocks, nbytes), dtype=np.uint8)
    if qtype == "MXFP4":
        # e8m0 scale 2^(e-128) per fp4 step (ggml's half-scale convention): e in 119..121 gives
        # steps of 0.002-0.008, values up to 12 steps, the spread of trained weights.
        data[:, 0] = gen.integers(119, 122, nblocks, dtype=np.uint8)
        data[:, 1:] = gen.integers(0, 256, (nblocks, nbytes - 1), dtype=np.uint8)
        return data.reshape(rows, -1)
    # d: an f16 scale; 0.02 / 127 (Q8_0) or / 8 (Q4_0) per quant step, +-50%.
    step = 0.02 / (127.0 if qtype == "Q8_0" else 8.0)
    scales = (damp * step * gen.uniform(0.5, 1.5, nblocks)).astype(np.float16)
    data[:, 0:2] = scales.view(np.uint8).reshape(nblocks, 2)
    data[:, 2:] = gen.integers(0, 256, (nblocks, nbytes - 2), dtype=np.uint8)
    if qtype == "Q8_0":
        # int8 -128 is outside the range llama.cpp's quantizer produces; keep to -127..127.
        q = data[:, 2:].view(np.int8)
        q[q == -128] = -127
    return data.reshape(rows, -1)


def options(args):
    """--layers N, --damp-from L, --damp EPS: (layers or None, L, EPS)."""
    layers, damp_from, damp = None, None, None
    it = iter(args)
    for flag in it:
        value = next(it, None)
        if value is None:
            sys.exit(f"make_gguf.py: {flag} needs a value")
        try:
            if flag == "--layers":
                layers = int(value)
            elif flag == "--damp-from":
                damp_from = int(value)
            elif flag == "--damp":
                damp = float(value)
            else:
                sys.exit(f"make_gguf.py: unknown option {flag} (--layers, --damp-from, --damp)")
        except ValueError:
            sys.exit(f"make_gguf.py: {flag} {value!r} is not a number")
    if (damp_from is None) != (damp is None):
        sys.exit("make_gguf.py: --damp-from and --damp go together")
    if damp is not None and not damp >= 0:
        sys.exit(f"make_gguf.py: --damp {damp} is not a non-negative number")
    return layers, damp_from, damp


def label(name, s, layers):
    """The file label of shape `name` at `layers` layers: the name, then `-<N>of<L>` for fewer
    layers than the model has."""
    return name if layers == s["layers"] else f"{name}-{layers}of{s['layers']}"


def shape_at(shape_name, layers):
    """The shape's values at `layers` layers (None: its default), with its label."""
    if shape_name not in SHAPES:
        sys.exit(f"make_gguf.py: unknown shape {shape_name!r} (known: {', '.join(SHAPES)})")
    s = dict(SHAPES[shape_name])
    if layers is None:
        layers = s.get("default_layers", s["layers"])
    if not 1 <= layers <= s["layers"]:
        sys.exit(f"make_gguf.py: --layers {layers}: {shape_name} has 1..{s['layers']}")
    name = label(shape_name, s, layers)
    s["layers"] = layers
    return s, name


def tensor_list(s):
    """(name, dims, kind) of every tensor in file order: dims outermost first (a [rows, cols]
    matrix, an [experts, rows, cols] stack); kind "q" for the file's type, "experts" for the
    experts' type (the file's, or MXFP4's), "router" for an F32 matrix, "bias" or "norm" for F32
    vectors (and gpt-oss's per-expert bias matrices)."""
    hidden = s["hidden"]
    head_dim = s.get("head_dim", hidden // s["heads"])
    q_dim, kv = s["heads"] * head_dim, s["kv_heads"] * head_dim
    tensors = [("token_embd.weight", (s["vocab"], hidden), "q")]
    for i in range(s["layers"]):
        p = f"blk.{i}."
        if "linear" in s:
            tensors += hybrid_layer(s, i)
            continue
        tensors += [
            (p + "attn_norm.weight", (hidden,), "norm"),
            (p + "attn_q.weight", (q_dim, hidden), "q"),
            (p + "attn_k.weight", (kv, hidden), "q"),
            (p + "attn_v.weight", (kv, hidden), "q"),
        ]
        if s["qkv_bias"]:
            tensors += [(p + "attn_q.bias", (q_dim,), "bias"),
                        (p + "attn_k.bias", (kv,), "bias"),
                        (p + "attn_v.bias", (kv,), "bias")]
        tensors.append((p + "attn_output.weight", (hidden, q_dim), "q"))
        if s.get("gpt_oss"):
            tensors += [(p + "attn_output.bias", (hidden,), "bias"),
                        (p + "attn_sinks.weight", (s["heads"],), "bias"),
                        (p + "post_attention_norm.weight", (hidden,), "norm")]
            n, width = s["experts"], s["expert_ffn"]
            tensors += [
                (p + "ffn_gate_inp.weight", (n, hidden), "router"),
                (p + "ffn_gate_inp.bias", (n,), "bias"),
                (p + "ffn_gate_exps.weight", (n, width, hidden), "experts"),
                (p + "ffn_gate_exps.bias", (n, width), "bias"),
                (p + "ffn_up_exps.weight", (n, width, hidden), "experts"),
                (p + "ffn_up_exps.bias", (n, width), "bias"),
                (p + "ffn_down_exps.weight", (n, hidden, width), "experts"),
                (p + "ffn_down_exps.bias", (n, hidden), "bias"),
            ]
            continue
        if s.get("qk_norm") == "whole":
            tensors += [(p + "attn_q_norm.weight", (q_dim,), "norm"),
                        (p + "attn_k_norm.weight", (kv,), "norm")]
        elif s.get("qk_norm") == "head":
            tensors += [(p + "attn_q_norm.weight", (head_dim,), "norm"),
                        (p + "attn_k_norm.weight", (head_dim,), "norm")]
        tensors.append((p + "ffn_norm.weight", (hidden,), "norm"))
        if "experts" in s:
            n, width = s["experts"], s.get("expert_ffn", s["ffn"])
            tensors += [
                (p + "ffn_gate_inp.weight", (n, hidden), "router"),
                (p + "ffn_gate_exps.weight", (n, width, hidden), "experts"),
                (p + "ffn_up_exps.weight", (n, width, hidden), "experts"),
                (p + "ffn_down_exps.weight", (n, hidden, width), "experts"),
            ]
        else:
            tensors += [
                (p + "ffn_gate.weight", (s["ffn"], hidden), "q"),
                (p + "ffn_up.weight", (s["ffn"], hidden), "q"),
                (p + "ffn_down.weight", (hidden, s["ffn"]), "q"),
            ]
    tensors.append(("output_norm.weight", (hidden,), "norm"))
    if not s["tied"]:
        tensors.append(("output.weight", (s["vocab"], hidden), "q"))
    return tensors


def hybrid_layer(s, i):
    """A Qwen3.5 layer's tensors (see tensor_list): linear attention on three layers in four,
    gated softmax attention on every fourth, then the dense MLP or the routed experts beside a
    gated shared expert."""
    hidden, head_dim, lin = s["hidden"], s["head_dim"], s["linear"]
    p = f"blk.{i}."
    q_dim, kv = s["heads"] * head_dim, s["kv_heads"] * head_dim
    key_dim, value_dim = lin["key_heads"] * lin["key_dim"], lin["value_heads"] * lin["value_dim"]
    conv_dim, vh = 2 * key_dim + value_dim, lin["value_heads"]
    tensors = [(p + "attn_norm.weight", (hidden,), "norm"),
               (p + "post_attention_norm.weight", (hidden,), "norm")]
    if (i + 1) % 4 == 0:
        tensors += [(p + "attn_q.weight", (2 * q_dim, hidden), "q"),
                    (p + "attn_k.weight", (kv, hidden), "q"),
                    (p + "attn_v.weight", (kv, hidden), "q"),
                    (p + "attn_output.weight", (hidden, q_dim), "q"),
                    (p + "attn_q_norm.weight", (head_dim,), "norm"),
                    (p + "attn_k_norm.weight", (head_dim,), "norm")]
    else:
        tensors += [(p + "attn_qkv.weight", (conv_dim, hidden), "q"),
                    (p + "attn_gate.weight", (value_dim, hidden), "q"),
                    (p + "ssm_beta.weight", (vh, hidden), "q"),
                    (p + "ssm_alpha.weight", (vh, hidden), "q"),
                    (p + "ssm_conv1d.weight", (conv_dim, lin["conv"]), "bias"),
                    (p + "ssm_a", (vh,), "decay"),
                    (p + "ssm_dt.bias", (vh,), "bias"),
                    (p + "ssm_norm.weight", (lin["value_dim"],), "norm"),
                    (p + "ssm_out.weight", (hidden, value_dim), "q")]
    if "experts" in s:
        n, width, shared = s["experts"], s["expert_ffn"], s["shared_ffn"]
        tensors += [
            (p + "ffn_gate_inp.weight", (n, hidden), "router"),
            (p + "ffn_gate_exps.weight", (n, width, hidden), "experts"),
            (p + "ffn_up_exps.weight", (n, width, hidden), "experts"),
            (p + "ffn_down_exps.weight", (n, hidden, width), "experts"),
            (p + "ffn_gate_inp_shexp.weight", (hidden,), "bias"),
            (p + "ffn_gate_shexp.weight", (shared, hidden), "q"),
            (p + "ffn_up_shexp.weight", (shared, hidden), "q"),
            (p + "ffn_down_shexp.weight", (hidden, shared), "q"),
        ]
    else:
        tensors += [(p + "ffn_gate.weight", (s["ffn"], hidden), "q"),
                    (p + "ffn_up.weight", (s["ffn"], hidden), "q"),
                    (p + "ffn_down.weight", (hidden, s["ffn"]), "q")]
    return tensors


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--label":
        layers, _, _ = options(sys.argv[3:])
        print(shape_at(sys.argv[2], layers)[1])
        return
    if len(sys.argv) < 4:
        sys.exit("usage: make_gguf.py SHAPE TYPE OUT.gguf [--layers N] [--damp-from L --damp EPS]\n"
                 "       make_gguf.py --label SHAPE [--layers N]")
    shape_name, qtype, out = sys.argv[1], sys.argv[2], sys.argv[3]
    layers, damp_from, damp = options(sys.argv[4:])
    if qtype not in TYPES:
        sys.exit(f"make_gguf.py: type {qtype!r} is not written directly (known: {', '.join(TYPES)})")
    s, name = shape_at(shape_name, layers)
    if qtype == "MXFP4" and not s.get("gpt_oss"):
        sys.exit(f"make_gguf.py: MXFP4 is gpt-oss's expert format; {shape_name} has Q4_0 and Q8_0")
    if qtype == "MXFP4" and damp_from is not None:
        sys.exit("make_gguf.py: --damp scales Q4_0/Q8_0 blocks; MXFP4's power-of-two scales cannot take it")
    # The type of each kind of quantized tensor.
    kind_type = {"q": "Q8_0" if qtype == "MXFP4" else qtype, "experts": qtype}
    arch = s["arch"]
    hidden, head_dim = s["hidden"], s.get("head_dim", s["hidden"] // s["heads"])

    w = gguf.GGUFWriter(out, arch)
    model_name = f"random-{name}"
    if damp_from is not None:
        model_name += f"-damped-{damp}-from-{damp_from}"
    w.add_name(model_name)
    w.add_context_length(s["context"])
    w.add_embedding_length(hidden)
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_dimension_count(s.get("rotary", head_dim))
    if "head_dim" in s:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["experts_used"])
        if "expert_ffn" in s:
            w.add_expert_feed_forward_length(s["expert_ffn"])
        if "shared_ffn" in s:
            w.add_expert_shared_feed_forward_length(s["shared_ffn"])
    if "linear" in s:
        lin = s["linear"]
        w.add_ssm_conv_kernel(lin["conv"])
        w.add_ssm_state_size(lin["key_dim"])
        w.add_ssm_group_count(lin["key_heads"])
        w.add_ssm_time_step_rank(lin["value_heads"])
        w.add_ssm_inner_size(lin["value_heads"] * lin["value_dim"])
        w.add_full_attention_interval(4)
        # Multi-axis RoPE's sections (llama.cpp's qwen35 requires them): the rotated pairs split
        # as the released models split them; a text position is the same on every axis.
        pairs = s["rotary"] // 2
        w.add_rope_dimension_sections([pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0])
    if "sliding_window" in s:
        w.add_sliding_window(s["sliding_window"])
    if "yarn" in s:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s["yarn"]["factor"])
        w.add_rope_scaling_orig_ctx_len(s["yarn"]["original_context"])
        w.add_rope_scaling_yarn_beta_fast(s["yarn"]["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(s["yarn"]["beta_slow"])
    w.add_vocab_size(s["vocab"])
    w.add_file_type(TYPES[qtype][3])

    # SentencePiece-style vocabulary: control, byte and normal tokens.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    rest = s["vocab"] - len(tokens)
    tokens += [f"\u2581w{i}" for i in range(rest)]
    types += [gguf.TokenType.NORMAL] * rest
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(rest)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    # GGUF lists dims innermost first; the writer takes them outermost first, and a quantized
    # tensor's innermost dim in bytes.
    tensors = tensor_list(s)
    for name, dims, kind in tensors:
        count = int(np.prod(dims))
        if kind in kind_type:
            ggml_type, per_block, nbytes, _ = TYPES[kind_type[kind]]
            row_bytes = dims[-1] // per_block * nbytes
            w.add_tensor_info(name, [*dims[:-1], row_bytes], np.dtype(np.uint8),
                              count // dims[-1] * row_bytes, raw_dtype=ggml_type)
        else:
            w.add_tensor_info(name, list(dims), np.dtype(np.float32), count * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, dims, kind in tensors:
        gen = rng(name)
        if kind in kind_type:
            layer = int(name.split(".")[1]) if name.startswith("blk.") else None
            damped = (damp_from is not None and layer is not None and layer >= damp_from
                      and name.endswith(("attn_output.weight", "ffn_down.weight",
                                         "ffn_down_exps.weight")))
            rows = int(np.prod(dims[:-1]))
            w.write_tensor_data(blocks(kind_type[kind], rows, dims[-1], gen,
                                       damp if damped else 1.0))
        elif kind == "decay":
            # A_log's rate as llama.cpp stores it, -exp(A_log), for A_log in [-1, 2.5].
            w.write_tensor_data(-np.exp(gen.uniform(-1.0, 2.5, dims)).astype(np.float32))
        elif kind in ("bias", "router"):
            # Router logits of the spread of trained ones: every token picks its own experts.
            w.write_tensor_data(gen.normal(0.0, 0.02, dims).astype(np.float32))
        else:
            w.write_tensor_data(gen.uniform(0.8, 1.2, dims).astype(np.float32))
    w.close()


if __name__ == "__main__":
    main()
