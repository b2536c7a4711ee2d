#include "core/scheduler.hpp"

#include <algorithm>
#include <chrono>

#include "core/errors.hpp"
#include "core/text.hpp"

namespace fastpar {
namespace {

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string decode_error_message(int32_t rc) {
    switch (rc) {
        case 1:
            return "llama_decode found no room in the KV cache for this prompt, even decoded alone";
        case 2:
            return "llama_decode was aborted";
        case -1:
            return "llama_decode rejected this prompt's tokens as an invalid batch";
        default:
            return "llama_decode failed with code " + std::to_string(rc);
    }
}

// Below this many sequences to sample (or prompts to tokenize) a step works on one
// thread: waking the pool costs more.
constexpr size_t kMinPooled = 8;
// Below kMinPooled whole rows from a GPU, each row's first pass is split over the pool from
// this many rows (Scheduler::sample).
constexpr size_t kMinSplit = 2;

// Nor does a step whose rows are small: sampling is pooled from this much work, a logit
// of a greedy row (an argmax) one unit and of any other chain four (about what a row of
// each cost on an H100 machine's host). Eight rows of device-sampling candidates (8,192
// each) are 65,536 units greedy, so chosen on the calling thread (measured there, pool
// without anticipate_us: 35 us a step against 62-68 pooled), and 262,144 with the typical
// sampler, pooled (84-94 us against 115-133 on one thread); eight whole rows always are.
constexpr int64_t kMinPooledWork = 262144;

// With one KV buffer per slot (kv_unified off), llama.cpp splits a batch into forward
// passes ("ubatches") of sequences with consecutive seq_ids and an equal number of tokens
// each: decoding slots 3, 4 and 7 take two passes, not one. On a GPU a pass has a large
// fixed cost and a token a small one, so a gap of up to this many idle slots between
// decoding slots is padded: each gets one throw-away token (no logits, removed from its
// KV right after), and the step stays one pass. On the CPU a token costs about as much as
// the pass's fixed part, so it does not pay.
constexpr size_t kMaxPaddedGapGpu = 32;

size_t common_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) {
        ++i;
    }
    return i;
}

// Whether a sequence's KV cache can be copied up to a position: plain attention caches
// can; recurrent state (one state per sequence, not per position) and sliding-window
// caches (positions fall out of the window) cannot.
bool memory_copies_by_position(const llama_model * model) {
    return !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model) && llama_model_n_swa(model) == 0;
}

}  // namespace

struct Scheduler::Slot {
    llama_seq_id seq = 0;
    bool active = false;
    Request request;
    std::vector<llama_token> prompt;
    size_t n_fed = 0;          // prompt tokens already in the KV cache
    llama_pos n_past = 0;      // positions of this sequence in the KV cache
    llama_token pending = -1;  // sampled token still to be fed
    SamplerPtr sampler;        // this request's chain (it always runs on the host)
    bool on_device = false;    // its logits are cut down on the device (DeviceSampling)
    bool waiting = false;      // this step: leaves its prefix to a slot that decodes it first
    bool copied = false;       // this step: took its prefix from another slot's KV cache
    std::string bytes;         // generated text so far, raw bytes
    size_t n_emitted = 0;      // bytes of `bytes` already streamed through on_text
    std::string emitted;       // the text streamed so far (sanitised)
    Completion completion;
    // Set while building a batch:
    int32_t n_plan = 0;        // tokens this slot adds to the batch
    int32_t i_logits = -1;     // batch index whose logits this slot samples, or -1
    bool pad = false;          // adds one throw-away token only, to keep the step one pass

    bool prefilling() const { return n_fed < prompt.size(); }
};

