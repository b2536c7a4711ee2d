// Structured output: a GBNF grammar, or a JSON schema turned into one by the vendored
// llama.cpp's converter (common/json-schema-to-grammar), constrains every token a prompt
// generates through llama.cpp's grammar sampler. docs/api.md lists the JSON-schema
// features supported and what happens when a constraint fails.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/params.hpp"
#include "core/sampling.hpp"
#include "llama.h"

namespace fastpar {

inline bool constrained(const GenerateParams & params) { return !params.json_schema.empty() || !params.grammar.empty(); }

// Throws InvalidArgument when `schema` is not JSON, uses a feature outside the supported
// list (naming it and where), or the converter cannot turn it into a grammar. What it
// converts is kept (by text), so checking every prompt of a call costs one conversion.
void validate_json_schema(const std::string & schema);

// The GBNF that constrains `params`: its grammar, or its JSON schema converted (a schema
// that validate_json_schema rejects throws InvalidArgument).
std::string constraint_grammar(const GenerateParams & params);

// Grammar samplers compiled for one vocabulary, by GBNF text: each distinct grammar is
// parsed once, and every request that uses it gets a copy (llama_sampler_clone), which
// costs a fraction of a parse (docs/performance.md, "Structured output").
class GrammarCache {
public:
    explicit GrammarCache(const llama_vocab * vocab) : vocab_(vocab) {}
    // A new grammar sampler for `params` (constrained() must hold). Throws Error naming
    // the reason when the grammar does not compile; that failure is kept too.
    SamplerPtr make(const GenerateParams & params);

private:
    struct Entry {
        SamplerPtr compiled;  // null: it failed, `error` says why
        std::string error;
    };
    const llama_vocab * vocab_;
    std::unordered_map<std::string, Entry> entries_;
};

// Chooses the next token of a constrained request: what sample_logits would choose with
// `chain` from `row` (a whole row of logits), among the tokens `grammar` allows only, and
// accepts it into both. The chain's own choice is checked first and kept when the grammar
// allows it (one token to check); otherwise the grammar masks the candidates and the chain
// chooses again from those it allows: for a greedy or top-k chain without penalties, only
// the best candidates are checked until enough are allowed, which gives the same token as
// masking the whole row. Throws GrammarDeadEnd when the grammar allows no token.
llama_token sample_constrained(llama_sampler * chain, llama_sampler * grammar, const GenerateParams & params,
                               const LogitRow & row, std::vector<llama_token_data> & cur);

struct GrammarDeadEnd : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// For the benchmark (bench/bench_structured.py): what the constraint of `params` costs with
// `vocab`, walking the token sequence `tokens` (which it must allow). Milliseconds: the
// conversion to GBNF (uncached), one compile, one copy of the compiled grammar, and per
// token on average: masking the whole vocabulary, and checking one token.
struct GrammarCosts {
    double convert_ms = 0, compile_ms = 0, clone_ms = 0, mask_ms = 0, check_ms = 0;
    int32_t n_allowed_first = 0;  // tokens the grammar allows at the start
};
GrammarCosts measure_grammar(const llama_vocab * vocab, const GenerateParams & params,
                             const std::vector<llama_token> & tokens);

}  // namespace fastpar
