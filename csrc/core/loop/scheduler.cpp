#include "core/loop/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/base/errors.hpp"
#include "core/base/text.hpp"
#include "core/loop/text_stream.hpp"

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
    ChainShape shape;          // and its shape, computed once with it
    GrammarPtr grammar;        // its json_schema or grammar constraint, or null
    bool on_device = false;    // its logits are cut down on the device (DeviceSampling)
    bool waiting = false;      // this step: leaves its prefix to a slot that decodes it first
    TextStream text;           // its text, streamed or not
    Completion completion;
    // Scoring (GenerateParams::prompt_logprobs): every prompt token, the last one included
    // even when it is never decoded (max_tokens = 0), and the first one scored.
    std::vector<llama_token> scored;
    size_t score_from = 0;
    // Scored and done (max_tokens = 0); kept until the next step's prefix sharing, so that
    // slots waiting for its prefix can still copy it (retire_scored).
    bool scored_done = false;
    // Set while building a batch:
    int32_t n_plan = 0;        // tokens this slot adds to the batch
    int32_t i_logits = -1;     // batch index whose logits this slot samples, or -1
    bool pad = false;          // adds one throw-away token only, to keep the step one pass
    int32_t i_score = -1;      // batch index of its first scored row; rows follow one another
    int32_t n_score = 0;       // rows of logits it scores prompt tokens with
    size_t p_score = 0;        // prompt position of the first scored row

    bool prefilling() const { return n_fed < prompt.size(); }
    // Scores its prompt and generates nothing: finished once the prompt is decoded.
    bool score_only() const { return !scored.empty() && request.params->max_tokens == 0; }
};