Scheduler::Scheduler(const Model & model, llama_context * ctx, llama_batch & batch, int32_t n_parallel,
                     int32_t n_batch, int32_t n_ctx_seq, Stats & stats, TaskPool * pool,
                     DeviceSampling * device, bool share_prefixes, bool kv_unified)
    : model_(model), ctx_(ctx), mem_(llama_get_memory(ctx)), batch_(batch), n_batch_(n_batch),
      n_ctx_seq_(n_ctx_seq), stats_(stats), pool_(pool), device_(device),
      share_prefixes_(share_prefixes && n_parallel > 1 && memory_copies_by_position(model.get())),
      max_padded_gap_(model.output_on_gpu() && !kv_unified && memory_copies_by_position(model.get())
                          ? kMaxPaddedGapGpu
                          : 0),
      prompts_first_(model.output_on_gpu() && !kv_unified) {
    if (device_ != nullptr && device_->attached.size() < static_cast<size_t>(n_parallel)) {
        throw Error("device sampling was set up for fewer slots than the scheduler has");
    }
    if (share_prefixes_) {
        common_.assign(static_cast<size_t>(n_parallel) * static_cast<size_t>(n_parallel), 0);
    }
    slots_.reserve(static_cast<size_t>(n_parallel));
    for (int32_t i = 0; i < n_parallel; ++i) {
        slots_.push_back(std::make_unique<Slot>());
        slots_.back()->seq = i;
    }
}

Scheduler::~Scheduler() { cancel_all(); }

void Scheduler::enqueue(Request request) { queue_.push_back(std::move(request)); }

bool Scheduler::idle() const {
    if (!queue_.empty()) {
        return false;
    }
    return std::none_of(slots_.begin(), slots_.end(), [](const auto & s) { return s->active; });
}

void Scheduler::complete_unstarted(Request & request, FinishReason reason, const std::string & error) {
    Completion c;
    c.finish_reason = reason;
    c.error = error;
    c.t_queued_ms = c.t_total_ms = ms_since(request.t_submit);
    request.on_done(std::move(c));
}

void Scheduler::reap_cancelled() {
    for (auto & s : slots_) {
        if (s->active && s->request.cancel && s->request.cancel->load()) {
            finish(*s, FinishReason::Cancelled);
        }
    }
    for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->cancel && it->cancel->load()) {
            Request request = std::move(*it);
            it = queue_.erase(it);
            complete_unstarted(request, FinishReason::Cancelled, "");
        } else {
            ++it;
        }
    }
}

