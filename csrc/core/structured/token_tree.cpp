#include "core/structured/token_tree.hpp"

#include <algorithm>
#include <utility>

namespace fastpar {

TokenTree::TokenTree(const llama_vocab * vocab) {
    const int32_t n = llama_vocab_n_tokens(vocab);
    const auto at = [](llama_token t) { return static_cast<size_t>(t); };
    std::vector<std::string> pieces(at(n));
    std::vector<char> can_parent(at(n), 0), can_child(at(n), 0);
    kind_.assign(at(n), Kind::Text);
    first_.assign(at(n), 0);
    partial_.assign(at(n), llama_partial_utf8{0, 0});
    for (llama_token t = 0; t < n; ++t) {
        std::string & piece = pieces[at(t)];
        piece = token_text(vocab, t);
        // As the grammar's mask reads it: end-of-generation tokens by their own rule, an
        // empty text or one that starts with NUL never allowed (a NUL ends decoding).
        if (llama_vocab_is_eog(vocab, t)) {
            kind_[at(t)] = Kind::Eog;
            eog_.push_back(t);
        } else if (piece.empty() || piece[0] == '\0') {
            kind_[at(t)] = Kind::Never;
        } else {
            first_[at(t)] = static_cast<uint32_t>(points_.size());
            partial_[at(t)] = decode(piece, points_);
        }
        if (kind_[at(t)] == Kind::Text && (static_cast<uint8_t>(piece[0]) >> 6) == 2) {
            // Starts with a continuation byte: what can follow a partly decoded character.
            continued_.push_back(t);
            continued_start_.push_back(static_cast<uint32_t>(continued_bytes_.size()));
            continued_bytes_ += piece;
        }
        if (kind_[at(t)] != Kind::Text || piece.find('\0') != std::string::npos) {
            continue;
        }
        can_child[at(t)] = 1;
        can_parent[at(t)] = partial_[at(t)].n_remain == 0 ? 1 : 0;  // its text decodes to whole characters
    }
    // In the order of their texts, every token that starts with another's text comes
    // after it, before any text that does not: a stack of the texts the current one
    // starts with (the longest on top) finds each parent in one pass.
    std::vector<llama_token> order;
    order.reserve(at(n));
    for (llama_token t = 0; t < n; ++t) {
        if (can_child[at(t)] != 0) {
            order.push_back(t);
        }
    }
    std::sort(order.begin(), order.end(),
              [&](llama_token x, llama_token y) { return pieces[at(x)] < pieces[at(y)]; });
    std::vector<llama_token> parent(at(n), -1);
    std::vector<llama_token> above;
    for (const llama_token t : order) {
        const std::string_view text = pieces[at(t)];
        while (!above.empty()) {
            const std::string_view up = pieces[at(above.back())];
            if (up.size() < text.size() && text.compare(0, up.size(), up) == 0) {
                break;
            }
            above.pop_back();
        }
        if (!above.empty()) {
            parent[at(t)] = above.back();
        }
        if (can_parent[at(t)] != 0) {
            above.push_back(t);
        }
    }
    // Children of each token, and the tokens without a parent by their first character.
    children_start_.assign(at(n) + 1, 0);
    for (llama_token t = 0; t < n; ++t) {
        if (kind_[at(t)] == Kind::Text && parent[at(t)] >= 0) {
            ++children_start_[at(parent[at(t)]) + 1];
        }
    }
    for (size_t i = 0; i < at(n); ++i) {
        children_start_[i + 1] += children_start_[i];
    }
    children_.resize(children_start_[at(n)]);
    std::vector<uint32_t> fill(children_start_.begin(), children_start_.end() - 1);
    for (llama_token t = 0; t < n; ++t) {
        if (kind_[at(t)] == Kind::Text && parent[at(t)] >= 0) {
            children_[fill[at(parent[at(t)])]++] = t;
        }
    }
    std::vector<std::pair<uint32_t, llama_token>> roots;  // (first character, token)
    for (llama_token t = 0; t < n; ++t) {
        if (kind_[at(t)] != Kind::Text || parent[at(t)] >= 0) {
            continue;
        }
        const uint32_t c = points_[first_[at(t)]];
        if (c == 0 && partial_[at(t)].n_remain < 0) {
            continue;  // invalid from a fresh start (a continuation byte first): never allowed there
        }
        if (c == 0) {
            unlettered_.push_back(t);  // no whole first character: always read
        } else {
            roots.emplace_back(c, t);
        }
    }
    std::sort(roots.begin(), roots.end());
    for (const auto & [c, t] : roots) {
        if (leads_.empty() || leads_.back() != c) {
            leads_.push_back(c);
            lead_start_.push_back(static_cast<uint32_t>(rooted_.size()));
        }
        rooted_.push_back(t);
    }
    lead_start_.push_back(static_cast<uint32_t>(rooted_.size()));
    continued_start_.push_back(static_cast<uint32_t>(continued_bytes_.size()));
}

void TokenTree::allowed(const llama_grammar & g, const std::vector<uint64_t> & cuts, std::vector<uint64_t> & bits,
                        TaskPool * pool) const {
    const auto set = [&](llama_token t) {
        bits[static_cast<size_t>(t) / 64] |= uint64_t{1} << (static_cast<size_t>(t) % 64);
    };
    if (g.stacks.empty()) {
        return;  // nothing can follow (accepting a token into it throws before this)
    }
    // The end of generation: when the grammar may end here (llama_grammar_apply_impl).
    if (std::any_of(g.stacks.begin(), g.stacks.end(), [](const llama_grammar_stack & s) { return s.empty(); })) {
        for (const llama_token t : eog_) {
            set(t);
        }
    }
    if (g.partial_utf8.n_remain > 0) {
        // A partly decoded character: a token whose text does not start with a
        // continuation byte is invalid there, so only those that do are read, each
        // decoded from the partial character.
        std::vector<uint32_t> points;
        std::vector<size_t> first(continued_.size());
        std::vector<llama_partial_utf8> partial(continued_.size());
        for (size_t i = 0; i < continued_.size(); ++i) {
            first[i] = points.size();
            const std::string_view text(continued_bytes_.data() + continued_start_[i],
                                        continued_start_[i + 1] - continued_start_[i]);
            partial[i] = decode(text, points, g.partial_utf8);
        }
        llama_grammar_candidates cur;
        for (size_t i = 0; i < continued_.size(); ++i) {
            cur.push_back(llama_grammar_candidate{i, points.data() + first[i], partial[i], continued_[i]});
        }
        std::vector<char> passed;
        reject(g, cur, passed, pool);
        for (size_t i = 0; i < cur.size(); ++i) {
            if (passed[i] != 0) {
                set(cur[i].id);
            }
        }
        return;
    }
    // The first characters allowed: the first characters of tokens between two cuts
    // form a class the rules match alike, and one of each class, read alone, answers
    // for it. A class's tokens are one run of rooted_ (sorted by first character).
    std::vector<uint32_t> class_points;    // one character of each class, then 0
    std::vector<size_t> class_leads{0};  // class k: leads_[class_leads[k], class_leads[k + 1])
    for (const uint64_t cut : cuts) {
        const auto at = static_cast<size_t>(std::lower_bound(leads_.begin(), leads_.end(), cut) - leads_.begin());
        if (at > class_leads.back()) {
            class_leads.push_back(at);
        }
    }
    if (leads_.size() > class_leads.back()) {
        class_leads.push_back(leads_.size());
    }
    llama_grammar_candidates cur;
    for (size_t k = 0; k + 1 < class_leads.size(); ++k) {
        class_points.push_back(leads_[class_leads[k]]);
        class_points.push_back(0);
    }
    // Filled first: the candidates point into class_points.
    for (size_t k = 0; k + 1 < class_leads.size(); ++k) {
        cur.push_back(llama_grammar_candidate{k, class_points.data() + 2 * k, llama_partial_utf8{0, 0}, -1});
    }
    std::vector<char> passed;
    reject(g, cur, passed, pool);
    // The first level: tokens without a parent whose first character is allowed.
    cur.clear();
    for (size_t k = 0; k + 1 < class_leads.size(); ++k) {
        if (passed[k] != 0) {
            for (uint32_t j = lead_start_[class_leads[k]]; j < lead_start_[class_leads[k + 1]]; ++j) {
                append(cur, rooted_[j]);
            }
        }
    }
    for (const llama_token t : unlettered_) {
        append(cur, t);
    }
    // Level after level: the children of the tokens allowed in the one before.
    llama_grammar_candidates next;
    while (!cur.empty()) {
        reject(g, cur, passed, pool);
        next.clear();
        for (size_t i = 0; i < cur.size(); ++i) {
            if (passed[i] == 0) {
                continue;
            }
            const llama_token t = cur[i].id;
            set(t);
            for (uint32_t j = children_start_[static_cast<size_t>(t)]; j < children_start_[static_cast<size_t>(t) + 1]; ++j) {
                append(next, children_[j]);
            }
        }
        cur.swap(next);
    }
}

void TokenTree::append(llama_grammar_candidates & cur, llama_token t) const {
    const auto u = static_cast<size_t>(t);
    cur.push_back(llama_grammar_candidate{cur.size(), points_.data() + first_[u], partial_[u], t});
}

void TokenTree::reject(const llama_grammar & g, const llama_grammar_candidates & cur, std::vector<char> & passed,
                       TaskPool * pool) {
    passed.assign(cur.size(), 1);
    const auto one = [&](size_t i) {
        const size_t from = i * kSlice;
        const size_t to = std::min(cur.size(), from + kSlice);
        llama_grammar_candidates slice(cur.begin() + static_cast<std::ptrdiff_t>(from),
                                       cur.begin() + static_cast<std::ptrdiff_t>(to));
        for (const llama_grammar_stack & stack : g.stacks) {
            slice = llama_grammar_reject_candidates_for_stack(g.rules, stack, slice);
            if (slice.empty()) {
                break;
            }
        }
        for (const llama_grammar_candidate & c : slice) {
            passed[c.index] = 0;
        }
    };
    const size_t n_slices = (cur.size() + kSlice - 1) / kSlice;
    if (pool != nullptr && n_slices > 1) {
        pool->run(n_slices, one);
    } else {
        for (size_t i = 0; i < n_slices; ++i) {
            one(i);
        }
    }
}

std::string TokenTree::token_text(const llama_vocab * vocab, llama_token t) {
    // The text the grammar's mask reads: special tokens as text, no space stripped.
    std::string out(16, '\0');
    int32_t got = llama_token_to_piece(vocab, t, out.data(), static_cast<int32_t>(out.size()), 0, true);
    if (got < 0) {
        out.resize(static_cast<size_t>(-got));
        got = llama_token_to_piece(vocab, t, out.data(), static_cast<int32_t>(out.size()), 0, true);
    }
    out.resize(static_cast<size_t>(std::max(got, 0)));
    return out;
}

llama_partial_utf8 TokenTree::decode(std::string_view s, std::vector<uint32_t> & out, llama_partial_utf8 from) {
    static const int length[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
    const size_t start = out.size();
    uint32_t value = from.value;
    int n_remain = from.n_remain;
    size_t i = 0;
    // A character the text before left unfinished: continuation bytes finish it.
    while (i < s.size() && s[i] != '\0' && n_remain > 0) {
        const auto next = static_cast<uint8_t>(s[i]);
        if ((next >> 6) != 2) {
            out.push_back(0);
            return llama_partial_utf8{0, -1};
        }
        value = (value << 6) + (next & 0x3FU);
        ++i;
        --n_remain;
    }
    if (from.n_remain > 0 && n_remain == 0) {
        out.push_back(value);
    }
    while (i < s.size() && s[i] != '\0') {
        const auto lead = static_cast<uint8_t>(s[i]);
        n_remain = length[lead >> 4] - 1;
        if (n_remain < 0) {
            out.resize(start);
            out.push_back(0);
            return llama_partial_utf8{0, -1};
        }
        value = lead & ((1U << (7 - n_remain)) - 1);
        ++i;
        while (i < s.size() && s[i] != '\0' && n_remain > 0) {
            value = (value << 6) + (static_cast<uint8_t>(s[i]) & 0x3FU);
            ++i;
            --n_remain;
        }
        if (n_remain == 0) {
            out.push_back(value);
        }
    }
    out.push_back(0);
    return llama_partial_utf8{value, n_remain};
}

}  // namespace fastpar
