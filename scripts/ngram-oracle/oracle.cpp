// Drives llama.cpp's own speculative proposers (common_speculative, from the reference build's
// common library) over known greedy continuations, the way llama-server drives them for one
// slot, and prints every draft: the oracle scripts/check-ngram-proposers compares mlxcel's
// hashed n-gram proposers (mlxcel_engine::hashed_drafts) with.
//
//   oracle TYPES MAPK_N MAPK_M MAPK_HITS K4V_N K4V_M K4V_HITS MOD_MATCH MOD_MIN MOD_MAX < streams
//
// stdin: pairs of lines "prompt T T ..." and "output T T ..."; stdout: per stream "stream",
// then per step "step HISTORY_LEN D D ..." (the draft, possibly empty), then "end".
// Each stream runs on a fresh common_speculative (a fresh server).

#include "common.h"
#include "log.h"
#include "speculative.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static llama_tokens read_tokens(const std::string & line, const char * tag) {
    std::istringstream in(line);
    std::string word;
    in >> word;
    if (word != tag) {
        fprintf(stderr, "expected a line starting with '%s'\n", tag);
        exit(2);
    }
    llama_tokens tokens;
    long t;
    while (in >> t) {
        tokens.push_back((llama_token) t);
    }
    return tokens;
}

int main(int argc, char ** argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: %s TYPES MAPK_N MAPK_M MAPK_HITS K4V_N K4V_M K4V_HITS MOD_MATCH MOD_MIN MOD_MAX\n", argv[0]);
        return 2;
    }
    common_log_set_verbosity_thold(-1);
    common_params_speculative params;
    params.types = common_speculative_types_from_names(string_split<std::string>(argv[1], ','));
    params.ngram_map_k.size_n     = atoi(argv[2]);
    params.ngram_map_k.size_m     = atoi(argv[3]);
    params.ngram_map_k.min_hits   = atoi(argv[4]);
    params.ngram_map_k4v.size_n   = atoi(argv[5]);
    params.ngram_map_k4v.size_m   = atoi(argv[6]);
    params.ngram_map_k4v.min_hits = atoi(argv[7]);
    params.ngram_mod.n_match      = atoi(argv[8]);
    params.ngram_mod.n_min        = atoi(argv[9]);
    params.ngram_mod.n_max        = atoi(argv[10]);

    std::string prompt_line, output_line;
    while (std::getline(std::cin, prompt_line) && std::getline(std::cin, output_line)) {
        const llama_tokens prompt = read_tokens(prompt_line, "prompt");
        const llama_tokens output = read_tokens(output_line, "output");
        common_speculative * spec = common_speculative_init(params, 1);
        if (spec == nullptr) {
            fprintf(stderr, "no speculative implementation for '%s'\n", argv[1]);
            return 2;
        }
        printf("stream\n");
        common_speculative_begin(spec, 0, prompt);
        llama_tokens tokens = prompt;
        tokens.push_back(output[0]);
        size_t i = 1;
        while (i + 1 < output.size()) {
            llama_tokens history(tokens.begin(), tokens.end() - 1);
            llama_tokens draft;
            auto & dp = common_speculative_get_draft_params(spec, 0);
            dp.drafting = true;
            dp.n_max    = (int32_t) (output.size() - i - 1);
            dp.pos0     = (llama_pos) history.size();
            dp.id_last  = tokens.back();
            dp.prompt   = &history;
            dp.result   = &draft;
            common_speculative_draft(spec);
            size_t accepted = 0;
            while (accepted < draft.size() && draft[accepted] == output[i + accepted]) {
                accepted++;
            }
            printf("step %zu", history.size());
            for (auto t : draft) {
                printf(" %d", t);
            }
            printf("\n");
            if (!draft.empty()) {
                common_speculative_accept(spec, 0, (uint16_t) accepted);
            }
            tokens.insert(tokens.end(), output.begin() + i, output.begin() + i + accepted + 1);
            i += accepted + 1;
        }
        printf("end\n");
        common_speculative_free(spec);
    }
    return 0;
}
