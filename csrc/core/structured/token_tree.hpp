// One model's vocabulary arranged once for masking it whole: how the allowed-token sets
// (allowed_sets.hpp) find every token a grammar state allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/structured/grammar.hpp"
#include "core/threads/pool.hpp"

namespace fastpar {

// The vocabulary arranged for masking it whole (TokenTree::allowed). A grammar without
// token terminals (<[id]>) reads a token's text one character after another, so when it
// allows a token it allows every prefix of that token's text that ends on a whole
// character; conversely a refused prefix refuses every token that starts with it. A
// token's parent is the longest other token its text starts with that decodes to whole
// characters: tokens are masked level by level, parents first, and only the children of
// allowed tokens are read. The first level is read only for the first characters the
// grammar allows, and those are found per class of characters that its rules cannot
// tell apart (a few dozen classes, against 17,804 first characters in a 152k vocabulary).
// So a state that allows few tokens (after a key, in a number: where whole masks are
// needed) reads little of the vocabulary. Each token's text is decoded once, here: the
// grammar's own mask decodes every candidate's text into a new vector at every call,
// about half of a whole mask's time.
class TokenTree {
public:
    explicit TokenTree(const llama_vocab * vocab);

    // The tokens `g` allows, as a mask of the whole vocabulary would find them (bit t of
    // `bits`). `g` must have no token terminals (tree_serves); `cuts` is char_cuts(g). With
    // `pool`, large levels are masked in slices on its threads.
    void allowed(const llama_grammar & g, const std::vector<uint64_t> & cuts, std::vector<uint64_t> & bits,
                 TaskPool * pool = nullptr) const;

private:
    // Token t's text, decoded ahead, as the next candidate of `cur` (`index`: its place there).
    void append(llama_grammar_candidates & cur, llama_token t) const;

    // passed[i]: whether `g` allows candidate i of `cur` (whose `index` is i). What
    // llama_grammar_reject_candidates does: a candidate is refused when every stack refuses
    // it, so each stack reads only those the stacks before it refused. In slices, which
    // keeps the rejection's working vectors small and spreads `cur` over the pool's threads.
    static void reject(const llama_grammar & g, const llama_grammar_candidates & cur, std::vector<char> & passed,
                       TaskPool * pool);

    static std::string token_text(const llama_vocab * vocab, llama_token t);

    // Appends the code points the grammar reads in `s` after `from` (a character the text
    // before left unfinished, none by default), then a 0, and returns the character left
    // unfinished at its end. The grammar's rules of reading
    // (llama-grammar.cpp): a lead byte's top four bits give the sequence's length and the
    // bytes that follow are taken whatever they are; a continuation byte where a character
    // should start makes the text invalid (no code points, n_remain -1, never allowed); a
    // NUL ends the text.
    static llama_partial_utf8 decode(std::string_view s, std::vector<uint32_t> & out,
                                     llama_partial_utf8 from = llama_partial_utf8{0, 0});

    enum class Kind : uint8_t { Text, Eog, Never };
    static constexpr size_t kSlice = 4096;

    std::vector<Kind> kind_;
    std::vector<uint32_t> points_;  // every Text token's code points, each list ended by 0
    std::vector<uint32_t> first_;   // where a token's list starts in points_
    std::vector<llama_partial_utf8> partial_;  // a character its text leaves unfinished
    std::vector<llama_token> eog_;
    std::vector<uint32_t> children_start_;  // token t's children: children_[start[t], start[t + 1])
    std::vector<llama_token> children_;
    std::vector<uint32_t> leads_;        // the first characters of tokens without a parent, in order
    std::vector<uint32_t> lead_start_;   // leads_[i]'s tokens: rooted_[start[i], start[i + 1])
    std::vector<llama_token> rooted_;
    std::vector<llama_token> unlettered_;  // tokens without a parent or a whole first character
    std::vector<llama_token> continued_;   // tokens whose text starts with a continuation byte
    std::vector<uint32_t> continued_start_;  // continued_[i]'s text: continued_bytes_[start[i], start[i + 1])
    std::string continued_bytes_;
};

// Whether TokenTree::allowed may mask for `g`'s current state.
inline bool tree_serves(const llama_grammar & g, bool token_terminals) {
    return !token_terminals && !g.awaiting_trigger && g.partial_utf8.n_remain >= 0;
}

}  // namespace fastpar
