#include "core/sampling/sampling.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define FASTPAR_SSE2 1
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#define FASTPAR_NEON 1
#endif

#include "core/base/errors.hpp"

namespace fastpar {

uint32_t resolve_seed(const GenerateParams & params) {
    if (params.seed >= 0) {
        return static_cast<uint32_t>(params.seed);
    }
    std::random_device rd;
    return rd();
}

void SamplerDeleter::operator()(llama_sampler * s) const { llama_sampler_free(s); }

namespace {

// A row of logits is scanned in blocks whose largest value is found with vector max
// instructions (four lanes, four accumulators); only the blocks that can matter are then
// read one logit at a time. With a 152k vocabulary and hundreds of rows a step on a GPU,
// the plain loop was the larger part of host sampling.
constexpr int32_t kArgmaxBlock = 256;
// Top-k's blocks: narrow in a short row (device sampling's 8,192 candidates), so that
// the k reaching blocks are few of them; as wide as argmax's in a whole vocabulary, where
// finding the maxima is most of the work.
constexpr int32_t kTopKBlock = 64;
constexpr int32_t kTopKWideRow = 65536;

// The largest of x[0..n), n > 0 (a NaN may be passed over).
float max_of(const float * x, int32_t n) {
    int32_t i = 1;
    float m = x[0];
#if defined(FASTPAR_SSE2)
    if (n >= 16) {
        __m128 a = _mm_loadu_ps(x), b = _mm_loadu_ps(x + 4), c = _mm_loadu_ps(x + 8), d = _mm_loadu_ps(x + 12);
        for (i = 16; i + 16 <= n; i += 16) {
            a = _mm_max_ps(a, _mm_loadu_ps(x + i));
            b = _mm_max_ps(b, _mm_loadu_ps(x + i + 4));
            c = _mm_max_ps(c, _mm_loadu_ps(x + i + 8));
            d = _mm_max_ps(d, _mm_loadu_ps(x + i + 12));
        }
        float lanes[4];
        _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d)));
        m = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
    }
#elif defined(FASTPAR_NEON)
    if (n >= 16) {
        float32x4_t a = vld1q_f32(x), b = vld1q_f32(x + 4), c = vld1q_f32(x + 8), d = vld1q_f32(x + 12);
        for (i = 16; i + 16 <= n; i += 16) {
            a = vmaxq_f32(a, vld1q_f32(x + i));
            b = vmaxq_f32(b, vld1q_f32(x + i + 4));
            c = vmaxq_f32(c, vld1q_f32(x + i + 8));
            d = vmaxq_f32(d, vld1q_f32(x + i + 12));
        }
        m = vmaxvq_f32(vmaxq_f32(vmaxq_f32(a, b), vmaxq_f32(c, d)));
    }
#endif
    for (; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

// How many `width`-wide blocks a row of n logits has (the last may be shorter).
size_t block_count(int32_t n, int32_t width) { return static_cast<size_t>((n + width - 1) / width); }

// The largest logit of block i of the `width`-wide blocks of x[0..n) (NaN counts as -inf).
float block_max(const float * x, int32_t n, int32_t width, size_t i) {
    const auto b = static_cast<int32_t>(i) * width;
    const float m = max_of(x + b, std::min(width, n - b));
    return m == m ? m : -INFINITY;
}

struct Maxima {
    const float * data;
    size_t n;
    size_t size() const { return n; }
    float operator[](size_t i) const { return data[i]; }
};

// The largest logit of each `width`-wide block of the row: those computed ahead
// (row.maxima, choose_split), or computed now in this thread's buffer, which the next
// call reuses.
Maxima block_maxima(const LogitRow & row, int32_t width) {
    const size_t n = block_count(row.n, width);
    if (row.maxima != nullptr && row.blocks == nullptr && width == kArgmaxBlock) {
        return Maxima{row.maxima, n};
    }
    thread_local std::vector<float> maxima;
    maxima.resize(n);
    for (size_t i = 0; i < n; ++i) {
        maxima[i] = block_max(row.logits, row.n, width, i);
    }
    return Maxima{maxima.data(), n};
}

// Blocks of a whole row's first pass that one item of choose_split reads (64 KB).
constexpr size_t kSplitBlocks = 64;

// Appends to `cur` every logit of x[b..end) at or above `reach` (never a NaN), in order,
// as candidates of `row`. Four logits are compared at a time: in a whole vocabulary the
// blocks read here hold about one such logit each, and a compare-and-branch per logit was
// most of the top-k pass after the block maxima (bench/c/choose_row.cpp measures it).
void append_reaching(const float * x, int32_t b, int32_t end, float reach, const LogitRow & row,
                     std::vector<llama_token_data> & cur) {
    int32_t j = b;
#if defined(FASTPAR_SSE2)
    const __m128 r = _mm_set1_ps(reach);
    for (; j + 4 <= end; j += 4) {
        const int mask = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x + j), r));
        for (int lane = 0; mask != 0 && lane < 4; ++lane) {
            if ((mask >> lane) & 1) {
                cur.push_back(llama_token_data{row.id(j + lane), x[j + lane], 0.0f});
            }
        }
    }
