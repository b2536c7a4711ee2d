#include "core/structured/grammar.hpp"

#include <algorithm>

namespace fastpar {

void CompiledGrammarDeleter::operator()(llama_grammar * g) const { llama_grammar_free_impl(g); }

CompiledGrammar compile_grammar(const llama_vocab * vocab, const std::string & text, const char * root) {
    // llama.cpp reports parse errors on stderr and returns null; it aborts on nothing here.
    return CompiledGrammar(llama_grammar_init_impl(vocab, text.c_str(), root, false, nullptr, 0, nullptr, 0));
}

CompiledGrammar copy_grammar(const llama_grammar & g) { return CompiledGrammar(llama_grammar_clone_impl(g)); }

bool has_token_terminals(const llama_grammar & g) {
    for (const llama_grammar_rule & rule : g.rules) {
        for (const llama_grammar_element & e : rule) {
            if (e.type == LLAMA_GRETYPE_TOKEN || e.type == LLAMA_GRETYPE_TOKEN_NOT) {
                return true;
            }
        }
    }
    return false;
}

std::vector<uint64_t> char_cuts(const llama_grammar & g) {
    std::vector<uint64_t> cuts;
    for (const llama_grammar_rule & rule : g.rules) {
        for (const llama_grammar_element & e : rule) {
            if (e.type == LLAMA_GRETYPE_CHAR || e.type == LLAMA_GRETYPE_CHAR_NOT ||
                e.type == LLAMA_GRETYPE_CHAR_RNG_UPPER || e.type == LLAMA_GRETYPE_CHAR_ALT) {
                cuts.push_back(e.value);
                cuts.push_back(uint64_t{e.value} + 1);
            }
        }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    return cuts;
}

}  // namespace fastpar
