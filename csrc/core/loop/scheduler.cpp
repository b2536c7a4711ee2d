#include "core/loop/scheduler.hpp"

#include <algorithm>
#include <iterator>
#include <optional>

#include "core/base/errors.hpp"
#include "core/loop/admit.hpp"
#include "core/loop/prompt_scoring.hpp"
#include "core/loop/slot.hpp"
#include "core/model/chat.hpp"

namespace fastpar {

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

std::vector<llama_token> kv_tokens(const Slot & s) {
    // A resumed slot's prompt ends with the n_resumed tokens it had generated before.
    std::vector<llama_token> kv(s.prompt.begin(), s.prompt.begin() + static_cast<std::ptrdiff_t>(s.n_fed));
    const auto n_gen_fed = static_cast<size_t>(s.n_past) - s.n_fed;
    const auto from = s.completion.token_ids.begin() + static_cast<std::ptrdiff_t>(s.n_resumed);
    kv.insert(kv.end(), from, from + static_cast<std::ptrdiff_t>(n_gen_fed));
    return kv;
}

void deliver(Request & request, Completion c, TextStream & text, bool thought_open, FinishReason reason,
             const std::string & error) {
    c.finish_reason = reason;
    c.error = error;
    if (request.on_text) {
        // Stream the rest, so that the pieces add up to the final text exactly.
        try {
            const std::string piece = text.next_piece(request.params->stop, true);
            if (!piece.empty()) {
                request.on_text(piece);
            }
        } catch (...) {
        }
    }
    c.text = text.take_text();
    if (!request.params->tool_parser.empty() && c.finish_reason != FinishReason::Error &&
        c.finish_reason != FinishReason::Cancelled) {
        // The text besides the calls: the generic format's "response", or the whole output
        // when it holds no well-formed call.
        ChatReply reply = parse_reply(request.params->tool_parser, c.text, false);
        c.text = std::move(reply.content);
        if (!reply.tool_calls.empty()) {
            for (auto & call : reply.tool_calls) {
                if (call.id.empty()) {
                    call.id = new_tool_call_id();
                }
            }
            c.tool_calls = std::move(reply.tool_calls);
            if (c.finish_reason == FinishReason::Stop) {
                c.finish_reason = FinishReason::ToolCalls;
            }
        }
    }
    if (request.params->reasoning == "split") {
        c.reasoning = split_thought(c.text, thought_open);
    }
    c.n_gen_tokens = static_cast<int32_t>(c.token_ids.size());
    c.t_total_ms = ms_since(request.t_submit);
    request.on_done(std::move(c));
}

Scheduler::Scheduler(const Model & model, llama_context * ctx, llama_batch & batch, const SchedulerOptions & options,
                     Stats & stats)
    : model_(model), ctx_(ctx), threads_(options.threads), mem_(llama_get_memory(ctx)), batch_(batch), n_batch_(options.n_batch),
      n_ctx_seq_(options.n_ctx_seq), stats_(stats), pool_(options.pool), device_(options.device),
      policy_(options.policy), chooser_(options.pool, options.policy.split_rows),
      grammars_(*options.grammars), cache_(options.cache),
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
    embeddings_ = options.embeddings;
    embedding_size_ = options.embedding_size;
    embed_step_tokens_ = options.embed_step_tokens > 0 ? std::min(options.embed_step_tokens, n_batch_) : n_batch_;
    plan_inputs_.resize(n_parallel);
    plan_.slots.reserve(n_parallel);
    if (policy_.share_prefixes || policy_.share_samples) {
        sharing_views_.resize(n_parallel);
    }
}

Scheduler::~Scheduler() { cancel_all(); }

void Scheduler::enqueue(Request request) {
    // The queue stays ordered by priority, each request behind every other of its priority
    // or a lower one: a request with a lower value than those queued waits only for a slot.
    const int32_t priority = request.priority();
    auto at = queue_.end();
    while (at != queue_.begin()) {
        const auto before = std::prev(at);
        if (before->priority() <= priority) {
            break;
        }
        at = before;
    }
    queue_.insert(at, std::move(request));
}

