// Allowed-token sets by grammar state. Which tokens a grammar allows next depends on its
// state alone (grammar.hpp). JSON-schema grammars revisit a few states constantly (after a
// key, inside a string), and masking a large vocabulary costs milliseconds a row, so each
// state's set is computed once and read by every row of that compilation in that state.
// docs/internals.md, "Structured output".
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/structured/grammar.hpp"
#include "core/structured/token_tree.hpp"
#include "core/threads/pool.hpp"

namespace fastpar {

// The tokens one state allows.
struct Allowed {
    std::vector<uint64_t> bits;     // bit t: the state allows token t
    std::vector<llama_token> ids;   // every allowed token in order, when at most kListed
    size_t n_allowed = 0;
    bool allows(llama_token t) const {
        const auto u = static_cast<size_t>(t);
        return u / 64 < bits.size() && ((bits[u / 64] >> (u % 64)) & 1U) != 0;
    }
    size_t bytes() const { return bits.size() * sizeof(uint64_t) + ids.size() * sizeof(llama_token); }
};

// Sets this small also list their tokens: a refused row then chooses among them alone.
constexpr size_t kListed = 4096;

// The set `g`'s state allows: with `tree` (and `cuts`, char_cuts(g)) when tree_serves,
// otherwise with the grammar's own mask of the whole vocabulary.
std::shared_ptr<const Allowed> compute_allowed(const llama_grammar & g, const TokenTree * tree,
                                               const std::vector<uint64_t> * cuts, TaskPool * pool = nullptr);

// The sets of every compilation of one GrammarCache, keyed by (compilation, state) and
// bounded in bytes (least recently used go first).
class AllowedSets {
public:
    AllowedSets(const llama_vocab * vocab, size_t budget, int32_t mask_workers)
        : vocab_(vocab), budget_(budget), mask_workers_(mask_workers) {}

    // The vocabulary's TokenTree, built the first time a whole mask is needed.
    const TokenTree & tree();

    std::shared_ptr<const Allowed> find(const std::string & key);

    // The set of `key`, computed from `g` once: a row that asks while another computes it
    // waits for that one (rows of one step often reach the same state together).
    std::shared_ptr<const Allowed> get(const std::string & key, const llama_grammar & g, bool token_terminals,
                                       const std::vector<uint64_t> & cuts);

private:
    using Lru = std::list<std::pair<std::string, std::shared_ptr<const Allowed>>>;

    // The threads that mask one state's levels together, started with the first whole mask
    // (none without mask_workers). Under pool_mutex_.
    TaskPool * mask_pool();

    std::shared_ptr<const Allowed> find_locked(const std::string & key);

    static size_t cost(const std::string & key, const Allowed & set) { return key.size() + set.bytes() + 64; }

    void insert_locked(const std::string & key, const std::shared_ptr<const Allowed> & set);

    std::mutex mutex_;
    std::condition_variable done_;
    Lru lru_;
    std::unordered_map<std::string, Lru::iterator> index_;
    std::unordered_set<std::string> computing_;
    size_t bytes_ = 0;
    const llama_vocab * vocab_;
    const size_t budget_;
    std::once_flag tree_once_;
    std::unique_ptr<TokenTree> tree_;
    const int32_t mask_workers_;
    std::mutex pool_mutex_;
    std::unique_ptr<TaskPool> mask_pool_;
};

// A row's constraint (grammar_cache.hpp): its own copy of a compiled grammar, and the key
// of its state into the sets that every copy of that compilation shares.
struct RowGrammar {
    llama_grammar * g = nullptr;        // owned
    std::shared_ptr<AllowedSets> sets;  // null: every refusal masks with `g` alone
    uint32_t id = 0;                    // the compilation's part of the key
    bool token_terminals = false;       // its rules name tokens (<[id]>): no TokenTree
    std::shared_ptr<const std::vector<uint64_t>> cuts;  // char_cuts of the compilation's rules
    // Where each rule's elements start, by address: stack entries point into this copy's
    // rules (a copy has rules of its own), so the key names them as (rule, offset).
    std::vector<std::pair<const llama_grammar_element *, uint32_t>> rule_starts;

    ~RowGrammar();

    // The key of the current state, or false when a stack entry points outside the rules
    // (never seen; that row then masks with its grammar alone).
    bool key(std::string & out) const;

private:
    static void append(std::string & s, uint32_t v) { s.append(reinterpret_cast<const char *>(&v), sizeof v); }
};

}  // namespace fastpar