#elif defined(FASTPAR_NEON)
    const float32x4_t r = vdupq_n_f32(reach);
    for (; j + 4 <= end; j += 4) {
        if (vmaxvq_u32(vcgeq_f32(vld1q_f32(x + j), r)) == 0) {
            continue;
        }
        for (int32_t t = j; t < j + 4; ++t) {
            if (x[t] >= reach) {
                cur.push_back(llama_token_data{row.id(t), x[t], 0.0f});
            }
        }
    }
#endif
    for (; j < end; ++j) {
        if (x[j] >= reach) {  // never a NaN
            cur.push_back(llama_token_data{row.id(j), x[j], 0.0f});
        }
    }
}

// The greedy sampler's choice: the largest logit, the lowest token id among equals.
llama_token argmax(const LogitRow & row) {
    const float * x = row.logits;
    const Maxima maxima = block_maxima(row, kArgmaxBlock);
    float best = -INFINITY;
    size_t best_block = maxima.size();
    for (size_t i = 0; i < maxima.size(); ++i) {
        if (maxima[i] > best) {
            best = maxima[i];
            best_block = i;
        }
    }
    if (best_block < maxima.size() && row.blocks == nullptr) {
        // Ids follow positions: the first one equal to the largest.
        const auto b = static_cast<int32_t>(best_block) * kArgmaxBlock;
        const int32_t end = std::min(b + kArgmaxBlock, row.n);
        for (int32_t t = b; t < end; ++t) {
            if (x[t] == best) {
                return t;
            }
        }
    } else if (best_block < maxima.size()) {
        // Blocks need not come in id order: the lowest id of all equal to the largest,
        // read one logit at a time only in the blocks whose maximum it is (usually one).
        llama_token t_best = -1;
        for (size_t i = best_block; i < maxima.size(); ++i) {
            if (maxima[i] != best) {
                continue;
            }
            const auto b = static_cast<int32_t>(i) * kArgmaxBlock;
            const int32_t end = std::min(b + kArgmaxBlock, row.n);
            for (int32_t j = b; j < end; ++j) {
                if (x[j] == best && (t_best < 0 || row.id(j) < t_best)) {
                    t_best = row.id(j);
                }
            }
        }
        return t_best;
    }
    // Rows of -inf or NaN: one logit at a time, as the greedy sampler does.
    int32_t j_best = 0;
    for (int32_t j = 1; j < row.n; ++j) {
        if (x[j] > x[j_best]) {
            j_best = j;
        }
    }
    return row.id(j_best);
}

}  // namespace

