// The grammar engine's probes: what a constraint costs, and whether the allowed-token
// sets' whole masks equal llama.cpp's. They walk a grammar with the engine's own functions
// (core/structured/grammar.hpp), which libfastpar exports.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>

#include "core/base/errors.hpp"
#include "core/structured/allowed_sets.hpp"
#include "core/structured/grammar.hpp"
#include "core/structured/schema.hpp"
#include "core/structured/token_tree.hpp"
#include "core/threads/pool.hpp"
#include "testing/probes.hpp"

namespace fastpar {

GrammarCosts measure_grammar(const Model & model, const GenerateParams & params,
                             const std::vector<llama_token> & tokens) {
    using clock = std::chrono::steady_clock;
    const auto ms = [](clock::time_point t0) {
        return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    };
    GrammarCosts c;
    auto t0 = clock::now();
    // A schema or regex converted here, uncached: the first sight's cost.
    const std::string text = !params.json_schema.empty() ? convert_json_schema(params.json_schema)
                             : !params.regex.empty()     ? regex_grammar(params.regex)
                                                         : constraint_grammar(params);
    c.convert_ms = ms(t0);
    t0 = clock::now();
    CompiledGrammar compiled = compile_grammar(model.vocab(), text);
    c.compile_ms = ms(t0);
    if (!compiled) {
        throw InvalidArgument("the grammar does not compile");
    }
    constexpr int kClones = 20;
    t0 = clock::now();
    for (int i = 0; i < kClones; ++i) {
        CompiledGrammar copy = copy_grammar(*compiled);
    }
    c.clone_ms = ms(t0) / kClones;
    const int32_t n_vocab = model.n_vocab();
    std::vector<llama_token_data> cur(static_cast<size_t>(n_vocab));
    // The same walk with the masks TokenTree gives (AllowedSets' whole masks).
    llama_grammar & walk = *compiled;
    t0 = clock::now();
    const TokenTree tree(model.vocab());
    c.tree_ms = ms(t0);
    const bool token_terminals = has_token_terminals(walk);
    const std::vector<uint64_t> cuts = char_cuts(walk);
    std::vector<uint64_t> bits;
    for (size_t k = 0; k < tokens.size(); ++k) {
        t0 = clock::now();
        if (tree_serves(walk, token_terminals)) {
            bits.assign((static_cast<size_t>(n_vocab) + 63) / 64, 0);
            tree.allowed(walk, cuts, bits);
        } else {
            std::shared_ptr<const Allowed> whole = compute_allowed(walk, nullptr, nullptr);
        }
        c.mask_tree_ms += ms(t0);
        cur.resize(static_cast<size_t>(n_vocab));
        for (int32_t t = 0; t < n_vocab; ++t) {
            cur[static_cast<size_t>(t)] = llama_token_data{t, 0.0f, 0.0f};
        }
        // The grammar's mask of the whole vocabulary, as a refused row without a set uses it.
        t0 = clock::now();
        const size_t n_allowed = mask(walk, nullptr, cur, 0, cur.size());
        c.mask_ms += ms(t0);
        if (k == 0) {
            c.n_allowed_first = static_cast<int32_t>(n_allowed);
        }
        t0 = clock::now();
        const bool ok = allows(walk, tokens[k]);
        c.check_ms += ms(t0);
        if (!ok) {
            throw InvalidArgument("the grammar does not allow token " + std::to_string(k) + " of the sequence");
        }
        accept_token(walk, tokens[k]);
    }
    if (!tokens.empty()) {
        c.mask_ms /= static_cast<double>(tokens.size());
        c.mask_tree_ms /= static_cast<double>(tokens.size());
        c.check_ms /= static_cast<double>(tokens.size());
    }
    return c;
}

MaskComparison compare_masks(const Model & model, const GenerateParams & params, int32_t steps, uint32_t seed,
                             int32_t workers) {
    const std::string text = constraint_grammar(params);
    CompiledGrammar g = compile_grammar(model.vocab(), text);
    if (!g) {
        throw InvalidArgument("the grammar does not compile");
    }
    const TokenTree tree(model.vocab());
    const bool token_terminals = has_token_terminals(*g);
    const std::vector<uint64_t> cuts = char_cuts(*g);
    std::unique_ptr<TaskPool> pool = workers > 0 ? std::make_unique<TaskPool>(workers) : nullptr;
    std::mt19937 rng(seed);
    MaskComparison out;
    for (int32_t step = 0; step < steps; ++step) {
        const std::shared_ptr<const Allowed> whole = compute_allowed(*g, nullptr, nullptr);
        if (tree_serves(*g, token_terminals)) {
            const std::shared_ptr<const Allowed> pruned = compute_allowed(*g, &tree, &cuts, pool.get());
            ++out.n_compared;
            if (pruned->bits != whole->bits) {
                ++out.n_differ;
            }
        }
        ++out.n_states;
        // On with a token the grammar allows, drawn at random (noise, as from a model with
        // random weights); the end of generation only when nothing else is left.
        std::vector<llama_token> next;
        for (size_t t = 0; t < whole->bits.size() * 64; ++t) {
            const auto id = static_cast<llama_token>(t);
            if (whole->allows(id) && !model.is_eog(id)) {
                next.push_back(id);
            }
        }
        if (next.empty()) {
            break;
        }
        out.n_partial += g->partial_utf8.n_remain != 0 ? 1 : 0;
        accept_token(*g, next[rng() % next.size()]);
    }
    return out;
}

}  // namespace fastpar