Scheduler::Scheduler(const Model & model, llama_context * ctx, llama_batch & batch, const SchedulerOptions & options,
                     Stats & stats)
    : model_(model), ctx_(ctx), threads_(options.threads), mem_(llama_get_memory(ctx)), batch_(batch), n_batch_(options.n_batch),
      n_ctx_seq_(options.n_ctx_seq), stats_(stats), pool_(options.pool), device_(options.device),
      policy_(options.policy), chooser_(options.pool, options.policy.split_rows),
      grammars_(*options.grammars),
      sharing_(options.policy.share_prefixes || options.policy.share_samples ? static_cast<size_t>(options.n_parallel)
                                                                              : 0) {
    const auto n_parallel = static_cast<size_t>(options.n_parallel);
    if (device_ != nullptr && static_cast<size_t>(device_->n_seq()) < n_parallel) {
        throw Error("device sampling was set up for fewer slots than the scheduler has");
    }
    slots_.reserve(n_parallel);
    for (int32_t i = 0; i < options.n_parallel; ++i) {
        slots_.push_back(std::make_unique<Slot>());
        slots_.back()->seq = i;
    }
    plan_inputs_.resize(n_parallel);
    plan_.slots.reserve(n_parallel);
    if (policy_.share_prefixes || policy_.share_samples) {
        sharing_views_.resize(n_parallel);
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
    // Tokenizing is most of what admitting a prompt costs, so the prompts about to take
    // the free slots are tokenized on the pool at once; llama_tokenize is thread-safe.
    struct Tokenized {
        std::vector<llama_token> tokens;
        bool failed = false;
        std::string error;
    };
    const auto tokenize = [this](const Prompt & prompt, Tokenized & out) {
        try {
            if (prompt.is_tokens) {
                const int32_t n_vocab = model_.n_vocab();
                for (size_t i = 0; i < prompt.tokens.size(); ++i) {
                    if (prompt.tokens[i] < 0 || prompt.tokens[i] >= n_vocab) {
                        throw InvalidArgument("prompt token " + std::to_string(i) + " is " +
                                              std::to_string(prompt.tokens[i]) + ", not a token id of this model (0 to " +
                                              std::to_string(n_vocab - 1) + ")");
                    }
                }
                out.tokens.assign(prompt.tokens.begin(), prompt.tokens.end());
                return;
            }
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
            // Scoring alone never decodes the last token, and keeps no position for
            // generation: n_ctx_seq positions score n_ctx_seq + 1 tokens.
            const bool score_only = params.prompt_logprobs && params.max_tokens == 0;
            if (tokens.size() >= static_cast<size_t>(n_ctx_seq_) + (score_only ? 2 : 0)) {
                ++stats_.n_failed;
                complete_unstarted(request, FinishReason::Error,
                                   "prompt has " + std::to_string(tokens.size()) + " tokens, but n_ctx_per_seq=" +
                                       std::to_string(n_ctx_seq_) + " allows at most " +
                                       (score_only ? std::to_string(n_ctx_seq_ + 1) + " to score"
                                                   : std::to_string(n_ctx_seq_ - 1) +
                                                         " (one position is kept for generation)") +
                                       "; raise n_ctx_per_seq or shorten it");
                continue;
            }
            if (params.max_tokens == 0 && (!score_only || tokens.size() < 2)) {
                if (!score_only) {
                    complete_unstarted(request, FinishReason::Length, "");
                    continue;
                }
                // One token: nothing to decode, nothing to score but the first.
                Completion c;
                c.finish_reason = FinishReason::Length;
                c.prompt_token_ids.assign(tokens.begin(), tokens.end());
                c.prompt_logprobs.assign(tokens.size(), std::numeric_limits<float>::quiet_NaN());
                c.prompt_greedy.assign(tokens.size(), 0);
                if (params.top_logprobs > 0) {
                    c.prompt_top_logprobs.assign(tokens.size(), {});
                }
                c.t_queued_ms = c.t_total_ms = ms_since(request.t_submit);
                request.on_done(std::move(c));
                continue;
            }
            GrammarPtr grammar;
            if (constrained(params)) {
                try {
                    grammar = grammars_.make(params);
                } catch (const std::exception & e) {
                    // This prompt only; never generated without its constraint.
                    ++stats_.n_failed;
                    complete_unstarted(request, FinishReason::Error, e.what());
                    continue;
                }
            }
            // Defensive: the slot's sequence must be empty before it is reused.
            if (llama_memory_seq_pos_max(mem_, slot.seq) >= 0) {
                llama_memory_seq_rm(mem_, slot.seq, -1, -1);
            }
            choose_sampler(slot, params, request.seed);
            slot.grammar = std::move(grammar);
            if (request.on_start) {
                request.on_start();
            }
            slot.completion = Completion();
            slot.scored.clear();
            if (params.prompt_logprobs) {
                slot.scored = tokens;
                slot.score_from = static_cast<size_t>(params.prompt_logprobs_from);
                slot.completion.prompt_token_ids.assign(tokens.begin(), tokens.end());
                slot.completion.prompt_logprobs.assign(tokens.size(), std::numeric_limits<float>::quiet_NaN());
                slot.completion.prompt_greedy.assign(tokens.size(), 0);
                if (params.top_logprobs > 0) {
                    slot.completion.prompt_top_logprobs.assign(tokens.size(), {});
                }
                if (score_only) {
                    tokens.pop_back();  // its logits would predict nothing
                }
            }
            slot.request = std::move(request);
            slot.prompt = std::move(tokens);
            slot.n_fed = 0;
            slot.n_past = 0;
            slot.pending = -1;
            slot.text.reset(static_cast<bool>(slot.request.on_text));
            slot.completion.t_queued_ms = ms_since(slot.request.t_submit);
            slot.active = true;
            if (policy_.share_prefixes || policy_.share_samples) {
                for (auto & other : slots_) {
                    if (other.get() == &slot || !other->active) {
                        continue;
                    }
                    const auto a = static_cast<size_t>(slot.seq), b = static_cast<size_t>(other->seq);
                    const bool samples = policy_.share_samples && slot.request.group != 0 &&
                                         slot.request.group == other->request.group;
                    if (samples || policy_.share_prefixes) {
                        sharing_.pair_up(a, slot.prompt, b, other->prompt, samples);
                    } else {
                        sharing_.unpair(a, b);
                    }
                }
            }
        }
    }
}

// Prefix sharing decides (prefix_sharing.hpp); the copies are made here: the donor's whole
// sequence is copied and trimmed back to the shared prefix.
void Scheduler::share_prefixes() {
    for (auto & sp : slots_) {
        sp->waiting = false;
    }
    if (!policy_.share_prefixes && !policy_.share_samples) {
        return;
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot & s = *slots_[i];
        SharingView & h = sharing_views_[i];
        h.active = s.active;
        h.n_fed = s.n_fed;
        h.prompt_size = s.prompt.size();
        // A scoring slot decodes every position whose logits score a token itself.
        h.max_copy = s.scored.empty() ? SIZE_MAX : s.score_from - 1;
    }
    sharing_.decide(sharing_views_);
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot & s = *slots_[i];
        const SharingView & h = sharing_views_[i];
        s.waiting = h.waiting;
        if (!h.copied) {
            continue;
        }
        const auto n = static_cast<llama_pos>(h.n_fed);
        llama_memory_seq_rm(mem_, s.seq, -1, -1);
        llama_memory_seq_cp(mem_, h.donor, s.seq, -1, -1);
        llama_memory_seq_rm(mem_, s.seq, n, -1);
        const auto gained = static_cast<int32_t>(h.n_fed - s.n_fed);
        s.completion.n_prompt_tokens_shared += gained;
        stats_.n_prompt_tokens_shared += gained;
        s.n_fed = h.n_fed;
        s.n_past = n;
    }
}