void Scheduler::admit() {
    // Tokenizing is most of what admitting a prompt costs (about 0.2 ms for 32 tokens on
    // one core of the 2-core CPU, 56 ms for 256 prompts), so the prompts about to take
    // the free slots are tokenized on the pool at once; llama_tokenize is thread-safe.
    struct Tokenized {
        std::vector<llama_token> tokens;
        bool failed = false;
        std::string error;
    };
    const auto tokenize = [this](const Prompt & prompt, Tokenized & out) {
        try {
            out.tokens = model_.tokenize(prompt.is_chat ? model_.apply_chat_template(prompt.messages) : prompt.text);
        } catch (const std::exception & e) {
            out.failed = true;
            out.error = e.what();
        }
    };
    std::vector<Tokenized> ahead;
    if (pool_ != nullptr && queue_.size() >= kMinPooled) {
        const auto n_free = static_cast<size_t>(
            std::count_if(slots_.begin(), slots_.end(), [](const std::unique_ptr<Slot> & s) { return !s->active; }));
        if (n_free >= kMinPooled) {
            ahead.resize(std::min(n_free, queue_.size()));
            pool_->run(ahead.size(), [&](size_t i) { tokenize(queue_[i].prompt, ahead[i]); });
        }
    }
    size_t n_taken = 0;
    for (auto & slot_ptr : slots_) {
        Slot & slot = *slot_ptr;
        while (!slot.active && !queue_.empty()) {
            Request request = std::move(queue_.front());
            queue_.pop_front();
            const GenerateParams & params = *request.params;
            Tokenized t;
            if (n_taken < ahead.size()) {
                t = std::move(ahead[n_taken]);
            } else {
                tokenize(request.prompt, t);
            }
            ++n_taken;
            if (t.failed) {
                ++stats_.n_failed;
                complete_unstarted(request, FinishReason::Error, t.error);
                continue;
            }
            std::vector<llama_token> tokens = std::move(t.tokens);
            if (tokens.empty()) {
                ++stats_.n_failed;
                complete_unstarted(request, FinishReason::Error,
                                   "prompt is empty: it tokenizes to no tokens, so there is nothing to continue");
                continue;
            }
            if (tokens.size() >= static_cast<size_t>(n_ctx_seq_)) {
                ++stats_.n_failed;
                complete_unstarted(request, FinishReason::Error,
                                   "prompt has " + std::to_string(tokens.size()) + " tokens, but n_ctx_per_seq=" +
                                       std::to_string(n_ctx_seq_) + " allows at most " +
                                       std::to_string(n_ctx_seq_ - 1) +
                                       " (one position is kept for generation); raise n_ctx_per_seq or shorten it");
                continue;
            }
            if (params.max_tokens == 0) {
                complete_unstarted(request, FinishReason::Length, "");
                continue;
            }
            // Defensive: the slot's sequence must be empty before it is reused.
            if (llama_memory_seq_pos_max(mem_, slot.seq) >= 0) {
                llama_memory_seq_rm(mem_, slot.seq, -1, -1);
            }
            choose_sampler(slot, params, request.seed);
            if (request.on_start) {
                request.on_start();
            }
            slot.request = std::move(request);
            slot.prompt = std::move(tokens);
            slot.n_fed = 0;
            slot.n_past = 0;
            slot.pending = -1;
            slot.bytes.clear();
            slot.n_emitted = 0;
            slot.emitted.clear();
            slot.completion = Completion();
            slot.completion.t_queued_ms = ms_since(slot.request.t_submit);
            slot.active = true;
            if (share_prefixes_) {
                for (auto & other : slots_) {
                    if (other.get() != &slot && other->active) {
                        common_[pair(slot, *other)] = common_[pair(*other, slot)] =
                            common_prefix(slot.prompt, other->prompt);
                    }
                }
            }
        }
    }
}

size_t Scheduler::pair(const Slot & a, const Slot & b) const {
    return static_cast<size_t>(a.seq) * slots_.size() + static_cast<size_t>(b.seq);
}

// A prefilling slot whose prompt starts like another active slot's takes that common
// prefix from the other's KV cache instead of decoding it: the whole sequence is copied
// (llama_memory_seq_cp; across the per-slot buffers of a non-unified cache only whole
// sequences can be) and trimmed back to the common prefix. When the other slot is still
// decoding that prefix, this one waits for it rather than decoding it too. A slot waits
// only for one "ahead" of it (more prompt decoded, or as much and a lower seq_id), so
// the slot furthest ahead always goes on. Every slot decodes at least its last prompt
// token itself, whose logits start its generation.
void Scheduler::share_prefixes() {
    for (auto & sp : slots_) {
        sp->waiting = false;
        sp->copied = false;
    }
    if (!share_prefixes_) {
        return;
    }
    const auto min_shared = static_cast<size_t>(kMinSharedPrefix);
    for (auto & sp : slots_) {
        Slot & s = *sp;
        if (!s.active || !s.prefilling() || s.prompt.size() <= min_shared) {
            continue;
        }
        const size_t limit = s.prompt.size() - 1;
        size_t best = s.n_fed;  // prompt positions s can hold after a copy now
        Slot * donor = nullptr;
        size_t later = 0;       // ... and after a slot ahead of it has decoded more
        for (auto & dp : slots_) {
            Slot & d = *dp;
            if (&d == &s || !d.active) {
                continue;
            }
            const size_t c = std::min(common_[pair(s, d)], limit);
            if (c < min_shared) {
                continue;
            }
            const size_t have = std::min(c, d.n_fed);
            if (!d.copied && have > best) {
                best = have;
                donor = &d;
            }
            const bool ahead = d.n_fed > s.n_fed || (d.n_fed == s.n_fed && d.seq < s.seq);
            if (d.prefilling() && d.n_fed < c && ahead) {
                later = std::max(later, c);
            }
        }
        if (later >= best + min_shared) {
            s.waiting = true;
            continue;
        }
        if (donor == nullptr || best < s.n_fed + min_shared) {
            continue;
        }
        const auto n = static_cast<llama_pos>(best);
        llama_memory_seq_rm(mem_, s.seq, -1, -1);
        llama_memory_seq_cp(mem_, donor->seq, s.seq, -1, -1);
        llama_memory_seq_rm(mem_, s.seq, n, -1);
        const auto gained = static_cast<int32_t>(best - s.n_fed);
        s.completion.n_prompt_tokens_shared += gained;
        stats_.n_prompt_tokens_shared += gained;
        s.n_fed = best;
        s.n_past = n;
        s.copied = true;
    }
}

