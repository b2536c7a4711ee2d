#include "core/structured/constrained_choice.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "core/base/errors.hpp"
#include "core/structured/allowed_sets.hpp"
#include "core/structured/grammar.hpp"

namespace fastpar {

void count(Stats & stats, ConstrainedWay way) {
    switch (way) {
        case ConstrainedWay::Kept: ++stats.n_grammar_kept; break;
        case ConstrainedWay::Top: ++stats.n_grammar_top; break;
        case ConstrainedWay::Wider: ++stats.n_grammar_wider; break;
        case ConstrainedWay::Whole: ++stats.n_grammar_whole; break;
        case ConstrainedWay::Cached: ++stats.n_grammar_cached; break;
        case ConstrainedWay::None: break;
    }
}

bool allows(const llama_grammar & grammar, llama_token token) {
    llama_token_data d{token, 0.0f, 0.0f};
    llama_token_data_array a{&d, 1, -1, false};
    llama_grammar_apply_impl(grammar, &a);
    return d.logit != -INFINITY;
}

void accept_token(llama_grammar & grammar, llama_token token) {
    try {
        llama_grammar_accept_impl(grammar, token);
    } catch (const std::exception & e) {
        // "Unexpected empty grammar stack": the grammar has no state left to go on from.
        throw GrammarDeadEnd(std::string("the grammar failed on the chosen token: ") + e.what());
    }
}

size_t mask(const llama_grammar & grammar, const Allowed * set, std::vector<llama_token_data> & cur, size_t from,
            size_t to) {
    if (set == nullptr) {
        llama_token_data_array a{cur.data() + from, to - from, -1, false};
        llama_grammar_apply_impl(grammar, &a);
    }
    size_t kept = from;
    for (size_t i = from; i < to; ++i) {
        if (cur[i].logit != -INFINITY && (set == nullptr || set->allows(cur[i].id))) {
            cur[kept++] = cur[i];
        }
    }
    return kept - from;
}

namespace {

void accept_both(llama_sampler * chain, llama_grammar & grammar, llama_token token) {
    accept_token(grammar, token);
    llama_sampler_accept(chain, token);
}

float logit_at(const LogitRow & row, size_t t) { return std::isnan(row.logits[t]) ? -INFINITY : row.logits[t]; }

// Candidates checked first when the chain keeps only the best few (greedy or top-k).
constexpr size_t kFirstChecked = 256;

}  // namespace

llama_token sample_constrained(llama_sampler * chain, RowGrammar & rg, const ChainShape & shape,
                               const LogitRow & row, std::vector<llama_token_data> & cur, ConstrainedWay & way_out) {
    way_out = ConstrainedWay::None;  // until a token is accepted
    ConstrainedWay way = ConstrainedWay::None;
    if (row.blocks != nullptr) {
        throw Error("a constrained request needs the whole row of logits");  // DeviceSampling::serves
    }
    llama_grammar & grammar = *rg.g;
    thread_local std::string key;
    const bool keyed = rg.sets && rg.key(key);
    std::shared_ptr<const Allowed> set = keyed ? rg.sets->find(key) : nullptr;
    const llama_token first = sample_logits(chain, shape, row, cur, false);
    if (set ? set->allows(first) : allows(grammar, first)) {
        accept_both(chain, grammar, first);
        way_out = ConstrainedWay::Kept;
        return first;
    }
    way = set ? ConstrainedWay::Cached : ConstrainedWay::Top;
    // The state's set, computed now (a whole mask, once for every row that comes here).
    const auto whole_set = [&]() {
        set = rg.sets->get(key, grammar, rg.token_terminals, *rg.cuts);
        way = ConstrainedWay::Whole;
    };
    // Mask, then let the chain choose among the allowed candidates.
    const auto n = static_cast<size_t>(row.n);
    size_t n_allowed = 0;
    const bool best_few = shape.keeps_best() > 0;
    const size_t need = shape.greedy ? 1 : static_cast<size_t>(std::max(shape.top_k, 1));
    const size_t head = std::max(kFirstChecked, 4 * need);
    if (!set && best_few && n > head + need) {
        // The chain keeps the `need` best allowed tokens: once that many of the best
        // candidates are allowed, the rest of the row cannot change its choice. So the
        // grammar masks the `head` best first (found without ranking the whole row); the
        // state's set is computed (when sets are on) only if too few of them pass.
        if (best_candidates(row, head, cur)) {
            n_allowed = mask(grammar, nullptr, cur, 0, cur.size());
        }
    }
    if (!set && keyed && n_allowed < need) {
        whole_set();
    }
    if (n_allowed >= need && !set) {
        // Chosen among the best candidates (ranked by best_candidates).
    } else if (set && set->n_allowed <= kListed) {
        // Few allowed tokens: the chain chooses among them alone, in token order, which is
        // what masking the whole row gives.
        cur.clear();
        for (const llama_token t : set->ids) {
            const float x = logit_at(row, static_cast<size_t>(t));
            if (x != -INFINITY) {
                cur.push_back(llama_token_data{t, x, 0.0f});
            }
        }
        n_allowed = cur.size();
    } else if (set && shape.argmax()) {
        // Greedy: the largest allowed logit, the lowest id among equals (one pass).
        llama_token best = -1;
        float best_x = -INFINITY;
        for (size_t t = 0; t < n; ++t) {
            const float x = row.logits[t];  // a NaN is never larger
            if (x > best_x && set->allows(static_cast<llama_token>(t))) {
                best_x = x;
                best = static_cast<llama_token>(t);
            }
        }
        cur.clear();
        if (best >= 0) {
            cur.push_back(llama_token_data{best, best_x, 0.0f});
        }
        n_allowed = cur.size();
    } else if (set) {
        // Every allowed token, in token order: what masking the whole row leaves.
        cur.clear();
        for (size_t t = 0; t < n; ++t) {
            const float x = logit_at(row, t);
            if (x != -INFINITY && set->allows(static_cast<llama_token>(t))) {
                cur.push_back(llama_token_data{static_cast<llama_token>(t), x, 0.0f});
            }
        }
        n_allowed = cur.size();
    } else {
        // No set (they are off, or the state has no key): the grammar masks the row.
        cur.resize(n);
        for (size_t t = 0; t < n; ++t) {
            cur[t] = llama_token_data{static_cast<llama_token>(t), logit_at(row, t), 0.0f};
        }
        n_allowed = 0;
        way = ConstrainedWay::Whole;
        if (best_few && n > head + need) {
            // In stages 16 times as large, best first, until enough pass (the first stage
            // again: it passed too few).
            size_t done = 0;
            for (size_t end_ = head; done < n && n_allowed < need; end_ *= 16) {
                const size_t end = std::min(n, end_);
                std::nth_element(cur.begin() + static_cast<std::ptrdiff_t>(done),
                                 cur.begin() + static_cast<std::ptrdiff_t>(end - 1), cur.end(), better);
                const size_t passed = mask(grammar, nullptr, cur, done, end);
                std::copy(cur.begin() + static_cast<std::ptrdiff_t>(done),
                          cur.begin() + static_cast<std::ptrdiff_t>(done + passed),
                          cur.begin() + static_cast<std::ptrdiff_t>(n_allowed));
                n_allowed += passed;
                way = end == n ? ConstrainedWay::Whole : ConstrainedWay::Wider;
                done = end;
            }
        } else {
            n_allowed = mask(grammar, nullptr, cur, 0, n);
        }
    }
    if (n_allowed == 0) {
        throw GrammarDeadEnd("the grammar allows no token here (a dead end): the output so far cannot be completed");
    }
    cur.resize(n_allowed);
    const llama_token token = apply_chain(chain, cur, false, false);
    accept_both(chain, grammar, token);
    way_out = way;
    return token;
}

}  // namespace fastpar
