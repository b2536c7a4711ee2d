#include "core/loop/prefix_cache.hpp"

#include <algorithm>

#include "core/loop/prefix_sharing.hpp"

namespace fastpar {

PrefixCache::PrefixCache(size_t n_slots, int64_t budget_bytes, size_t min_tokens)
    : min_tokens_(std::max<size_t>(1, min_tokens)), budget_(std::max<int64_t>(0, budget_bytes)), held_(n_slots), held_since_(n_slots, 0) {
    stats_.budget_bytes = budget_;
}

void PrefixCache::hold(size_t seq, std::vector<llama_token> tokens) {
    held_[seq] = std::move(tokens);
    held_since_[seq] = ++clock_;
    update_counts();
}

void PrefixCache::release(size_t seq) {
    if (!held_[seq].empty()) {
        held_[seq].clear();
        update_counts();
    }
}

CacheMatch PrefixCache::longest_on_host(const std::vector<llama_token> & prompt, size_t limit) const {
    CacheMatch best;
    for (size_t i = 0; i < host_.size(); ++i) {
        const size_t n = std::min(common_prefix(prompt, host_[i].tokens), limit);
        if (n > best.n) {
            best.n = n;
            best.host = static_cast<int32_t>(i);
        }
    }
    return best;
}

bool PrefixCache::worth_saving(size_t seq, size_t kept) const {
    const std::vector<llama_token> & t = held_[seq];
    if (budget_ == 0 || t.size() < min_tokens_) {
        return false;
    }
    // A sequence most of which another slot or entry holds too (the same few-shot prefix
    // with another short question) would spend the budget on copies of one prefix.
    size_t covered = kept;
    for (size_t s = 0; s < held_.size(); ++s) {
        if (s != seq) {
            covered = std::max(covered, common_prefix(t, held_[s]));
        }
    }
    for (const HostEntry & e : host_) {
        covered = std::max(covered, common_prefix(t, e.tokens));
    }
    const size_t unique = t.size() - covered;
    return unique >= min_tokens_ && unique * 2 >= t.size();
}

bool PrefixCache::save(llama_context * ctx, size_t seq) {
    const auto id = static_cast<llama_seq_id>(seq);
    const size_t size = llama_state_seq_get_size(ctx, id);
    if (size == 0 || static_cast<int64_t>(size) > budget_) {
        return false;
    }
    // Entries the new one extends (an earlier turn of the same conversation) are superseded.
    for (size_t i = host_.size(); i-- > 0;) {
        if (common_prefix(host_[i].tokens, held_[seq]) == host_[i].tokens.size()) {
            drop_host(i);
        }
    }
    evict_to(static_cast<int64_t>(size));
    HostEntry e;
    e.state.resize(size);
    if (llama_state_seq_get_data(ctx, e.state.data(), size, id) != size) {
        update_counts();
        return false;
    }
    e.tokens = held_[seq];
    e.last_used = ++clock_;
    host_.push_back(std::move(e));
    {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.n_saved;
    }
    update_counts();
    return true;
}

bool PrefixCache::restore(llama_context * ctx, int32_t host, size_t seq) {
    HostEntry & e = host_[static_cast<size_t>(host)];
    const size_t n = llama_state_seq_set_data(ctx, e.state.data(), e.state.size(), static_cast<llama_seq_id>(seq));
    if (n == 0) {
        llama_memory_seq_rm(llama_get_memory(ctx), static_cast<llama_seq_id>(seq), -1, -1);
        drop_host(static_cast<size_t>(host));
        update_counts();
        return false;
    }
    e.last_used = ++clock_;
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.n_restored;
    return true;
}

void PrefixCache::count_hit(size_t n) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.n_hits;
    stats_.n_tokens_reused += static_cast<int64_t>(n);
}

void PrefixCache::evict_to(int64_t bytes_free) {
    int64_t used = 0;
    for (const HostEntry & e : host_) {
        used += static_cast<int64_t>(e.state.size());
    }
    while (!host_.empty() && used + bytes_free > budget_) {
        const auto lru = std::min_element(host_.begin(), host_.end(), [](const HostEntry & a, const HostEntry & b) {
            return a.last_used < b.last_used;
        });
        used -= static_cast<int64_t>(lru->state.size());
        drop_host(static_cast<size_t>(lru - host_.begin()));
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.n_evicted;
    }
}

void PrefixCache::drop_host(size_t i) {
    host_.erase(host_.begin() + static_cast<std::ptrdiff_t>(i));
}

void PrefixCache::clear(llama_context * ctx) {
    host_.clear();
    host_.shrink_to_fit();
    for (size_t seq = 0; seq < held_.size(); ++seq) {
        if (!held_[seq].empty()) {
            llama_memory_seq_rm(llama_get_memory(ctx), static_cast<llama_seq_id>(seq), -1, -1);
            held_[seq].clear();
        }
    }
    update_counts();
}

void PrefixCache::update_counts() {
    int64_t slots = 0, tokens = 0, host_tokens = 0, bytes = 0;
    for (const auto & h : held_) {
        slots += h.empty() ? 0 : 1;
        tokens += static_cast<int64_t>(h.size());
    }
    for (const HostEntry & e : host_) {
        host_tokens += static_cast<int64_t>(e.tokens.size());
        bytes += static_cast<int64_t>(e.state.size());
    }
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.n_slots_held = slots;
    stats_.n_tokens_held = tokens;
    stats_.n_host_entries = static_cast<int64_t>(host_.size());
    stats_.n_host_tokens = host_tokens;
    stats_.bytes_host = bytes;
}

PrefixCacheStats PrefixCache::stats() const {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    return stats_;
}

}  // namespace fastpar
