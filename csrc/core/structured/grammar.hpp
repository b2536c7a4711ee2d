// llama.cpp's grammar as the grammar engine's units use it, inside: the one header that
// includes llama.cpp's internal src/llama-grammar.h. A grammar's state is its stacks
// (pointers into its rules) and a partly decoded UTF-8 character, which llama.h's sampler
// API hides; the allowed-token sets key on that state and the token tree reads the rules.
// The vendored llama.cpp is pinned (scripts/vendor_llama.py): a version that changes these
// declarations fails to compile here, the signal to check that the state key still names
// the whole state (allowed_sets.hpp). Outside csrc/core/structured/, only the test module's
// probes include this header; they call the functions below, never llama.cpp's own, which
// libfastpar keeps private.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/structured/grammar_cache.hpp"
#include "llama-grammar.h"
#include "llama.h"

namespace fastpar {

struct Allowed;

using CompiledGrammar = std::unique_ptr<llama_grammar, CompiledGrammarDeleter>;

// Compiling and copying (grammar.cpp). `text`'s GBNF with its rule "root"; null when it
// does not compile (llama.cpp's reason is on stderr).
CompiledGrammar compile_grammar(const llama_vocab * vocab, const std::string & text, const char * root = "root");
// A copy of `g` in its current state, with rules of its own; null when it fails.
CompiledGrammar copy_grammar(const llama_grammar & g);

// Properties of a compilation's rules (grammar.cpp), computed once per compilation.
// Whether its rules name tokens (<[id]>): the token tree reads text only.
bool has_token_terminals(const llama_grammar & g);
// Where the characters its rules tell apart change: every character element compares a
// character with its value, so characters between two consecutive cuts (each value and
// value + 1) are matched alike. Sorted.
std::vector<uint64_t> char_cuts(const llama_grammar & g);

// One row's grammar, token by token (constrained_choice.cpp, beside their caller there).
// Whether `grammar` allows `token` next (one candidate through its mask).
bool allows(const llama_grammar & grammar, llama_token token);
// Advances `grammar` by `token`; throws GrammarDeadEnd when it has no state left to go on from.
void accept_token(llama_grammar & grammar, llama_token token);
// Moves the allowed candidates of cur[from, to) (in order) to the front of that range;
// returns how many there are. With `set`, allowed means in it; otherwise the grammar masks.
// A candidate whose logit is -inf never counts (a mask leaves it so).
size_t mask(const llama_grammar & grammar, const Allowed * set, std::vector<llama_token_data> & cur, size_t from,
            size_t to);

}  // namespace fastpar
