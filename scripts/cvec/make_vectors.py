"""scripts/check-control-vectors: random control vectors for a model of N_EMBD and N_LAYER,
written with the `gguf` package (llama.cpp's) the way llama.cpp's cvector-generator writes them:
`general.architecture = controlvector`, `controlvector.model_hint`, `controlvector.layer_count`,
and one F32 tensor `direction.N` of N_EMBD values per layer N (1 to N_LAYER - 1).

    python make_vectors.py OUT_DIR N_EMBD N_LAYER SEED STD

writes OUT_DIR/all.gguf (every layer), OUT_DIR/odd.gguf (the odd layers only) and
OUT_DIR/late.gguf (the second half of the layers), each direction normal with that std.
"""
import sys

import numpy as np
from gguf import GGUFWriter

out, n_embd, n_layer, seed, std = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rng = np.random.default_rng(seed)


def write(name, layers):
    w = GGUFWriter(f"{out}/{name}.gguf", "controlvector")
    w.add_string("controlvector.model_hint", "llama")
    w.add_uint32("controlvector.layer_count", len(layers))
    for n in layers:
        w.add_tensor(f"direction.{n}", (rng.standard_normal(n_embd) * std).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


write("all", list(range(1, n_layer)))
write("odd", list(range(1, n_layer, 2)))
write("late", list(range(n_layer // 2, n_layer)))