void Scheduler::choose_sampler(Slot & slot, const GenerateParams & params, uint32_t seed) {
    slot.sampler = make_sampler(params, seed, model_.n_vocab());
    slot.on_device = false;
    if (device_ == nullptr) {
        return;
    }
    const bool reduce = LogitReducer::serves(params);
    char & attached = device_->attached[static_cast<size_t>(slot.seq)];
    if (reduce != static_cast<bool>(attached)) {
        // Only when the kind of request changes: llama.cpp re-reserves its graph after it.
        if (llama_set_sampler(ctx_, slot.seq, reduce ? device_->reducer->new_chain(slot.seq) : nullptr) || !reduce) {
            attached = reduce ? 1 : 0;
        }
    }
    slot.on_device = reduce && attached;
}

void Scheduler::step() {
    reap_cancelled();
    admit();
    share_prefixes();
    std::vector<Slot *> decoders;
    size_t n_prompt_ready = 0;  // prompt tokens that could be decoded now
    for (auto & s : slots_) {
        s->pad = false;
        if (!s->active) {
            continue;
        }
        if (!s->prefilling()) {
            decoders.push_back(s.get());
        } else if (!s->waiting) {
            n_prompt_ready += s->prompt.size() - s->n_fed;
        }
    }
    // On a GPU, while prompts waiting to be decoded fill a batch on their own, they take it
    // and the decoding slots wait: their tokens and the prompt chunks would be separate
    // forward passes anyway, and once every prompt is in, all slots decode together in one.
    const bool prompts_first = prompts_first_ && !decoders.empty() && decode_waits_ < max_decode_waits_ &&
                               n_prompt_ready >= static_cast<size_t>(n_batch_) - decoders.size();
    decode_waits_ = prompts_first ? decode_waits_ + 1 : 0;
    if (prompts_first) {
        decoders.clear();
    }
    std::vector<Slot *> group;
    int32_t budget = n_batch_;
    // Decoding slots first: one token each, n_batch >= n_parallel guarantees room, for the
    // padding between them too (slots are in seq_id order).
    for (size_t i = 0; i < decoders.size(); ++i) {
        Slot * s = decoders[i];
        s->n_plan = 1;
        --budget;
        group.push_back(s);
        if (i + 1 < decoders.size()) {
            const auto gap = static_cast<size_t>(decoders[i + 1]->seq - s->seq - 1);
            if (gap > 0 && gap <= max_padded_gap_) {
                for (llama_seq_id q = s->seq + 1; q < decoders[i + 1]->seq; ++q) {
                    Slot & p = *slots_[static_cast<size_t>(q)];
                    p.pad = true;
                    p.n_plan = 1;
                    --budget;
                    group.push_back(&p);
                }
            }
        }
    }
    // Prompt chunks fill what is left, starting from a rotating slot so none starves. The
    // first takes what fits; the others go only whole, because a cut prompt ends in a
    // pass of its own next step. A padded slot that gets a chunk needs no padding.
    bool first = true;
    const size_t n = slots_.size();
    for (size_t k = 0; k < n && budget > 0; ++k) {
        Slot & s = *slots_[(prefill_rotation_ + k) % n];
        if (!s.active || !s.prefilling() || s.waiting) {
            continue;
        }
        const size_t left = s.prompt.size() - s.n_fed;
        const auto room = static_cast<size_t>(budget + (s.pad ? 1 : 0));
        if (!first && left > room) {
            continue;
        }
        first = false;
        s.n_plan = static_cast<int32_t>(std::min(left, room));
        budget = static_cast<int32_t>(room) - s.n_plan;
        if (s.pad) {
            s.pad = false;  // already in the group
        } else {
            group.push_back(&s);
        }
    }
    prefill_rotation_ = (prefill_rotation_ + 1) % n;
    if (!group.empty()) {
        decode_group(std::move(group));
    }
}

