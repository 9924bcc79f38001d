// llama.cpp's side of scripts/check-control-vectors: loads a GGUF model with libllama, loads the
// control vectors with libllama-common's own loader (common_control_vector_load, which llama-cli,
// llama-completion and llama-server call for --control-vector/--control-vector-scaled), sets them
// on the context with llama_set_adapter_cvec over the layer range as common_init_from_params
// defaults it (a start of 0 or less is 1, an end of 0 or less the model's layer count), prefills
// the token ids in one batch and decodes greedily, printing JSON in the shape of mlxcel-engine's
// family-logits example (as scripts/families/llama_greedy.cpp does).
//
//   llama-cvec MODEL.gguf ID,ID,... STEPS START END [FILE:SCALE...]   (no file: the model alone)
//
// No tokenizer, no BOS: token ids go in as they are. f32 KV cache, flash attention off, two
// threads, a context of 256. llama.cpp's INFO lines are dropped unless LLAMA_CVEC_VERBOSE is set.

#include "common.h"
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static void log_warnings(enum ggml_log_level level, const char * text, void * verbose) {
    static bool keep = false;
    if (level != GGML_LOG_LEVEL_CONT) {
        keep = verbose != nullptr || level >= GGML_LOG_LEVEL_WARN;
    }
    if (keep) {
        fputs(text, stderr);
    }
}

static bool parse_ids(const std::string & s, std::vector<llama_token> & ids) {
    size_t at = 0;
    while (at <= s.size()) {
        size_t end = s.find(',', at);
        if (end == std::string::npos) {
            end = s.size();
        }
        std::string item = s.substr(at, end - at);
        char * stop = nullptr;
        long id = std::strtol(item.c_str(), &stop, 10);
        if (item.empty() || *stop != '\0' || id < 0) {
            return false;
        }
        ids.push_back((llama_token) id);
        at = end + 1;
    }
    return !ids.empty();
}

int main(int argc, char ** argv) {
    std::vector<llama_token> prompt;
    if (argc < 6 || !parse_ids(argv[2], prompt)) {
        fprintf(stderr, "usage: llama-cvec MODEL.gguf ID,ID,... STEPS START END [FILE:SCALE...]\n");
        return 2;
    }
    const int steps = std::atoi(argv[3]);
    int layer_start = std::atoi(argv[4]);
    int layer_end = std::atoi(argv[5]);
    std::vector<common_control_vector_load_info> infos;
    for (int i = 6; i < argc; i++) {
        std::string item(argv[i]);
        size_t colon = item.rfind(':');
        if (colon == std::string::npos) {
            fprintf(stderr, "llama-cvec: `%s` is not FILE:SCALE\n", argv[i]);
            return 2;
        }
        infos.push_back({ std::stof(item.substr(colon + 1)), item.substr(0, colon) });
    }

    llama_log_set(log_warnings, std::getenv("LLAMA_CVEC_VERBOSE"));
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (model == nullptr) {
        fprintf(stderr, "llama-cvec: llama.cpp could not load %s\n", argv[1]);
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
        fprintf(stderr, "llama-cvec: llama.cpp could not create a context\n");
        return 1;
    }

    if (!infos.empty()) {
        if (layer_start <= 0) {
            layer_start = 1;
        }
        if (layer_end <= 0) {
            layer_end = llama_model_n_layer(model);
        }
        const common_control_vector_data cvec = common_control_vector_load(infos);
        if (cvec.n_embd == -1) {
            fprintf(stderr, "llama-cvec: llama.cpp refused the control vectors\n");
            return 1;
        }
        if (llama_set_adapter_cvec(ctx, cvec.data.data(), cvec.data.size(), cvec.n_embd,
                                   layer_start, layer_end) != 0) {
            fprintf(stderr, "llama-cvec: llama_set_adapter_cvec failed\n");
            return 1;
        }
    }

    std::vector<std::vector<float>> all_logits;
    std::vector<llama_token> tokens;
    std::vector<llama_token> input = prompt;
    for (;;) {
        llama_batch batch = llama_batch_get_one(input.data(), (int32_t) input.size());
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama-cvec: llama_decode failed\n");
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        all_logits.emplace_back(logits, logits + n_vocab);
        llama_token best = 0;
        for (int j = 1; j < n_vocab; j++) {
            if (logits[j] > logits[best]) {
                best = j;
            }
        }
        tokens.push_back(best);
        if ((int) tokens.size() > steps) {
            break;
        }
        input.assign(1, best);
    }

    printf("{\"engine\":\"llama.cpp\",\"tokens\":[");
    for (size_t i = 0; i < tokens.size(); i++) {
        printf("%s%d", i ? "," : "", tokens[i]);
    }
    printf("],\"logits\":[");
    for (size_t i = 0; i < all_logits.size(); i++) {
        printf("%s[", i ? "," : "");
        for (int j = 0; j < n_vocab; j++) {
            float v = all_logits[i][j];
            if (std::isfinite(v)) {
                printf("%s%.9g", j ? "," : "", v);
            } else {
                printf("%snull", j ? "," : "");
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