bool better(const llama_token_data & a, const llama_token_data & b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

llama_token apply_chain(llama_sampler * chain, std::vector<llama_token_data> & cur, bool sorted, bool accept) {
    llama_token_data_array cur_p = {cur.data(), cur.size(), -1, sorted};
    llama_sampler_apply(chain, &cur_p);
    if (cur_p.selected < 0 || cur_p.selected >= static_cast<int64_t>(cur_p.size)) {
        throw Error("the sampler chain selected no token");
    }
    const llama_token token = cur_p.data[cur_p.selected].id;
    if (accept) {
        llama_sampler_accept(chain, token);
    }
    return token;
}

bool best_candidates(const LogitRow & row, size_t k, std::vector<llama_token_data> & cur) {
    // Every block's largest logit first (NaN counts as -inf): k blocks reach the k-th
    // largest of these maxima, so at least k logits do, and the k best are all at or above
    // it. Only the blocks whose maximum reaches it (k of them, more on ties) are read one
    // logit at a time, and only their logits that reach it (about k to 2k) are ranked.
    const float * x = row.logits;
    const int32_t width = row.n >= kTopKWideRow ? kArgmaxBlock : kTopKBlock;
    const Maxima maxima = block_maxima(row, width);
    const size_t n_blocks = maxima.size();
    thread_local std::vector<float> scratch;
    float reach = -INFINITY;
    if (n_blocks > k) {
        scratch.assign(maxima.data, maxima.data + n_blocks);
        std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1), scratch.end(),
                         std::greater<float>());
        reach = scratch[k - 1];
    }
    cur.clear();
    for (size_t i = 0; i < n_blocks; ++i) {
        if (maxima[i] < reach) {
            continue;
        }
        const auto b = static_cast<int32_t>(i) * width;
        append_reaching(x, b, std::min(b + width, row.n), reach, row, cur);
    }
    if (cur.empty()) {
        // A row of NaNs: the first k, in their order, for the chain to make what it can of.
        for (int32_t j = 0; j < row.n && cur.size() < k; ++j) {
            cur.push_back(llama_token_data{row.id(j), x[j], 0.0f});
        }
        return false;
    }
    if (cur.size() > k) {
        std::nth_element(cur.begin(), cur.begin() + static_cast<std::ptrdiff_t>(k - 1), cur.end(), better);
        cur.resize(k);
    }
    std::sort(cur.begin(), cur.end(), better);
    return true;
}

llama_token sample_logits(llama_sampler * chain, const ChainShape & shape, const LogitRow & row,
                          std::vector<llama_token_data> & cur, bool accept) {
    const float * x = row.logits;
    if (shape.argmax()) {
        const llama_token best = argmax(row);
        if (accept) {
            llama_sampler_accept(chain, best);
        }
        return best;
    }
    bool sorted = false;
    const int32_t k = shape.keeps_best();  // top-k's k, or 0 (a greedy chain chose above)
    if (k > 0 && (k < row.n || row.blocks != nullptr)) {
        // The k best logits, best first: what the chain's top-k sampler would keep, so it
        // and the rest of the chain see the same candidates.
        if (!best_candidates(row, static_cast<size_t>(k), cur)) {
            return apply_chain(chain, cur, false, accept);
        }
        sorted = true;
    } else if (row.blocks == nullptr) {
        cur.resize(static_cast<size_t>(row.n));
        for (llama_token t = 0; t < row.n; ++t) {
            cur[static_cast<size_t>(t)] = llama_token_data{t, x[t], 0.0f};
        }
    } else {
        throw Error("this sampler chain needs the whole row of logits, not the device's candidates");
    }
    return apply_chain(chain, cur, sorted, accept);
}

bool splits(const ChainShape & shape, const LogitRow & row) {
    // sample_logits' argmax and its top-k pass over a whole row of at least kTopKWideRow
    // logits: both start from the row's kArgmaxBlock-wide block maxima.
    const int32_t k = shape.keeps_best();
    return row.blocks == nullptr && row.n >= kTopKWideRow && k > 0 && k < row.n;
}

