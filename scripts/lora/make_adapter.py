"""Writes one random LoRA adapter for a checkpoint in both of the forms mlxcel reads, for
scripts/check-lora: PEFT's (adapter_config.json and adapter_model.safetensors, Hugging Face row
order) and llama.cpp's GGUF (gguf's own writer; the q/k lora_b rows permuted the way llama.cpp's
converter permutes the model's q/k rows for the families it converts so).

    make_adapter.py CONFIG.json MODEL.gguf OUT_DIR RANK ALPHA SEED PERMUTE(0|1) [attention]

The adapter's architecture is the model GGUF's `general.architecture` (or MODEL.gguf may be the
architecture's name itself, e.g. `llama`).

Every layer's q, k, v, o, gate, up and down projections get a pair (with `attention`, only q,
k, v and o: the adapter the benchmark in docs/benchmarks.md times).
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

config_path, model_gguf, out, rank, alpha, seed, permute = sys.argv[1:8]
if model_gguf.endswith(".gguf"):
    field = gguf.GGUFReader(model_gguf).fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
else:
    arch = model_gguf
rank, alpha, seed, permute = int(rank), float(alpha), int(seed), permute == "1"
attention_only = sys.argv[8:9] == ["attention"]
config = json.loads(Path(config_path).read_text())
out = Path(out)
hidden = config["hidden_size"]
heads = config["num_attention_heads"]
kv_heads = config.get("num_key_value_heads", heads)
head_dim = config.get("head_dim") or hidden // heads
inter = config["intermediate_size"]
layers = config["num_hidden_layers"]

# module: (HF name, GGUF name, out, in)
modules = [
    ("self_attn.q_proj", "attn_q", heads * head_dim, hidden),
    ("self_attn.k_proj", "attn_k", kv_heads * head_dim, hidden),
    ("self_attn.v_proj", "attn_v", kv_heads * head_dim, hidden),
    ("self_attn.o_proj", "attn_output", hidden, heads * head_dim),
    ("mlp.gate_proj", "ffn_gate", inter, hidden),
    ("mlp.up_proj", "ffn_up", inter, hidden),
    ("mlp.down_proj", "ffn_down", hidden, inter),
]


def llama_order(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Each head's rows from Hugging Face's rotate-half order to llama.cpp's interleaved one."""
    return (rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


rng = np.random.default_rng(seed)
pairs = []
for layer in range(layers):
    for hf, gg, n_out, n_in in modules[:4] if attention_only else modules:
        a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * 0.5 / np.sqrt(rank)).astype(np.float32)
        pairs.append((layer, hf, gg, a, b))

# PEFT.
peft = out / "peft"
peft.mkdir(parents=True, exist_ok=True)
(peft / "adapter_config.json").write_text(json.dumps({
    "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none",
    "target_modules": sorted({hf.split(".")[-1] for _, hf, _, _, _ in pairs}),
    "task_type": "CAUSAL_LM", "base_model_name_or_path": str(Path(config_path).parent),
}))
tensors = {}
for layer, hf, _, a, b in pairs:
    stem = f"base_model.model.model.layers.{layer}.{hf}"
    tensors[f"{stem}.lora_A.weight"] = a
    tensors[f"{stem}.lora_B.weight"] = b
header, blobs, offset = {}, [], 0
for name, array in tensors.items():
    data = array.tobytes()
    header[name] = {"dtype": "F32", "shape": list(array.shape),
                    "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
head = json.dumps(header).encode()
head += b" " * (-len(head) % 8)
with open(peft / "adapter_model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(head)))
    f.write(head)
    for blob in blobs:
        f.write(blob)

# GGUF.
writer = gguf.GGUFWriter(str(out / "adapter.gguf"), arch)
writer.add_string("general.type", "adapter")
writer.add_string("adapter.type", "lora")
writer.add_float32("adapter.lora.alpha", alpha)
for layer, hf, gg, a, b in pairs:
    if permute and gg == "attn_q":
        b = llama_order(b, heads)
    elif permute and gg == "attn_k":
        b = llama_order(b, kv_heads)
    writer.add_tensor(f"blk.{layer}.{gg}.weight.lora_a", np.ascontiguousarray(a))
    writer.add_tensor(f"blk.{layer}.{gg}.weight.lora_b", np.ascontiguousarray(b))
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
print(f"{len(pairs)} pairs of rank {rank}")
