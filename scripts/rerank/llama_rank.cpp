// llama.cpp's side of scripts/check-rerank: loads a reranker GGUF with libllama, puts the query
// and each document together with the model's rerank prompt (`tokenizer.chat_template.rerank`,
// `{query}` and `{document}` replaced, tokenized without added special tokens and with special
// tokens parsed, as llama-server's format_prompt_rerank does), runs each pair as its own sequence
// with rank pooling, and prints one JSON line per document: its token ids and its score, the
// first value of the pooled output (what llama-server's /rerank answers as relevance_score).
// A model without a rerank prompt (a BERT cross-encoder) has its pair put together as
// format_prompt_rerank's other branch does: BOS, the query, EOS (SEP without one), SEP, the
// document, EOS, each where the vocabulary adds it, the texts tokenized without special tokens.
//
//   llama-rank MODEL.gguf QUERY DOCUMENT...
//
// The KV cache is f32 and flash attention off, so that llama.cpp computes in f32 throughout. Two
// threads; a context of 512 positions. INFO and DEBUG log lines are dropped unless
// LLAMA_RANK_VERBOSE is set.

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

static void replace_all(std::string & s, const std::string & from, const std::string & to) {
    size_t at = 0;
    while ((at = s.find(from, at)) != std::string::npos) {
        s.replace(at, from.size(), to);
        at += to.size();
    }
}

static void print_json_string(const std::string & s) {
    putchar('"');
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            printf("\\%c", c);
        } else if (c < 0x20) {
            printf("\\u%04x", c);
        } else {
            putchar(c);
        }
    }
    putchar('"');
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: llama-rank MODEL.gguf QUERY DOCUMENT...\n");
        return 2;
    }
    llama_log_set(log_warnings, std::getenv("LLAMA_RANK_VERBOSE"));
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (model == nullptr) {
        fprintf(stderr, "llama-rank: llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const char * templ = llama_model_chat_template(model, "rerank");

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 512;
    cparams.n_batch = 512;
    cparams.n_ubatch = 512;
    cparams.n_seq_max = 1;
    cparams.n_threads = 2;
    cparams.n_threads_batch = 2;
    cparams.type_k = GGML_TYPE_F32;
    cparams.type_v = GGML_TYPE_F32;
    cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.embeddings = true;
    cparams.pooling_type = LLAMA_POOLING_TYPE_RANK;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "llama-rank: llama.cpp could not create a context\n");
        return 1;
    }

    const std::string query = argv[2];
    for (int d = 3; d < argc; d++) {
        std::vector<llama_token> tokens;
        auto tokenize = [&](const std::string & text, bool parse_special) {
            std::vector<llama_token> out(text.size() + 16);
            int k = llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), out.data(),
                                   (int32_t) out.size(), /*add_special*/ false, parse_special);
            if (k < 0) {
                fprintf(stderr, "llama-rank: document %d: tokenizing gave %d\n", d - 3, k);
                exit(1);
            }
            out.resize(k);
            return out;
        };
        if (templ != nullptr) {
            std::string prompt = templ;
            replace_all(prompt, "{query}", query);
            replace_all(prompt, "{document}", argv[d]);
            tokens = tokenize(prompt, true);
        } else {
            std::vector<llama_token> q = tokenize(query, false);
            std::vector<llama_token> doc = tokenize(argv[d], false);
            llama_token eos = llama_vocab_eos(vocab);
            if (eos == LLAMA_TOKEN_NULL) {
                eos = llama_vocab_sep(vocab);
            }
            if (llama_vocab_get_add_bos(vocab)) {
                tokens.push_back(llama_vocab_bos(vocab));
            }
            tokens.insert(tokens.end(), q.begin(), q.end());
            if (llama_vocab_get_add_eos(vocab)) {
                tokens.push_back(eos);
            }
            if (llama_vocab_get_add_sep(vocab)) {
                tokens.push_back(llama_vocab_sep(vocab));
            }
            tokens.insert(tokens.end(), doc.begin(), doc.end());
            if (llama_vocab_get_add_eos(vocab)) {
                tokens.push_back(eos);
            }
        }
        int n = (int) tokens.size();
        if (n > (int) cparams.n_ctx) {
            fprintf(stderr, "llama-rank: document %d: %d tokens\n", d - 3, n);
            return 1;
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_batch batch = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            batch.token[i] = tokens[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = true;
        }
        batch.n_tokens = n;
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama-rank: llama_decode failed on document %d\n", d - 3);
            return 1;
        }
        const float * out = llama_get_embeddings_seq(ctx, 0);
        if (out == nullptr) {
            fprintf(stderr, "llama-rank: no pooled output for document %d\n", d - 3);
            return 1;
        }
        printf("{\"document\":");
        print_json_string(argv[d]);
        printf(",\"tokens\":[");
        for (int i = 0; i < n; i++) {
            printf("%s%d", i ? "," : "", tokens[i]);
        }
        // %.9g reads back to the same f32.
        printf("],\"score\":%.9g}\n", out[0]);
        llama_batch_free(batch);
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
