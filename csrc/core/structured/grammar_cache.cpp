#include "core/structured/grammar_cache.hpp"

#include <algorithm>
#include <functional>
#include <utility>

#include "core/base/errors.hpp"
#include "core/structured/allowed_sets.hpp"
#include "core/structured/grammar.hpp"
#include "core/structured/reasoning.hpp"
#include "core/structured/schema.hpp"

namespace fastpar {

void RowGrammarDeleter::operator()(RowGrammar * g) const { delete g; }

GrammarCache::GrammarCache(const llama_vocab * vocab, int32_t mask_workers)
    : vocab_(vocab), sets_(std::make_shared<AllowedSets>(vocab, kAllowedSetsBudget, mask_workers)) {}
GrammarCache::~GrammarCache() = default;

GrammarPtr GrammarCache::make(const GenerateParams & params, bool thought_open) {
    const bool reasoned = params.reasoning == "split";
    std::string text = constraint_grammar(params);
    if (reasoned) {  // its root is kReasonedRoot, and its text tells it from the plain one
        text = reasoning_grammar(text, thought_open);
    }
    auto it = entries_.find(text);
    if (it == entries_.end()) {
        if (entries_.size() >= kMaxCompiledGrammars) {
            entries_.clear();
        }
        Entry e;
        e.id = next_id_++;
        if (!text.empty()) {
            e.compiled = compile_grammar(vocab_, text, reasoned ? kReasonedRoot : "root");
        }
        if (e.compiled) {
            e.token_terminals = has_token_terminals(*e.compiled);
            e.cuts = std::make_shared<const std::vector<uint64_t>>(char_cuts(*e.compiled));
        } else {
            e.error = std::string(!params.grammar.empty() ? "grammar"
                                  : !params.choice.empty() ? "the grammar made from choice"
                                  : !params.regex.empty()  ? "the grammar converted from regex"
                                                           : "the grammar converted from json_schema") +
                      " does not compile: it does not parse as GBNF, names an undefined rule, is left-recursive"
                      " or has no 'root' rule (llama.cpp's message is on stderr)";
        }
        it = entries_.emplace(text, std::move(e)).first;
    }
    if (!it->second.compiled) {
        throw Error(it->second.error);
    }
    GrammarPtr row(new RowGrammar);
    row->g = copy_grammar(*it->second.compiled).release();
    if (row->g == nullptr) {
        throw Error("could not copy a compiled grammar");
    }
    row->id = it->second.id;
    row->token_terminals = it->second.token_terminals;
    row->cuts = it->second.cuts;
    if (allowed_sets_) {
        row->sets = sets_;
        for (size_t r = 0; r < row->g->rules.size(); ++r) {
            if (!row->g->rules[r].empty()) {
                row->rule_starts.emplace_back(row->g->rules[r].data(), static_cast<uint32_t>(r));
            }
        }
        std::sort(row->rule_starts.begin(), row->rule_starts.end(), [](const auto & a, const auto & b) {
            return std::less<const llama_grammar_element *>()(a.first, b.first);
        });
    }
    return row;
}

}  // namespace fastpar
