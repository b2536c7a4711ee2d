// Choosing a constrained request's next token: the sampler chain's own choice when the
// grammar allows it, else the chain's choice among the tokens the grammar allows, found
// with the allowed-token sets (allowed_sets.hpp) or the grammar's own mask.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/base/params.hpp"
#include "core/base/results.hpp"
#include "core/sampling/sampling.hpp"
#include "core/structured/grammar_cache.hpp"
#include "llama.h"

namespace fastpar {

// How a constrained row's token was chosen; Stats counts each (docs/api.md).
enum class ConstrainedWay : uint8_t {
    None,    // not a constrained row, or it failed
    Kept,    // the chain's own choice, which the grammar allowed
    Top,     // refused; an allowed token among the best 256 candidates the grammar masked
    Wider,   // refused; the grammar masked larger stages (allowed sets off)
    Whole,   // refused; the grammar masked the whole vocabulary (with the sets on: a state's first time)
    Cached,  // refused; chosen with the state's allowed set, computed before
};
void count(Stats & stats, ConstrainedWay way);

// Chooses the next token of a constrained request: what sample_logits would choose with
// `chain` from `row` (a whole row of logits), among the tokens `grammar` allows only, and
// accepts it into both. The chain's own choice is checked first and kept when the grammar
// allows it (one token to check); otherwise the grammar masks the candidates and the chain
// chooses again from those it allows: for a greedy or top-k chain without penalties, only
// the best candidates are checked until enough are allowed, which gives the same token as
// masking the whole row (up to exact ties of logits). A state whose best candidates are all
// refused has its whole allowed set computed once and kept (AllowedSets): every row in that
// state later reads it instead of masking. Throws GrammarDeadEnd when the grammar allows no
// token. `way` says how the token was chosen.
llama_token sample_constrained(llama_sampler * chain, RowGrammar & grammar, const ChainShape & shape,
                               const LogitRow & row, std::vector<llama_token_data> & cur, ConstrainedWay & way);

struct GrammarDeadEnd : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace fastpar