void Scheduler::decode_group(std::vector<Slot *> group) {
    // In seq_id order: llama.cpp puts only consecutive sequences into one forward pass.
    std::sort(group.begin(), group.end(), [](const Slot * a, const Slot * b) { return a->seq < b->seq; });
    batch_.n_tokens = 0;
    int64_t n_prompt_tokens = 0, n_gen_tokens = 0, n_padding = 0;
    for (Slot * s : group) {
        s->i_logits = -1;
        if (s->pad) {
            // Any token: its KV entry is removed after the call.
            batch_add(batch_, 0, s->n_past, s->seq, false);
            ++n_padding;
        } else if (s->prefilling()) {
            const bool last_chunk = s->n_fed + static_cast<size_t>(s->n_plan) == s->prompt.size();
            for (int32_t j = 0; j < s->n_plan; ++j) {
                const bool logits = last_chunk && j == s->n_plan - 1;
                const llama_token token = s->prompt[s->n_fed + static_cast<size_t>(j)];
                const int32_t i = batch_add(batch_, token, s->n_past + j, s->seq, logits);
                if (logits) {
                    s->i_logits = i;
                }
            }
            n_prompt_tokens += s->n_plan;
        } else {
            s->i_logits = batch_add(batch_, s->pending, s->n_past, s->seq, true);
            ++n_gen_tokens;
        }
    }

    if (device_ != nullptr) {
        const bool all_on_device = std::all_of(group.begin(), group.end(),
                                               [](const Slot * s) { return s->i_logits < 0 || s->on_device; });
        device_->reducer->expect(batch_, all_on_device);
    }
    const auto t0 = Clock::now();
    const int32_t rc = llama_decode(ctx_, batch_);
    if (rc == 0) {
        llama_synchronize(ctx_);  // a GPU computes after llama_decode returns: count it here
    }
    const double dt = ms_since(t0);
    ++stats_.n_decode_calls;
    stats_.n_padding_tokens += n_padding;
    const double share = static_cast<double>(n_prompt_tokens) / static_cast<double>(n_prompt_tokens + n_gen_tokens);
    stats_.t_prompt_ms += dt * share;
    stats_.t_gen_ms += dt * (1.0 - share);
    if (n_padding > 0) {
        // Padding leaves nothing behind, whether the call worked or not.
        for (Slot * s : group) {
            if (s->pad) {
                llama_memory_seq_rm(mem_, s->seq, s->n_past, -1);
            }
        }
        group.erase(std::remove_if(group.begin(), group.end(),
                                   [](Slot * s) {
                                       const bool pad = s->pad;
                                       s->pad = false;
                                       return pad;
                                   }),
                    group.end());
    }

    if (rc == 0) {
        const auto t_sample = Clock::now();
        std::vector<Slot *> ready;
        for (Slot * s : group) {
            if (s->prefilling()) {
                s->n_fed += static_cast<size_t>(s->n_plan);
                s->completion.n_prompt_tokens += s->n_plan;
                stats_.n_prompt_tokens += s->n_plan;
            }
            s->n_past += s->n_plan;
            if (s->i_logits >= 0) {
                ready.push_back(s);
            }
        }
        sample(ready);
        stats_.t_gen_ms += ms_since(t_sample);
        return;
    }

    // Failed: drop whatever part of this batch reached the KV cache, so every slot is
    // back exactly where it was before the call (positions stay consistent). The halves
    // below are retried without padding.
    for (Slot * s : group) {
        llama_memory_seq_rm(mem_, s->seq, s->n_past, -1);
    }
    if (rc == 2 || group.empty()) {
        return;  // aborted on purpose (closing): every slot is intact, the caller decides
    }
    if (rc == 1) {
        ++stats_.n_kv_full_retries;
    }
    if (group.size() > 1) {
        // Split: a KV-full batch may fit in halves; an invalid batch (-1 rejects the whole
        // batch) is narrowed down to the slot that causes it, and the others go on.
        const auto mid = group.begin() + static_cast<std::ptrdiff_t>(group.size() / 2);
        std::vector<Slot *> first(group.begin(), mid), second(mid, group.end());
        decode_group(std::move(first));
        decode_group(std::move(second));
        return;
    }
    Slot & s = *group.front();
    if (rc == 1 && s.n_plan > 1) {
        s.n_plan /= 2;  // a smaller prompt chunk may still find room
        decode_group(std::move(group));
        return;
    }
    finish(s, FinishReason::Error, decode_error_message(rc));
}

