#include "core/prefix_sharing.hpp"

#include <algorithm>

namespace fastpar {

size_t common_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) {
        ++i;
    }
    return i;
}

PrefixSharing::PrefixSharing(size_t n_slots, size_t min_shared)
    : n_slots_(n_slots), min_shared_(min_shared), common_(n_slots * n_slots, 0) {}

void PrefixSharing::pair_up(size_t a, const std::vector<llama_token> & prompt_a, size_t b,
                            const std::vector<llama_token> & prompt_b) {
    common_[a * n_slots_ + b] = common_[b * n_slots_ + a] = common_prefix(prompt_a, prompt_b);
}

void PrefixSharing::decide(std::vector<SharingSlot> & slots) const {
    for (SharingSlot & s : slots) {
        s.waiting = false;
        s.copied = false;
        s.donor = -1;
    }
    for (size_t si = 0; si < slots.size(); ++si) {
        SharingSlot & s = slots[si];
        if (!s.active || !s.prefilling() || s.prompt_size <= min_shared_) {
            continue;
        }
        const size_t limit = s.prompt_size - 1;
        size_t best = s.n_fed;  // prompt positions s can hold after a copy now
        size_t donor = 0;
        bool have_donor = false;
        size_t later = 0;       // ... and after a slot ahead of it has decoded more
        for (size_t di = 0; di < slots.size(); ++di) {
            const SharingSlot & d = slots[di];
            if (di == si || !d.active) {
                continue;
            }
            const size_t c = std::min(common(si, di), limit);
            if (c < min_shared_) {
                continue;
            }
            const size_t have = std::min(c, d.n_fed);
            if (!d.copied && have > best) {
                best = have;
                donor = di;
                have_donor = true;
            }
            const bool ahead = d.n_fed > s.n_fed || (d.n_fed == s.n_fed && di < si);
            if (d.prefilling() && d.n_fed < c && ahead) {
                later = std::max(later, c);
            }
        }
        if (later >= best + min_shared_) {
            s.waiting = true;
            continue;
        }
        if (!have_donor || best < s.n_fed + min_shared_) {
            continue;
        }
        s.copied = true;
        s.donor = static_cast<int32_t>(donor);
        s.n_fed = best;
    }
}

}  // namespace fastpar