bool Scheduler::idle() const {
    if (!queue_.empty()) {
        return false;
    }
    return std::none_of(slots_.begin(), slots_.end(), [](const auto & s) { return s->active(); });
}

void Scheduler::complete_unstarted(Request & request, FinishReason reason, const std::string & error) {
    if (request.suspended) {
        const std::shared_ptr<Suspended> was = std::move(request.suspended);
        deliver(request, std::move(was->completion), was->text, was->thought_open, reason, error);
        return;
    }
    Completion c;
    c.finish_reason = reason;
    c.error = error;
    c.t_queued_ms = c.t_total_ms = ms_since(request.t_submit);
    request.on_done(std::move(c));
}

void Scheduler::reap_cancelled() {
    for (auto & s : slots_) {
        if (s->active() && s->request.cancel && s->request.cancel->load()) {
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

// A unified KV cache found no room: the idle slots' cached sequences take cells the running
// ones need, so they go first. Returns whether any did.
bool Scheduler::drop_idle_holds() {
    bool any = false;
    for (auto & sp : slots_) {
        const auto seq = static_cast<size_t>(sp->seq);
        if (!sp->active() && !cache_->held(seq).empty()) {
            cache_->let_go(ctx_, seq);
            llama_memory_seq_rm(mem_, sp->seq, -1, -1);
            any = true;
        }
    }
    return any;
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

// Scored slots end here, once the step after their last decode has made its copies.
bool Scheduler::retire_scored() {
    bool any = false;
    for (auto & s : slots_) {
        if (s->state == SlotState::Scored) {
            finish(*s, FinishReason::Length);  // max_tokens = 0: scored, nothing to generate
            any = true;
        }
    }
    return any;
}

// Which slots add which tokens is plan_step's (step_plan.hpp); this builds its input from
// the slots and decodes what it planned.
void Scheduler::step() {
    if (embeddings_) {
        step_embeddings();
        return;
    }
    reap_cancelled();
    preempt();
    admit();
    share_prefixes();
    if (retire_scored()) {
        // Their slots take the next prompts now, which may share with the others.
        admit();
        share_prefixes();
    }
    compact();
    for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot & s = *slots_[i];
        PlanInput & p = plan_inputs_[i];
        p.active = s.active();
        p.prefilling = s.prefilling();
        p.waiting = s.state == SlotState::Waiting;
        p.left = s.prompt.size() - s.n_fed;
        p.room = static_cast<size_t>(std::max<int64_t>(0, static_cast<int64_t>(n_ctx_seq_) - s.n_past));
        p.priority = s.request.priority();
        p.order = s.order;
    }
    plan_step(plan_inputs_, policy_, n_batch_, decode_waits_, plan_);
    decode_waits_ = plan_.decode_waits;
    std::vector<Slot *> group;
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot & s = *slots_[i];
        s.pad = plan_.slots[i].pad;
        s.n_pad_tokens = plan_.slots[i].n_pad_tokens;
        if (plan_.slots[i].n_plan > 0) {
            s.n_plan = plan_.slots[i].n_plan;
            group.push_back(&s);
        }
    }
    if (!group.empty()) {
        decode_group(std::move(group));
    }
}

// Where a padded slot's throw-away token goes: after what its sequence holds, so that
// removing it keeps the rest. An idle slot may hold a finished request's sequence for the
// prefix cache; a token at position 0 would break its positions' order, and removing it
// from there would wipe what the cache says the slot holds.
llama_pos Scheduler::pad_position(const Slot & s) const {
    if (s.active() || cache_ == nullptr) {
        return s.n_past;
    }
    return static_cast<llama_pos>(cache_->held(static_cast<size_t>(s.seq)).size());
}

void Scheduler::decode_group(std::vector<Slot *> group) {
    // In seq_id order: llama.cpp puts only consecutive sequences into one forward pass.
    std::sort(group.begin(), group.end(), [](const Slot * a, const Slot * b) { return a->seq < b->seq; });
    batch_.n_tokens = 0;
    int64_t n_prompt_tokens = 0, n_gen_tokens = 0, n_padding = 0;
    for (Slot * s : group) {
        s->i_logits = -1;
        s->scoring.n_rows = 0;
        if (s->pad) {
            // Any token: its KV entry is removed after the call.
            batch_add(batch_, 0, pad_position(*s), s->seq, false);
            ++n_padding;
        } else if (s->prefilling()) {
            const bool last_chunk = s->n_fed + static_cast<size_t>(s->n_plan) == s->prompt.size();
            for (int32_t j = 0; j < s->n_plan; ++j) {
                const size_t p = s->n_fed + static_cast<size_t>(j);
                const bool gen_logits = last_chunk && j == s->n_plan - 1 && !s->score_only();
                // Row p's logits score token p + 1 (scored rows of a chunk are consecutive).
                const bool score = s->scoring.scores(p);
                const int32_t i = batch_add(batch_, s->prompt[p], s->n_past + j, s->seq, gen_logits || score);
                if (gen_logits) {
                    s->i_logits = i;
                }
                if (score) {
                    s->scoring.add_row(i, p);
                }
            }
            n_prompt_tokens += s->n_plan;
            for (int32_t j = 0; j < s->n_pad_tokens; ++j) {  // any token: removed after the call
                batch_add(batch_, 0, s->n_past + s->n_plan + j, s->seq, false);
            }
            n_padding += s->n_pad_tokens;
        } else {
            s->i_logits = batch_add(batch_, s->pending, s->n_past, s->seq, true);
            ++n_gen_tokens;
        }
    }

    if (device_ != nullptr) {
        const bool all_on_device = std::all_of(group.begin(), group.end(),
                                               [](const Slot * s) { return (s->i_logits < 0 && s->scoring.n_rows == 0) || s->on_device; });
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
                llama_memory_seq_rm(mem_, s->seq, pad_position(*s), -1);
            } else if (s->n_pad_tokens > 0) {
                llama_memory_seq_rm(mem_, s->seq, s->n_past + s->n_plan, -1);
                s->n_pad_tokens = 0;
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
        score_rows(group, ctx_, model_, pool_, stats_);
        std::vector<Slot *> ready;
        for (Slot * s : group) {
            if (s->prefilling()) {
                s->n_fed += static_cast<size_t>(s->n_plan);
                s->completion.n_prompt_tokens += s->n_plan;
                stats_.n_prompt_tokens += s->n_plan;
                if (s->n_fed == s->prompt.size()) {
                    // Its prompt is in: it generates from its first token (chosen below), or,
                    // scored only, is done (retire_scored ends it, after the next step's copies).
                    s->state = s->score_only() ? SlotState::Scored : SlotState::Generating;
                    if (s->n_resumed > 0) {
                        uncount_resumed(*s);
                    }
                }
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
        if (cache_ != nullptr && drop_idle_holds()) {
            decode_group(std::move(group));  // the same batch, with the cells they held
            return;
        }
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
        s.completion.top_logprobs.push_back(top_logprob_entries(model_, top));
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
    // A request that ended normally leaves its sequence cached: its prompt and the tokens
    // fed after it (the last one chosen never was). Failed and cancelled ones leave nothing.
    if (cache_ != nullptr && (reason == FinishReason::Stop || reason == FinishReason::Length) && s.n_past > 0) {
        cache_->hold(static_cast<size_t>(s.seq), kv_tokens(s));
    } else {
        llama_memory_seq_rm(mem_, s.seq, -1, -1);
    }
    s.sampler.reset();  // an attached device-sampling chain stays, for the slot's next request
    s.grammar.reset();
    s.on_device = false;
    s.state = SlotState::Idle;
    s.prompt.clear();
    s.scoring.tokens.clear();
    s.n_fed = 0;
    s.n_past = 0;
    s.n_resumed = 0;
    if (reason == FinishReason::Error) {
        ++stats_.n_failed;
    }
    Request request = std::move(s.request);
    s.request = Request();
    deliver(request, std::move(s.completion), s.text, s.thought_open, reason, error);
}

void Scheduler::cancel_all() noexcept {
    for (auto & s : slots_) {
        if (s->active()) {
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