void Scheduler::sample(const std::vector<Slot *> & slots) {
    const auto t0 = Clock::now();
    std::vector<llama_token> tokens(slots.size(), LLAMA_TOKEN_NULL);
    std::vector<float> logprobs(slots.size(), 0.0f);
    std::vector<LogitRow> rows(slots.size());
    // Where each slot's logits are: read on this thread (llama.cpp's accessors are not
    // thread-safe), sampled below on the pool.
    const int32_t n_vocab = model_.n_vocab();
    int64_t work = 0;  // kMinPooledWork's units
    for (size_t i = 0; i < slots.size(); ++i) {
        Slot & s = *slots[i];
        if (s.on_device && device_->reducer->row(ctx_, s.seq, s.i_logits, rows[i])) {
            ++stats_.n_device_sampled;
        } else {
            // Host sampling, or a reducer llama.cpp did not run (it then copies whole rows).
            rows[i] = LogitRow{llama_get_logits_ith(ctx_, s.i_logits), n_vocab};
            if (rows[i].logits == nullptr) {
                throw Error("llama.cpp returned no logits for a sequence that asked for them");
            }
        }
        work += int64_t{rows[i].n} * (s.request.params->temperature <= 0.0f ? 1 : 4);
    }
    // Each chain and row is its own, so sequences sample in parallel and pick exactly the
    // tokens they would pick one after another.
    const auto pick = [&](size_t i) {
        thread_local std::vector<llama_token_data> cur;
        const GenerateParams & params = *slots[i]->request.params;
        tokens[i] = sample_logits(slots[i]->sampler.get(), params, rows[i], cur);
        if (params.logprobs) {  // never a device row (LogitReducer::serves)
            logprobs[i] = token_logprob(rows[i].logits, n_vocab, tokens[i]);
        }
    };
    // Fewer rows than kMinPooled: one thread, unless they are 2 or more whole rows from a
    // GPU. The pool's workers then poll for each step's choosing
    // (TaskPool::Options::for_gpu_output), and the first pass over each row, a read of a row
    // just copied into host memory, is split over them (choose_split). One row stays on the
    // calling thread: split, it took as long greedy and 10 us longer typical on an H200's
    // host (bench/README.md, "Choosing split over threads").
    bool split = pool_ != nullptr && pool_->n_threads() > 1 && model_.output_on_gpu() &&
                 slots.size() >= kMinSplit && slots.size() < kMinPooled;
    for (size_t i = 0; split && i < slots.size(); ++i) {
        split = splits(*slots[i]->request.params, rows[i]);
    }
    if (pool_ != nullptr && slots.size() >= kMinPooled && work >= kMinPooledWork) {
        pool_->run(slots.size(), pick);
    } else if (split) {
        choose_split(*pool_, rows, split_maxima_, pick);
    } else {
        for (size_t i = 0; i < slots.size(); ++i) {
            pick(i);
        }
    }
    stats_.t_sample_ms += ms_since(t0);
    for (size_t i = 0; i < slots.size(); ++i) {
        accept_token(*slots[i], tokens[i], logprobs[i]);
    }
}

