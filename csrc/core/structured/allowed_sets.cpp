#include "core/structured/allowed_sets.hpp"

#include <algorithm>
#include <bitset>
#include <cmath>
#include <functional>

namespace fastpar {

std::shared_ptr<const Allowed> compute_allowed(const llama_grammar & g, const TokenTree * tree,
                                               const std::vector<uint64_t> * cuts, TaskPool * pool) {
    const int32_t n_vocab = llama_vocab_n_tokens(g.vocab);
    auto out = std::make_shared<Allowed>();
    out->bits.assign((static_cast<size_t>(n_vocab) + 63) / 64, 0);
    if (tree != nullptr) {
        tree->allowed(g, *cuts, out->bits, pool);
    } else {
        std::vector<llama_token_data> all(static_cast<size_t>(n_vocab));
        for (int32_t t = 0; t < n_vocab; ++t) {
            all[static_cast<size_t>(t)] = llama_token_data{t, 0.0f, 0.0f};
        }
        llama_token_data_array a{all.data(), all.size(), -1, false};
        llama_grammar_apply_impl(g, &a);  // what the grammar sampler's mask does
        for (size_t t = 0; t < all.size(); ++t) {
            if (all[t].logit != -INFINITY) {
                out->bits[t / 64] |= uint64_t{1} << (t % 64);
            }
        }
    }
    // A word of 64 tokens at a time: most words of a set that lists its tokens are 0.
    for (const uint64_t word : out->bits) {
        out->n_allowed += std::bitset<64>(word).count();
    }
    if (out->n_allowed <= kListed) {
        out->ids.reserve(out->n_allowed);
        for (size_t w = 0; w < out->bits.size(); ++w) {
            for (size_t b = 0; b < 64 && out->bits[w] >> b != 0; ++b) {
                if (((out->bits[w] >> b) & 1U) != 0) {
                    out->ids.push_back(static_cast<llama_token>(w * 64 + b));
                }
            }
        }
    }
    return out;
}

const TokenTree & AllowedSets::tree() {
    std::call_once(tree_once_, [&] { tree_ = std::make_unique<TokenTree>(vocab_); });
    return *tree_;
}

std::shared_ptr<const Allowed> AllowedSets::find(const std::string & key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return find_locked(key);
}

std::shared_ptr<const Allowed> AllowedSets::get(const std::string & key, const llama_grammar & g, bool token_terminals,
                                                const std::vector<uint64_t> & cuts) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        if (auto found = find_locked(key)) {
            return found;
        }
        if (computing_.count(key) == 0) {
            break;
        }
        done_.wait(lock);
    }
    computing_.insert(key);
    lock.unlock();
    std::shared_ptr<const Allowed> set;
    try {
        if (tree_serves(g, token_terminals)) {
            // On the mask pool when no other set is being computed on it.
            std::unique_lock<std::mutex> pool_free(pool_mutex_, std::try_to_lock);
            set = compute_allowed(g, &tree(), &cuts, pool_free.owns_lock() ? mask_pool() : nullptr);
        } else {
            set = compute_allowed(g, nullptr, nullptr);
        }
    } catch (...) {
        lock.lock();
        computing_.erase(key);
        done_.notify_all();
        throw;
    }
    lock.lock();
    computing_.erase(key);
    insert_locked(key, set);
    done_.notify_all();
    return set;
}

TaskPool * AllowedSets::mask_pool() {
    if (mask_workers_ <= 0) {
        return nullptr;
    }
    if (!mask_pool_) {
        mask_pool_ = std::make_unique<TaskPool>(mask_workers_);
    }
    return mask_pool_.get();
}

std::shared_ptr<const Allowed> AllowedSets::find_locked(const std::string & key) {
    auto it = index_.find(key);
    if (it == index_.end()) {
        return nullptr;
    }
    lru_.splice(lru_.begin(), lru_, it->second);  // most recently used first
    return it->second->second;
}

void AllowedSets::insert_locked(const std::string & key, const std::shared_ptr<const Allowed> & set) {
    if (index_.count(key) != 0) {
        return;
    }
    lru_.emplace_front(key, set);
    index_.emplace(key, lru_.begin());
    bytes_ += cost(key, *set);
    while (bytes_ > budget_ && lru_.size() > 1) {  // rows still reading one hold it
        const auto & last = lru_.back();
        bytes_ -= cost(last.first, *last.second);
        index_.erase(last.first);
        lru_.pop_back();
    }
}

RowGrammar::~RowGrammar() { llama_grammar_free_impl(g); }

bool RowGrammar::key(std::string & out) const {
    thread_local std::vector<std::string> stacks;
    stacks.resize(g->stacks.size());
    const std::less<const llama_grammar_element *> before;
    for (size_t i = 0; i < g->stacks.size(); ++i) {
        std::string & s = stacks[i];
        s.clear();
        for (const llama_grammar_element * e : g->stacks[i]) {
            auto it = std::upper_bound(rule_starts.begin(), rule_starts.end(), e,
                                       [&](const llama_grammar_element * p, const auto & r) { return before(p, r.first); });
            if (it == rule_starts.begin()) {
                return false;
            }
            --it;
            const llama_grammar_rule & rule = g->rules[it->second];
            if (!before(e, rule.data() + rule.size())) {
                return false;
            }
            append(s, it->second);
            append(s, static_cast<uint32_t>(e - rule.data()));
        }
    }
    // The state is the set of stacks: their order depends on the path that led there.
    std::sort(stacks.begin(), stacks.end());
    out.clear();
    append(out, id);
    append(out, g->partial_utf8.value);
    append(out, static_cast<uint32_t>(g->partial_utf8.n_remain));
    for (const std::string & s : stacks) {
        append(out, static_cast<uint32_t>(s.size()));
        out += s;
    }
    return true;
}

}  // namespace fastpar