void Scheduler::choose_sampler(Slot & slot, const GenerateParams & params, uint32_t seed) {
    slot.sampler = make_sampler(params, seed, model_.n_vocab());
    slot.shape = ChainShape::of(params);
    slot.on_device = false;
    if (device_ == nullptr) {
        return;
    }
    slot.on_device = device_->attach(ctx_, slot.seq, DeviceSampling::serves(slot.shape));
}

// Which slots add which tokens is plan_step's (step_plan.hpp); this builds its input from
// the slots and decodes what it planned.
bool Scheduler::retire_scored() {
    bool any = false;
    for (auto & s : slots_) {
        if (s->active && s->scored_done) {
            finish(*s, FinishReason::Length);  // max_tokens = 0: scored, nothing to generate
            any = true;
        }
    }
    return any;
}

void Scheduler::step() {
    reap_cancelled();
    admit();
    share_prefixes();
    if (retire_scored()) {
        // Their slots take the next prompts now, which may share with the others.
        admit();
        share_prefixes();
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot & s = *slots_[i];
        PlanInput & p = plan_inputs_[i];
        p.active = s.active;
        p.prefilling = s.prefilling();
        p.waiting = s.waiting;
        p.left = s.prompt.size() - s.n_fed;
    }
    plan_step(plan_inputs_, policy_, n_batch_, prefill_rotation_, decode_waits_, plan_);
    decode_waits_ = plan_.decode_waits;
    prefill_rotation_ = (prefill_rotation_ + 1) % slots_.size();
    std::vector<Slot *> group;
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot & s = *slots_[i];
        s.pad = plan_.slots[i].pad;
        if (plan_.slots[i].n_plan > 0) {
            s.n_plan = plan_.slots[i].n_plan;
            group.push_back(&s);
        }
    }
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
        s->n_score = 0;
        if (s->pad) {
            // Any token: its KV entry is removed after the call.
            batch_add(batch_, 0, s->n_past, s->seq, false);
            ++n_padding;
        } else if (s->prefilling()) {
            const bool last_chunk = s->n_fed + static_cast<size_t>(s->n_plan) == s->prompt.size();
            for (int32_t j = 0; j < s->n_plan; ++j) {
                const size_t p = s->n_fed + static_cast<size_t>(j);
                const bool gen_logits = last_chunk && j == s->n_plan - 1 && !s->score_only();
                // Row p's logits score token p + 1 (scored rows of a chunk are consecutive).
                const bool score = !s->scored.empty() && p + 1 >= s->score_from && p + 1 < s->scored.size();
                const int32_t i = batch_add(batch_, s->prompt[p], s->n_past + j, s->seq, gen_logits || score);
                if (gen_logits) {
                    s->i_logits = i;
                }
                if (score && s->n_score++ == 0) {
                    s->i_score = i;
                    s->p_score = p;
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
                                               [](const Slot * s) { return (s->i_logits < 0 && s->n_score == 0) || s->on_device; });
        device_->expect(batch_, all_on_device);
    }
    if (threads_ != nullptr) {
        const int32_t n = threads_->threads();
        stats_.n_threads_low = stats_.n_threads_low == 0 ? n : std::min(stats_.n_threads_low, n);
    }
    const auto t0 = Clock::now();
    const int32_t rc = llama_decode(ctx_, batch_);
    if (rc == 0) {
        llama_synchronize(ctx_);  // a GPU computes after llama_decode returns: count it here
    }
    const double dt = ms_since(t0);
    if (threads_ != nullptr) {
        threads_->after_decode(ctx_);
    }
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
        score(group);
        std::vector<Slot *> ready;
        std::vector<Slot *> scored_all;
        for (Slot * s : group) {
            if (s->prefilling()) {
                s->n_fed += static_cast<size_t>(s->n_plan);
                s->completion.n_prompt_tokens += s->n_plan;
                stats_.n_prompt_tokens += s->n_plan;
            }
            s->n_past += s->n_plan;
            if (s->i_logits >= 0) {
                ready.push_back(s);
            } else if (s->score_only() && !s->prefilling()) {
                scored_all.push_back(s);
            }
        }
        for (Slot * s : scored_all) {
            s->scored_done = true;  // retire_scored ends it, after the next step's copies
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

// Scoring rows (GenerateParams::prompt_logprobs): the log-probability of each scored prompt
// token and whether it was the most likely, rows shared out over the pool.
void Scheduler::score(const std::vector<Slot *> & group) {
    struct Row {
        const float * logits;
        llama_token token;
        Slot * slot;
        size_t pos;  // of the scored token
        float logprob;
        bool greedy;
        std::vector<std::pair<llama_token, float>> top;  // with top_logprobs
    };
    std::vector<Row> rows;
    for (Slot * s : group) {
        for (int32_t k = 0; k < s->n_score; ++k) {
            // Read on this thread: llama.cpp's accessors are not thread-safe.
            const float * logits = llama_get_logits_ith(ctx_, s->i_score + k);
            if (logits == nullptr) {
                throw Error("llama.cpp returned no logits for a prompt token that asked for them");
            }
            const size_t pos = s->p_score + static_cast<size_t>(k) + 1;
            rows.push_back(Row{logits, s->scored[pos], s, pos, 0.0f, false, {}});
        }
    }
    if (rows.empty()) {
        return;
    }
    const auto t0 = Clock::now();
    const int32_t n_vocab = model_.n_vocab();
    const auto one = [&](size_t i) {
        Row & r = rows[i];
        score_token(r.logits, n_vocab, r.token, r.logprob, r.greedy);
        const int32_t k = r.slot->request.params->top_logprobs;
        if (k > 0) {
            top_logprobs(r.logits, n_vocab, k, r.top);
        }
    };
    if (pool_ != nullptr && rows.size() > 1) {
        pool_->run(rows.size(), one);
    } else {
        for (size_t i = 0; i < rows.size(); ++i) {
            one(i);
        }
    }
    for (const Row & r : rows) {
        r.slot->completion.prompt_logprobs[r.pos] = r.logprob;
        r.slot->completion.prompt_greedy[r.pos] = r.greedy ? 1 : 0;
        if (!r.top.empty()) {
            auto & entries = r.slot->completion.prompt_top_logprobs[r.pos];
            entries.reserve(r.top.size());
            for (const auto & [id, lp] : r.top) {
                entries.push_back(TopLogprob{id, lp, utf8_sanitize(model_.token_piece(id))});
            }
        }
    }
    stats_.t_sample_ms += ms_since(t0);
}

void Scheduler::sample(const std::vector<Slot *> & slots) {
    const auto t0 = Clock::now();
    std::vector<llama_token> tokens(slots.size(), LLAMA_TOKEN_NULL);
    std::vector<float> logprobs(slots.size(), 0.0f);
    std::vector<std::vector<std::pair<llama_token, float>>> tops(slots.size());
    std::vector<std::string> failed(slots.size());  // a constraint's failure, per slot
    std::vector<ConstrainedWay> ways(slots.size(), ConstrainedWay::None);
    std::vector<LogitRow> rows(slots.size());
    // Where each slot's logits are: read on this thread (llama.cpp's accessors are not
    // thread-safe), sampled below on the pool.
    const int32_t n_vocab = model_.n_vocab();
    int64_t work = 0;  // TokenChooser's units
    for (size_t i = 0; i < slots.size(); ++i) {
        Slot & s = *slots[i];
        if (s.on_device && device_->row(ctx_, s.seq, s.i_logits, rows[i])) {
            ++stats_.n_device_sampled;
        } else {
            // Host sampling, or device sampling llama.cpp did not run (it then copies whole rows).
            rows[i] = LogitRow{llama_get_logits_ith(ctx_, s.i_logits), n_vocab};
            if (rows[i].logits == nullptr) {
                throw Error("llama.cpp returned no logits for a sequence that asked for them");
            }
        }
        work += TokenChooser::work(s.shape, rows[i]);
    }
    // Each chain and row is its own, so sequences sample in parallel and pick exactly the
    // tokens they would pick one after another.
    const auto pick = [&](size_t i) {
        thread_local std::vector<llama_token_data> cur;
        const GenerateParams & params = *slots[i]->request.params;
        if (slots[i]->grammar) {
            try {
                tokens[i] = sample_constrained(slots[i]->sampler.get(), *slots[i]->grammar, slots[i]->shape, rows[i], cur, ways[i]);
            } catch (const GrammarDeadEnd & e) {
                failed[i] = e.what();
                return;
            }
        } else {
            tokens[i] = sample_logits(slots[i]->sampler.get(), slots[i]->shape, rows[i], cur);
        }
        if (params.logprobs) {  // never a device row (DeviceSampling::serves)
            logprobs[i] = token_logprob(rows[i].logits, n_vocab, tokens[i]);
        }
        if (params.top_logprobs > 0) {  // never a device row either
            top_logprobs(rows[i].logits, n_vocab, params.top_logprobs, tops[i]);
        }
    };
    chooser_.choose(rows, work, [&](size_t i) -> const ChainShape & { return slots[i]->shape; }, pick);
    stats_.t_sample_ms += ms_since(t0);
    for (size_t i = 0; i < slots.size(); ++i) {
        count(stats_, ways[i]);
        if (!failed[i].empty()) {
            finish(*slots[i], FinishReason::Error, failed[i]);
        } else {
            accept_token(*slots[i], tokens[i], logprobs[i], tops[i]);
        }
    }
}

void Scheduler::accept_token(Slot & s, llama_token token, float logprob,
                             std::vector<std::pair<llama_token, float>> & top) {
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
    if (params.top_logprobs > 0) {
        std::vector<TopLogprob> entries;
        entries.reserve(top.size());
        for (const auto & [id, lp] : top) {
            entries.push_back(TopLogprob{id, lp, utf8_sanitize(model_.token_piece(id))});
        }
        s.completion.top_logprobs.push_back(std::move(entries));
    }
    ++stats_.n_gen_tokens;
    if (s.text.append(model_.token_piece(token), params.stop)) {
        finish(s, FinishReason::Stop);
        return;
    }
    if (s.completion.token_ids.size() >= static_cast<size_t>(params.max_tokens) || s.n_past >= n_ctx_seq_) {
        finish(s, FinishReason::Length);  // max_tokens, or no position left to feed the token
        return;
    }
    s.pending = token;
    emit_text(s);
}

void Scheduler::emit_text(Slot & s) {
    if (!s.request.on_text) {
        return;
    }
    const std::string piece = s.text.next_piece(s.request.params->stop, false);
    if (!piece.empty()) {
        s.request.on_text(piece);
    }
}

void Scheduler::finish(Slot & s, FinishReason reason, const std::string & error) {
    llama_memory_seq_rm(mem_, s.seq, -1, -1);
    s.sampler.reset();  // an attached device-sampling chain stays, for the slot's next request
    s.grammar.reset();
    s.on_device = false;
    s.active = false;
    s.prompt.clear();
    s.scored.clear();
    s.scored_done = false;
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
            const std::string piece = s.text.next_piece(s.request.params->stop, true);
            if (!piece.empty()) {
                s.request.on_text(piece);
            }
        } catch (...) {
        }
    }
    c.text = s.text.take_text();
    c.n_gen_tokens = static_cast<int32_t>(c.token_ids.size());
    c.t_total_ms = ms_since(s.request.t_submit);
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