void Scheduler::accept_token(Slot & s, llama_token token, float logprob) {
    const GenerateParams & params = *s.request.params;
    if (!params.ignore_eos && llama_vocab_is_eog(model_.vocab(), token)) {
        finish(s, FinishReason::Stop);
        return;
    }
    if (s.completion.token_ids.empty()) {
        s.completion.t_first_token_ms = ms_since(s.request.t_submit);
    }
    s.completion.token_ids.push_back(token);
    if (params.logprobs) {
        s.completion.logprobs.push_back(logprob);
    }
    ++stats_.n_gen_tokens;
    const size_t before = s.bytes.size();
    s.bytes += model_.token_piece(token);
    if (!params.stop.empty()) {
        const size_t at = find_stop(s.bytes, params.stop, before);
        if (at != std::string::npos) {
            s.bytes.resize(at);
            finish(s, FinishReason::Stop);
            return;
        }
    }
    if (s.completion.token_ids.size() >= static_cast<size_t>(params.max_tokens) || s.n_past >= n_ctx_seq_) {
        finish(s, FinishReason::Length);  // max_tokens, or no position left to feed the token
        return;
    }
    s.pending = token;
    emit_text(s, false);
}

void Scheduler::emit_text(Slot & s, bool final) {
    if (!s.request.on_text) {
        return;
    }
    size_t upto = s.bytes.size();
    if (!final) {
        // Hold back an incomplete UTF-8 character and anything that may begin a stop string.
        upto = utf8_complete_prefix(s.bytes);
        upto = std::min(upto, s.bytes.size() - stop_prefix_suffix(s.bytes, s.request.params->stop));
    }
    if (upto <= s.n_emitted) {
        return;
    }
    const std::string piece = utf8_sanitize(s.bytes.substr(s.n_emitted, upto - s.n_emitted));
    s.n_emitted = upto;
    s.emitted += piece;
    s.request.on_text(piece);
}

void Scheduler::finish(Slot & s, FinishReason reason, const std::string & error) {
    llama_memory_seq_rm(mem_, s.seq, -1, -1);
    s.sampler.reset();  // an attached reducer chain stays, for the slot's next request
    s.on_device = false;
    s.active = false;
    s.prompt.clear();
    s.n_fed = 0;
    s.n_past = 0;
    if (reason == FinishReason::Error) {
        ++stats_.n_failed;
    }
    Completion c = std::move(s.completion);
    c.finish_reason = reason;
    c.error = error;
    if (s.request.on_text) {
        // Stream the rest, so that the pieces add up to the final text exactly.
        try {
            emit_text(s, true);
        } catch (...) {
        }
        c.text = std::move(s.emitted);
    } else {
        c.text = utf8_sanitize(s.bytes);
    }
    c.n_gen_tokens = static_cast<int32_t>(c.token_ids.size());
    c.t_total_ms = ms_since(s.request.t_submit);
    s.bytes.clear();
    s.emitted.clear();
    s.n_emitted = 0;
    Request request = std::move(s.request);
    s.request = Request();
    request.on_done(std::move(c));
}

void Scheduler::cancel_all() noexcept {
    for (auto & s : slots_) {
        if (s->active) {
            try {
                finish(*s, FinishReason::Cancelled);
            } catch (...) {
                // finish() already removed the KV and freed the slot before calling back.
            }
        }
    }
    while (!queue_.empty()) {
        Request request = std::move(queue_.front());
        queue_.pop_front();
        try {
            complete_unstarted(request, FinishReason::Cancelled, "");
        } catch (...) {
        }
    }
}

}  // namespace fastpar
