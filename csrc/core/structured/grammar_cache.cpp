#include "core/structured/grammar_cache.hpp"

#include <algorithm>
#include <cctype>
#include <functional>
#include <utility>

#include "core/base/errors.hpp"
#include "core/structured/allowed_sets.hpp"
#include "core/structured/grammar.hpp"
#include "core/structured/reasoning.hpp"
#include "core/structured/schema.hpp"

namespace fastpar {

void RowGrammarDeleter::operator()(RowGrammar * g) const { delete g; }

namespace {

// Advances `g` by the tokens of `text` (special tokens parsed), as llama.cpp's sampler
// primes a tool-call grammar with the generation prompt; false when it does not fit. A
// first token that only adds a leading space the text does not have is skipped, as there.
bool advance(llama_grammar & g, const llama_vocab * vocab, const std::string & text) {
    std::vector<llama_token> tokens(text.size() + 2);
    const int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                                     static_cast<int32_t>(tokens.size()), /*add_special=*/false, /*parse_special=*/true);
    if (n < 0) {
        return false;
    }
    for (int32_t i = 0; i < n; ++i) {
        if (i == 0) {
            char piece[8];
            const int32_t len = llama_token_to_piece(vocab, tokens[0], piece, sizeof(piece), 0, true);
            if (len > 0 && std::isspace(static_cast<unsigned char>(piece[0])) &&
                !std::isspace(static_cast<unsigned char>(text[0]))) {
                continue;
            }
        }
        try {
            accept_token(g, tokens[static_cast<size_t>(i)]);
        } catch (const std::exception &) {
            return false;
        }
    }
    return true;
}

}  // namespace

GrammarCache::GrammarCache(const llama_vocab * vocab, int32_t mask_workers)
    : vocab_(vocab), sets_(std::make_shared<AllowedSets>(vocab, kAllowedSetsBudget, mask_workers)) {}
GrammarCache::~GrammarCache() = default;

GrammarPtr GrammarCache::make(const GenerateParams & params, bool thought_open) {
    const bool reasoned = params.reasoning == "split";
    std::string text = constraint_grammar(params);
    if (reasoned) {  // its root is kReasonedRoot, and its text tells it from the plain one
        text = reasoning_grammar(text, thought_open);
    }
    // With a prefill, a compilation of its own, advanced past the prefill once.
    const std::string & prefill = params.grammar_prefill;
    const std::string key = prefill.empty() ? text : text + std::string("\0prefill\0", 9) + prefill;
    auto it = entries_.find(key);
    if (it == entries_.end()) {
        if (entries_.size() >= kMaxCompiledGrammars) {
            entries_.clear();
        }
        Entry e;
        e.id = next_id_++;
        if (!text.empty()) {
            e.compiled = compile_grammar(vocab_, text, reasoned ? kReasonedRoot : "root");
        }
        if (e.compiled && !prefill.empty() && !advance(*e.compiled, vocab_, prefill)) {
            e.compiled.reset();
            e.error = "the tool-call grammar does not start with the chat template's generation prompt";
        }
        if (e.compiled) {
            e.token_terminals = has_token_terminals(*e.compiled);
            e.cuts = std::make_shared<const std::vector<uint64_t>>(char_cuts(*e.compiled));
        } else if (e.error.empty()) {
            e.error = std::string(!params.grammar.empty() ? "grammar"
                                  : !params.choice.empty() ? "the grammar made from choice"
                                  : !params.regex.empty()  ? "the grammar converted from regex"
                                                           : "the grammar converted from json_schema") +
                      " does not compile: it does not parse as GBNF, names an undefined rule, is left-recursive"
                      " or has no 'root' rule (llama.cpp's message is on stderr)";
        }
        it = entries_.emplace(key, std::move(e)).first;
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
