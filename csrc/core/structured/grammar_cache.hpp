// Grammars compiled for one vocabulary, and each request's own copy of one: its RowGrammar,
// defined in allowed_sets.hpp, since it carries the key of its state into the sets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/base/params.hpp"
#include "llama.h"

struct llama_grammar;  // vendor/llama.cpp/src/llama-grammar.h (grammar.hpp)

namespace fastpar {

// One request's constraint: its own copy of a compiled grammar (advanced by every token it
// accepts) and the allowed-token sets that every copy of that compilation shares.
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
    // With reasoning "split" the constraint applies after a thought, which must come first
    // when the prompt left one open (`thought_open`).
    GrammarPtr make(const GenerateParams & params, bool thought_open = false);

    // Whether the rows make() gives share allowed-token sets (on by default). Off, every
    // refused row masks with its grammar alone, as before the sets existed: the oracle the
    // tests compare the sets with (fastpar._testing.set_allowed_sets). Read by make(); the
    // sets computed so far stay.
    void set_allowed_sets(bool on) { allowed_sets_ = on; }
    bool allowed_sets() const { return allowed_sets_; }

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
    bool allowed_sets_ = true;
};

// Distinct grammars one GrammarCache keeps compiled; one more clears them all (rows keep
// their copies). A context keeps its cache across calls, so this bounds a long-lived
// context that sees ever new schemas.
constexpr size_t kMaxCompiledGrammars = 256;

// Bytes of allowed-token sets one GrammarCache keeps at most (docs/internals.md).
constexpr size_t kAllowedSetsBudget = size_t{64} << 20;

}  // namespace fastpar
