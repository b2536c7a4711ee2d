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

#include "core/base/params.hpp"
#include "core/base/results.hpp"
#include "core/sampling/sampling.hpp"
#include "llama.h"

struct llama_grammar;  // vendor/llama.cpp/src/llama-grammar.h (structured.cpp only)

namespace fastpar {

inline bool constrained(const GenerateParams & params) { return !params.json_schema.empty() || !params.grammar.empty(); }

// Throws InvalidArgument when `schema` is not JSON, uses a feature outside the supported
// list (naming it and where), or the converter cannot turn it into a grammar. What it
// converts is kept (by text), so checking every prompt of a call costs one conversion.
void validate_json_schema(const std::string & schema);

// The GBNF that constrains `params`: its grammar, or its JSON schema converted (a schema
// that validate_json_schema rejects throws InvalidArgument).
std::string constraint_grammar(const GenerateParams & params);

// One request's constraint: its own copy of a compiled grammar (advanced by every token it
// accepts) and the allowed-token sets that every copy of that compilation shares. Defined
// in structured.cpp, which alone sees llama.cpp's grammar internals.
struct RowGrammar;
struct RowGrammarDeleter {
    void operator()(RowGrammar * g) const;
};
using GrammarPtr = std::unique_ptr<RowGrammar, RowGrammarDeleter>;

struct CompiledGrammarDeleter {
    void operator()(llama_grammar * g) const;
};

// The allowed-token sets of grammar states, keyed by (compiled grammar, state), shared by
// every row of a GrammarCache and bounded in memory (least recently used go first).
class AllowedSets;

// Grammars compiled for one vocabulary, by GBNF text: each distinct grammar is parsed once,
// and every request that uses it gets a copy, which costs a fraction of a parse
// (docs/performance.md, "Structured output"). The copies share one AllowedSets.
class GrammarCache {
public:
    // mask_workers: threads besides the caller that compute one state's whole set together
    // (StepPolicy::mask_workers); 0: the caller alone.
    explicit GrammarCache(const llama_vocab * vocab, int32_t mask_workers = 0);
    ~GrammarCache();
    // A new grammar for `params` (constrained() must hold). Throws Error naming the reason
    // when the grammar does not compile; that failure is kept too.
    GrammarPtr make(const GenerateParams & params);

private:
    struct Entry {
        std::unique_ptr<llama_grammar, CompiledGrammarDeleter> compiled;  // null: it failed, `error` says why
        std::string error;
        uint32_t id = 0;  // this compilation's part of AllowedSets' keys
        bool token_terminals = false;  // its rules name tokens (<[id]>)
        std::shared_ptr<const std::vector<uint64_t>> cuts;  // the characters its rules tell apart
    };
    const llama_vocab * vocab_;
    std::unordered_map<std::string, Entry> entries_;
    uint32_t next_id_ = 0;  // ids are never reused: AllowedSets may still hold an old one's sets
    std::shared_ptr<AllowedSets> sets_;
};

// Distinct grammars one GrammarCache keeps compiled; one more clears them all (rows keep
// their copies). A context keeps its cache across calls, so this bounds a long-lived
// context that sees ever new schemas.
constexpr size_t kMaxCompiledGrammars = 256;

// Bytes of allowed-token sets one GrammarCache keeps at most (docs/internals.md).
constexpr size_t kAllowedSetsBudget = size_t{64} << 20;

// Whether rows share allowed-token sets (on by default). Off makes every refused row mask
// with its grammar alone, as before the sets existed; fastpar._testing switches it to
// compare the two. Read when a GrammarCache makes a row's grammar.
void set_allowed_sets_enabled(bool on);
bool allowed_sets_enabled();

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

// For the benchmark (bench/bench_structured.py): what the constraint of `params` costs with
// `vocab`, walking the token sequence `tokens` (which it must allow). Milliseconds: the
// conversion to GBNF (uncached), one compile, one copy of the compiled grammar, and per
// token on average: masking the whole vocabulary, and checking one token.
struct GrammarCosts {
    double convert_ms = 0, compile_ms = 0, clone_ms = 0, mask_ms = 0, check_ms = 0;
    int32_t n_allowed_first = 0;  // tokens the grammar allows at the start
    double tree_ms = 0;        // building the vocabulary's TokenTree (once per GrammarCache)
    double mask_tree_ms = 0;   // per token: a whole mask as AllowedSets computes it
};

// For the tests: walks `steps` tokens of `params`' constraint, each drawn at random (with
// `seed`) among those the grammar allows, and at every state compares the whole mask
// AllowedSets computes (TokenTree, on `workers` threads besides the caller) with
// llama.cpp's mask of the whole vocabulary.
struct MaskComparison {
    int32_t n_states = 0;    // states walked
    int32_t n_compared = 0;  // of them, states TokenTree serves
    int32_t n_differ = 0;    // of those, states where the two masks differ
    int32_t n_partial = 0;   // of them, states with a partly decoded character
};
MaskComparison compare_masks(const llama_vocab * vocab, const GenerateParams & params, int32_t steps, uint32_t seed,
                             int32_t workers = 0);
GrammarCosts measure_grammar(const llama_vocab * vocab, const GenerateParams & params,
                             const std::vector<llama_token> & tokens);

}  // namespace fastpar