void choose_split(TaskPool & pool, std::vector<LogitRow> & rows, std::vector<float> & buffer,
                  const std::function<void(size_t)> & pick) {
    const size_t n_rows = rows.size();
    // Row i's parts are items first_item[i] .. first_item[i + 1] - 1; its maxima start at
    // buffer[at[i]].
    std::vector<size_t> first_item(n_rows + 1, 0), at(n_rows, 0);
    size_t n_floats = 0;
    for (size_t i = 0; i < n_rows; ++i) {
        const size_t nb = block_count(rows[i].n, kArgmaxBlock);
        at[i] = n_floats;
        n_floats += nb;
        first_item[i + 1] = first_item[i] + (nb + kSplitBlocks - 1) / kSplitBlocks;
    }
    buffer.resize(n_floats);
    std::unique_ptr<std::atomic<size_t>[]> parts_left(new std::atomic<size_t>[n_rows]);
    for (size_t i = 0; i < n_rows; ++i) {
        parts_left[i].store(first_item[i + 1] - first_item[i]);
        rows[i].maxima = buffer.data() + at[i];
    }
    pool.run(first_item[n_rows], [&](size_t item) {
        const auto i = static_cast<size_t>(std::upper_bound(first_item.begin(), first_item.end(), item) -
                                           first_item.begin()) - 1;
        const LogitRow & row = rows[i];
        const size_t part = item - first_item[i];
        const size_t end = std::min(block_count(row.n, kArgmaxBlock), (part + 1) * kSplitBlocks);
        float * out = buffer.data() + at[i];
        for (size_t b = part * kSplitBlocks; b < end; ++b) {
            out[b] = block_max(row.logits, row.n, kArgmaxBlock, b);
        }
        // The last part of a row: every other part's maxima are visible after this.
        if (parts_left[i].fetch_sub(1, std::memory_order_acq_rel) == 1) {
            pick(i);
        }
    });
}

float token_logprob(const float * logits, int32_t n_vocab, llama_token token) {
    float max = logits[0];
    for (int32_t i = 1; i < n_vocab; ++i) {
        max = std::max(max, logits[i]);
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += std::exp(static_cast<double>(logits[i] - max));
    }
    return static_cast<float>(static_cast<double>(logits[token] - max) - std::log(sum));
}

void score_token(const float * logits, int32_t n_vocab, llama_token token, float & logprob, bool & greedy) {
    float max = logits[0];
    int32_t argmax = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > max) {
            max = logits[i];
            argmax = i;
        }
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += expf(logits[i] - max);
    }
    logprob = static_cast<float>(static_cast<double>(logits[token] - max) - std::log(sum));
    greedy = argmax == token;
}

void top_logprobs(const float * logits, int32_t n_vocab, int32_t k, std::vector<std::pair<llama_token, float>> & out) {
    out.clear();
    k = std::min(k, n_vocab);
    if (k <= 0) {
        return;
    }
    // One pass keeps the k best in `out` (k <= kMaxTopLogprobs: insertion is cheap), and
    // the row's maximum and log-sum-exp come from a second.
    const auto better = [](const std::pair<llama_token, float> & a, const std::pair<llama_token, float> & b) {
        return a.second > b.second || (a.second == b.second && a.first < b.first);
    };
    for (int32_t i = 0; i < n_vocab; ++i) {
        const std::pair<llama_token, float> cand{i, logits[i]};
        if (static_cast<int32_t>(out.size()) == k && !better(cand, out.back())) {
            continue;
        }
        if (static_cast<int32_t>(out.size()) == k) {
            out.pop_back();
        }
        out.insert(std::upper_bound(out.begin(), out.end(), cand, better), cand);
    }
    const float max = out.front().second;
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += std::exp(static_cast<double>(logits[i] - max));
    }
    const double log_sum = std::log(sum);
    for (auto & e : out) {
        e.second = static_cast<float>(static_cast<double>(e.second - max) - log_sum);
    }
}

