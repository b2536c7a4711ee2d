// Prompt scoring (GenerateParams::prompt_logprobs): each prompt token's log-probability
// given the tokens before it, read from rows of logits the prompt's own chunks ask for
// (row p scores token p + 1), so that long texts are scored chunk by chunk across steps
// like any prompt. A slot keeps one PromptScoring; the scheduler asks for its rows while
// building a batch and scores them after the decode (score_rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/base/params.hpp"
#include "core/base/results.hpp"
#include "core/model/model.hpp"
#include "core/threads/pool.hpp"
#include "llama.h"

namespace fastpar {

struct Slot;

struct PromptScoring {
    // Every prompt token, the last one included even when it is never decoded
    // (max_tokens = 0); empty: the request scores nothing.
    std::vector<llama_token> tokens;
    size_t from = 0;  // the first token scored (GenerateParams::prompt_logprobs_from)
    // Set while building a batch: its rows of logits follow one another.
    int32_t i_row = -1;     // batch index of its first row
    int32_t n_rows = 0;     // rows it scores prompt tokens with
    size_t first_pos = 0;   // prompt position of its first row

    bool on() const { return !tokens.empty(); }
    // Whether the row of prompt position p scores a token (token p + 1).
    bool scores(size_t p) const { return on() && p + 1 >= from && p + 1 < tokens.size(); }
    // Most positions the slot may copy from another (prefix_sharing.hpp): those whose
    // logits score a token it decodes itself.
    size_t max_copy() const { return on() ? from - 1 : SIZE_MAX; }
    // Batch index `i`, of prompt position `p`, is one of its rows.
    void add_row(int32_t i, size_t p) {
        if (n_rows++ == 0) {
            i_row = i;
            first_pos = p;
        }
    }
};

// Gives `completion` the prompt arrays of scoring `tokens` with `params`
// (prompt_logprobs): every log-probability NaN until scored.
void init_prompt_logprobs(Completion & completion, const std::vector<llama_token> & tokens,
                          const GenerateParams & params);

// A position's top_logprobs entries from top_logprobs()' (token, log-probability) pairs,
// each with its text: the one place both generated and prompt tokens get theirs.
std::vector<TopLogprob> top_logprob_entries(const Model & model,
                                            const std::vector<std::pair<llama_token, float>> & top);

// After a decode: the log-probability of every token the slots of `group` score in it and
// whether it was the most likely, into their completions; rows are shared out over `pool`
// (may be null), and the time they take counts as sampling in `stats`.
void score_rows(const std::vector<Slot *> & group, llama_context * ctx, const Model & model, TaskPool * pool,
                Stats & stats);

}  // namespace fastpar
