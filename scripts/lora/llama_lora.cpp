// llama.cpp's side of scripts/check-lora: a GGUF model with a GGUF LoRA adapter applied at a
// scale, through libllama's own adapter loader (llama_adapter_lora_init) and its graph
// (llama_set_adapters_lora). Prefills the token ids in one batch, decodes greedily, and prints
// the JSON shape of mlxcel-engine's family-logits example (logits after the prefill and after
// each decode step, and the greedy token of each).
//
//   llama-lora MODEL.gguf ADAPTER.gguf SCALE ID,ID,... STEPS
//
// f32 KV cache, flash attention off, two threads, 256 positions, as scripts/families'
// llama-greedy runs, so that both sides compute in f32.

#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    static bool show = false;
    if (level != GGML_LOG_LEVEL_CONT) {
        show = level >= GGML_LOG_LEVEL_WARN || std::getenv("LLAMA_LORA_VERBOSE") != nullptr;
    }
    if (show) {
        fputs(text, stderr);
    }
}

static std::vector<llama_token> token_ids(const std::string & text) {
    std::vector<llama_token> ids;
    size_t start = 0;
    while (start < text.size()) {
        size_t comma = text.find(',', start);
        std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        ids.push_back((llama_token) std::atoi(item.c_str()));
        if (comma == std::string::npos) {
            break;
        }
        start = comma + 1;
    }
    return ids;
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: llama-lora MODEL.gguf ADAPTER.gguf SCALE ID,ID,... STEPS\n");
        return 2;
    }
    const float scale = std::strtof(argv[3], nullptr);
    const std::vector<llama_token> prompt = token_ids(argv[4]);
    const int steps = std::atoi(argv[5]);
    if (prompt.empty()) {
        fprintf(stderr, "llama-lora: no token ids\n");
        return 2;
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (model == nullptr) {
        fprintf(stderr, "llama-lora: cannot load the model %s\n", argv[1]);
        return 1;
    }
    llama_adapter_lora * adapter = llama_adapter_lora_init(model, argv[2]);
    if (adapter == nullptr) {
        fprintf(stderr, "llama-lora: cannot load the adapter %s\n", argv[2]);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 256;
    cparams.n_batch = 256;
    cparams.n_ubatch = 256;
    cparams.n_threads = 2;
    cparams.n_threads_batch = 2;
    cparams.type_k = GGML_TYPE_F32;
    cparams.type_v = GGML_TYPE_F32;
    cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "llama-lora: cannot create a context\n");
        return 1;
    }
    float scales[1] = {scale};
    if (llama_set_adapters_lora(ctx, &adapter, 1, scales) != 0) {
        fprintf(stderr, "llama-lora: cannot apply the adapter\n");
        return 1;
    }

    std::vector<std::vector<float>> rows;
    std::vector<llama_token> picked;
    std::vector<llama_token> feed = prompt;
    while ((int) picked.size() <= steps) {
        if (llama_decode(ctx, llama_batch_get_one(feed.data(), (int32_t) feed.size())) != 0) {
            fprintf(stderr, "llama-lora: llama_decode failed\n");
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        rows.emplace_back(logits, logits + n_vocab);
        int best = 0;
        for (int i = 1; i < n_vocab; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        picked.push_back(best);
        feed.assign(1, best);
    }

    printf("{\"engine\":\"llama.cpp\",\"tokens\":[");
    for (size_t i = 0; i < picked.size(); i++) {
        printf("%s%d", i ? "," : "", picked[i]);
    }
    printf("],\"logits\":[");
    for (size_t r = 0; r < rows.size(); r++) {
        printf("%s[", r ? "," : "");
        for (int i = 0; i < n_vocab; i++) {
            const float v = rows[r][i];
            if (std::isfinite(v)) {
                printf("%s%.9g", i ? "," : "", v);
            } else {
                printf("%snull", i ? "," : "");
            }
        }
        printf("]");
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
