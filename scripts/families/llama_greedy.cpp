// llama.cpp's side of scripts/check-families-gguf: loads a GGUF with libllama, prefills the given
// token ids in one batch, then decodes greedily, one token a step, and prints JSON in the shape of
// mlxcel-engine's family-logits example: the last position's logits after the prefill and after
// each decode step (steps + 1 vectors) and the greedy token of each (the last one not fed back).
//
//   llama-greedy MODEL.gguf ID,ID,... STEPS [NAME=VALUE...]
//
// NAME=VALUE sets one of llama_context_params' RoPE fields, as llama.cpp's --rope-*/--yarn-* flags
// set them (scripts/check-rope-overrides): rope_scaling_type (none, linear or yarn),
// rope_freq_base, rope_freq_scale, yarn_orig_ctx, yarn_ext_factor, yarn_attn_factor,
// yarn_beta_slow, yarn_beta_fast.
//
// Token ids go in as they are (no tokenizer, no BOS added), so only the forward pass is compared.
// The KV cache is f32 and flash attention off, so that llama.cpp computes in f32 throughout (its
// default f16 cache rounds every key and value). Two threads; a context of 256 positions.
// llama.cpp's INFO and DEBUG log lines are dropped unless LLAMA_GREEDY_VERBOSE is set.

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

static bool parse_ids(const char * text, std::vector<llama_token> & ids) {
    std::string s(text);
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

static bool set_rope(llama_context_params & cparams, const std::string & arg) {
    size_t eq = arg.find('=');
    if (eq == std::string::npos) {
        return false;
    }
    std::string name = arg.substr(0, eq);
    std::string value = arg.substr(eq + 1);
    char * stop = nullptr;
    if (name == "rope_scaling_type") {
        if (value == "none") {
            cparams.rope_scaling_type = LLAMA_ROPE_SCALING_TYPE_NONE;
        } else if (value == "linear") {
            cparams.rope_scaling_type = LLAMA_ROPE_SCALING_TYPE_LINEAR;
        } else if (value == "yarn") {
            cparams.rope_scaling_type = LLAMA_ROPE_SCALING_TYPE_YARN;
        } else {
            return false;
        }
        return true;
    }
    if (name == "yarn_orig_ctx") {
        long n = std::strtol(value.c_str(), &stop, 10);
        cparams.yarn_orig_ctx = (uint32_t) n;
        return *stop == '\0' && n >= 0;
    }
    float v = std::strtof(value.c_str(), &stop);
    if (value.empty() || *stop != '\0') {
        return false;
    }
    if (name == "rope_freq_base") {
        cparams.rope_freq_base = v;
    } else if (name == "rope_freq_scale") {
        cparams.rope_freq_scale = v;
    } else if (name == "yarn_ext_factor") {
        cparams.yarn_ext_factor = v;
    } else if (name == "yarn_attn_factor") {
        cparams.yarn_attn_factor = v;
    } else if (name == "yarn_beta_slow") {
        cparams.yarn_beta_slow = v;
    } else if (name == "yarn_beta_fast") {
        cparams.yarn_beta_fast = v;
    } else {
        return false;
    }
    return true;
}

static int argmax(const float * logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

int main(int argc, char ** argv) {
    std::vector<llama_token> prompt;
    if (argc < 4 || !parse_ids(argv[2], prompt)) {
        fprintf(stderr, "usage: llama-greedy MODEL.gguf ID,ID,... STEPS [NAME=VALUE...]\n");
        return 2;
    }
    const int steps = std::atoi(argv[3]);

    llama_log_set(log_warnings, std::getenv("LLAMA_GREEDY_VERBOSE"));
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (model == nullptr) {
        fprintf(stderr, "llama-greedy: llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (llama_token id : prompt) {
        if (id >= n_vocab) {
            fprintf(stderr, "llama-greedy: token %d is outside the vocabulary of %d\n", id, n_vocab);
            return 1;
        }
    }

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 256;
    cparams.n_batch = 256;
    cparams.n_ubatch = 256;
    cparams.n_threads = 2;
    cparams.n_threads_batch = 2;
    cparams.type_k = GGML_TYPE_F32;
    cparams.type_v = GGML_TYPE_F32;
    cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    for (int i = 4; i < argc; i++) {
        if (!set_rope(cparams, argv[i])) {
            fprintf(stderr, "llama-greedy: `%s` is not a RoPE setting NAME=VALUE\n", argv[i]);
            return 2;
        }
    }
    if ((int) prompt.size() + steps > (int) cparams.n_ctx) {
        fprintf(stderr, "llama-greedy: %zu prompt tokens + %d steps exceed the context of %u\n",
                prompt.size(), steps, cparams.n_ctx);
        return 1;
    }
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "llama-greedy: llama.cpp could not create a context\n");
        return 1;
    }

    std::vector<std::vector<float>> all_logits;
    std::vector<llama_token> tokens;
    std::vector<llama_token> input = prompt;
    for (;;) {
        // llama_batch_get_one asks for the last position's logits only.
        llama_batch batch = llama_batch_get_one(input.data(), (int32_t) input.size());
        int rc = llama_decode(ctx, batch);
        if (rc != 0) {
            fprintf(stderr, "llama-greedy: llama_decode returned %d\n", rc);
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        if (logits == nullptr) {
            fprintf(stderr, "llama-greedy: no logits for the last position\n");
            return 1;
        }
        all_logits.emplace_back(logits, logits + n_vocab);
        llama_token token = argmax(logits, n_vocab);
        tokens.push_back(token);
        if ((int) tokens.size() > steps) {
            break;
        }
        input.assign(1, token);
    }

    // %.9g reads back to the same f32; JSON has no NaN or infinity, which become null.
    printf("{\"engine\":\"llama.cpp\",\"prompt\":[");
    for (size_t i = 0; i < prompt.size(); i++) {
        printf("%s%d", i ? "," : "", prompt[i]);
    }
    printf("],\"tokens\":[");
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