namespace {

// allowed_token_ids as a sampler: every other candidate's logit becomes -inf. A mask of the
// vocabulary (a byte a token) rather than a logit-bias entry for each banned token, which
// would hold the whole vocabulary per request.
struct AllowedTokens {
    std::vector<char> mask;
};

const char * allowed_name(const llama_sampler * /*smpl*/) { return "fastpar-allowed-tokens"; }

void allowed_apply(llama_sampler * smpl, llama_token_data_array * cur_p) {
    const auto & mask = static_cast<const AllowedTokens *>(smpl->ctx)->mask;
    for (size_t i = 0; i < cur_p->size; ++i) {
        llama_token_data & d = cur_p->data[i];
        if (d.id < 0 || static_cast<size_t>(d.id) >= mask.size() || !mask[static_cast<size_t>(d.id)]) {
            d.logit = -std::numeric_limits<float>::infinity();
            cur_p->sorted = false;
        }
    }
}

void allowed_free(llama_sampler * smpl) { delete static_cast<AllowedTokens *>(smpl->ctx); }

llama_sampler * allowed_tokens_sampler(const std::vector<int32_t> & tokens, int32_t n_vocab) {
    static llama_sampler_i iface = {
        /* .name              = */ allowed_name,
        /* .accept            = */ nullptr,
        /* .apply             = */ allowed_apply,
        /* .reset             = */ nullptr,
        /* .clone             = */ nullptr,
        /* .free              = */ allowed_free,
        /* .backend_init      = */ nullptr,
        /* .backend_accept    = */ nullptr,
        /* .backend_apply     = */ nullptr,
        /* .backend_set_input = */ nullptr,
        /* .backend_reset     = */ nullptr,
        /* .copy_state        = */ nullptr,
    };
    auto state = std::make_unique<AllowedTokens>();
    state->mask.assign(static_cast<size_t>(n_vocab), 0);
    for (const int32_t token : tokens) {
        if (token < 0 || token >= n_vocab) {  // refusal() answers this per prompt
            throw InvalidArgument("allowed_token_ids holds " + std::to_string(token) + ", outside the vocabulary");
        }
        state->mask[static_cast<size_t>(token)] = 1;
    }
    llama_sampler * s = llama_sampler_init(&iface, state.get());
    if (s != nullptr) {
        state.release();  // the sampler owns it from here
    }
    return s;
}

}  // namespace

SamplerPtr make_sampler(const GenerateParams & p, uint32_t seed, int32_t n_vocab) {
    llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    SamplerPtr chain(llama_sampler_chain_init(cp));
    if (!chain) {
        throw Error("could not create a sampler chain");
    }
    auto add = [&](llama_sampler * s) {
        if (s == nullptr) {
            throw Error("could not create a sampler");
        }
        llama_sampler_chain_add(chain.get(), s);  // the chain owns it from here
    };
    const ChainShape shape = ChainShape::of(p);
    if (shape.bias) {  // first, as llama.cpp's common sampler puts it
        // One entry a token, the sum of its entries: llama.cpp's sampler adds every entry of a
        // token in a row of the whole vocabulary but only the first in a shorter one.
        std::map<int32_t, float> sums;
        for (const auto & [token, value] : p.logit_bias) {
            if (token >= n_vocab) {  // refusal() answers this per prompt; llama.cpp would index past the row
                throw InvalidArgument("logit_bias names token " + std::to_string(token) + ", outside the vocabulary");
            }
            sums[token] += value;
        }
        if (!sums.empty()) {
            std::vector<llama_logit_bias> bias;
            for (const auto & [token, value] : sums) {
                bias.push_back({token, value});
            }
            add(llama_sampler_init_logit_bias(n_vocab, static_cast<int32_t>(bias.size()), bias.data()));
        }
        if (!p.allowed_token_ids.empty()) {
            add(allowed_tokens_sampler(p.allowed_token_ids, n_vocab));
        }
    }
    if (shape.penalties) {
        add(llama_sampler_init_penalties(n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                                         p.presence_penalty));
    }
    if (shape.greedy) {
        add(llama_sampler_init_greedy());
        return chain;
    }
    if (shape.top_k > 0) {
        add(llama_sampler_init_top_k(shape.top_k));
    }
    if (p.top_p < 1.0f) {
        add(llama_sampler_init_top_p(p.top_p, 1));
    }
    if (p.min_p > 0.0f) {
        add(llama_sampler_init_min_p(p.min_p, 1));
    }
    add(llama_sampler_init_temp(p.temperature));
    add(llama_sampler_init_dist(seed));
    return chain;
}

}  // namespace fastpar
