#include "core/loop/admit.hpp"

#include <algorithm>
#include <string>

#include "core/base/errors.hpp"
#include "core/loop/scheduler.hpp"
#include "core/structured/reasoning.hpp"

namespace fastpar {

void tokenize_prompt(const Model & model, const Prompt & prompt, const std::string & reasoning, Tokenized & out) {
    try {
        if (prompt.is_tokens) {
            const int32_t n_vocab = model.n_vocab();
            for (size_t i = 0; i < prompt.tokens.size(); ++i) {
                if (prompt.tokens[i] < 0 || prompt.tokens[i] >= n_vocab) {
                    throw InvalidArgument("prompt token " + std::to_string(i) + " is " +
                                          std::to_string(prompt.tokens[i]) + ", not a token id of this model (0 to " +
                                          std::to_string(n_vocab - 1) + ")");
                }
            }
            out.tokens.assign(prompt.tokens.begin(), prompt.tokens.end());
            if (reasoning == "split") {  // the last few tokens' text holds any <think>
                std::string tail;
                for (size_t i = out.tokens.size() > 4 ? out.tokens.size() - 4 : 0; i < out.tokens.size(); ++i) {
                    tail += model.token_piece(out.tokens[i]);
                }
                out.thought_open = opens_thought(tail);
            }
            return;
        }
        std::string text = prompt.is_chat ? model.apply_chat_template(prompt.messages) : prompt.text;
        if (reasoning == "off" && prompt.is_chat) {
            text = close_thought(text);
        }
        out.thought_open = reasoning == "split" && opens_thought(text);
        out.tokens = model.tokenize(text);
    } catch (const std::exception & e) {
        out.failed = true;
        out.error = e.what();
    }
}

std::optional<Completion> refusal(const Tokenized & t, const GenerateParams & params, int32_t n_ctx_seq,
                                  int32_t n_vocab) {
    Completion c;
    c.finish_reason = FinishReason::Error;
    if (t.failed) {
        c.error = t.error;
        return c;
    }
    for (const auto & bias : params.logit_bias) {
        if (bias.first >= n_vocab) {
            c.error = "logit_bias names token " + std::to_string(bias.first) + ", not a token id of this model (0 to " +
                      std::to_string(n_vocab - 1) + ")";
            return c;
        }
    }
    for (const int32_t token : params.allowed_token_ids) {
        if (token >= n_vocab) {
            c.error = "allowed_token_ids holds " + std::to_string(token) + ", not a token id of this model (0 to " +
                      std::to_string(n_vocab - 1) + ")";
            return c;
        }
    }
    const std::vector<llama_token> & tokens = t.tokens;
    if (tokens.empty()) {
        c.error = "prompt is empty: it tokenizes to no tokens, so there is nothing to continue";
        return c;
    }
    // Scoring alone never decodes the last token, and keeps no position for
    // generation: n_ctx_seq positions score n_ctx_seq + 1 tokens.
    const bool score_only = params.prompt_logprobs && params.max_tokens == 0;
    if (tokens.size() >= static_cast<size_t>(n_ctx_seq) + (score_only ? 2 : 0)) {
        c.error = "prompt has " + std::to_string(tokens.size()) + " tokens, but n_ctx_per_seq=" +
                  std::to_string(n_ctx_seq) + " allows at most " +
                  (score_only ? std::to_string(n_ctx_seq + 1) + " to score"
                              : std::to_string(n_ctx_seq - 1) + " (one position is kept for generation)") +
                  "; raise n_ctx_per_seq or shorten it";
        return c;
    }
    if (params.max_tokens == 0 && (!score_only || tokens.size() < 2)) {
        c.finish_reason = FinishReason::Length;
        if (score_only) {
            // One token: nothing to decode, nothing to score but the first.
            init_prompt_logprobs(c, tokens, params);
        }
        return c;
    }
    return std::nullopt;
}

void start_slot(Slot & slot, Request && request, std::vector<llama_token> tokens) {
    const GenerateParams & params = *request.params;
    if (request.on_start) {
        request.on_start();
    }
    slot.completion = Completion();
    slot.scoring = PromptScoring();
    if (params.prompt_logprobs) {
        slot.scoring.tokens = tokens;
        slot.scoring.from = static_cast<size_t>(params.prompt_logprobs_from);
        init_prompt_logprobs(slot.completion, tokens, params);
        if (params.max_tokens == 0) {
            tokens.pop_back();  // scored only: its logits would predict nothing
        }
    }
    slot.request = std::move(request);
    slot.prompt = std::move(tokens);
    slot.n_fed = 0;
    slot.n_past = 0;
    slot.pending = -1;
    slot.text.reset(static_cast<bool>(slot.request.on_text));
    slot.completion.t_queued_ms = ms_since(slot.request.t_submit);
    slot.state = SlotState::Prompt;
}

bool Scheduler::urgent_queued() const {
    const int32_t head = queue_.front().priority();
    return std::any_of(slots_.begin(), slots_.end(), [head](const std::unique_ptr<Slot> & s) {
        return s->active() && s->request.priority() > head;
    });
}

void Scheduler::admit() {
    if (queue_.empty()) {
        return;  // every step once the queue is drained: nothing to admit, no slots to count
    }
    const auto n_free = static_cast<size_t>(
        std::count_if(slots_.begin(), slots_.end(), [](const std::unique_ptr<Slot> & s) { return !s->active(); }));
    if (n_free == 0) {
        wave_hold_from_ = -1;
        return;
    }
    // Refills in waves (step_policy.hpp): while sequences run, freed slots wait until a wave's
    // worth of them (or one for each waiting prompt) is free, at most max_wave_hold decode
    // calls (the Engine's bound on a first token's delay). The queue is in priority order:
    // a request more urgent than a running one (one preempt() made room for) is not held.
    if (n_free < slots_.size() && n_free < std::min(policy_.refill_wave, queue_.size()) && !urgent_queued()) {
        if (wave_hold_from_ < 0) {
            wave_hold_from_ = stats_.n_decode_calls;
        }
        if (stats_.n_decode_calls - wave_hold_from_ < policy_.max_wave_hold) {
            return;
        }
    }
    wave_hold_from_ = -1;
    // Tokenizing is most of what admitting a prompt costs, so the prompts about to take
    // the free slots are tokenized on the pool at once; llama_tokenize is thread-safe.
    std::vector<Tokenized> ahead;
    if (pool_ != nullptr && queue_.size() >= kMinPooled && n_free >= kMinPooled) {
        ahead.resize(std::min(n_free, queue_.size()));
        pool_->run(ahead.size(), [&](size_t i) {
            if (!queue_[i].suspended) {  // a suspended request has its tokens
                tokenize_prompt(model_, queue_[i].prompt, queue_[i].params->reasoning, ahead[i]);
            }
        });
    }
    size_t n_taken = 0;
    const auto has_free = [this] {
        return std::any_of(slots_.begin(), slots_.end(), [](const std::unique_ptr<Slot> & s) { return !s->active(); });
    };
    while (!queue_.empty() && has_free()) {
        Request request = std::move(queue_.front());
        queue_.pop_front();
        if (request.suspended) {
            ++n_taken;
            resume(std::move(request));
            continue;
        }
        const GenerateParams & params = *request.params;
        Tokenized t;
        if (n_taken < ahead.size()) {
            t = std::move(ahead[n_taken]);
        } else {
            tokenize_prompt(model_, request.prompt, params.reasoning, t);
        }
        ++n_taken;
        if (embeddings_) {
            const std::string why = t.failed ? t.error : embedding_refusal(request.prompt, t.tokens.size());
            if (!why.empty()) {
                ++stats_.n_failed;
                complete_unstarted(request, FinishReason::Error, why);
                continue;
            }
            Slot & slot = pick_slot(t.tokens, false);
            start_slot(slot, std::move(request), std::move(t.tokens));
            slot.order = n_admitted_++;
            continue;
        }
        if (std::optional<Completion> c = refusal(t, params, n_ctx_seq_, model_.n_vocab())) {
            if (c->finish_reason == FinishReason::Error) {
                ++stats_.n_failed;
            }
            c->t_queued_ms = c->t_total_ms = ms_since(request.t_submit);
            request.on_done(std::move(*c));
            continue;
        }
        GrammarPtr grammar;
        if (constrained(params)) {
            try {
                grammar = grammars_.make(params, t.thought_open);
            } catch (const std::exception & e) {
                // This prompt only; never generated without its constraint.
                ++stats_.n_failed;
                complete_unstarted(request, FinishReason::Error, e.what());
                continue;
            }
        }
        Slot & slot = pick_slot(t.tokens, !params.prompt_logprobs);
        choose_sampler(slot, params, request.seed);
        slot.grammar = std::move(grammar);
        slot.thought_open = t.thought_open;
        start_slot(slot, std::move(request), std::move(t.tokens));
        slot.order = n_admitted_++;
        reuse_cached(slot);
        pair_for_sharing(slot);
    }
}

// The free slot for a prompt: the one whose cached sequence starts like it the longest way
// (at least the cache's minimum), else an empty one, else the least recently used (recent
// sequences are kept longest). Where a step costs the span of slots it covers (a GPU's
// compact_slots), a slot that widens the running slots' span least comes before those two:
// the least recently used idle slots of a server with more slots than requests are spread
// over all the slots, and steps over them would cost as if every slot ran. But a slot whose
// cached sequence the cache would save to host memory (may_save) comes after every slot
// that costs no such copy, however it widens the span: its conversation's next turn, often
// the very next prompt admitted, would restore it, two copies of its whole KV while the
// device waits, where a wider span costs ~0.07 ms a step (compaction's rule, compact.cpp).
// A prompt that may reuse the cache (`reuses`: not scored) is noted first (note_prompt), so
// that may_save already counts it: a prompt finding that a dropped sequence would have
// served it turns selective saving on, and the slot it takes must not be the one whose
// sequence that makes worth saving.
Slot & Scheduler::pick_slot(const std::vector<llama_token> & tokens, bool reuses) {
    std::vector<size_t> held_n(slots_.size(), 0);  // how much of the prompt each idle slot holds
    if (cache_ != nullptr) {
        size_t longest = 0;
        for (const auto & sp : slots_) {
            if (!sp->active()) {
                const auto seq = static_cast<size_t>(sp->seq);
                held_n[seq] = common_prefix(cache_->held(seq), tokens);
                longest = std::max(longest, held_n[seq]);
            }
        }
        if (reuses && tokens.size() > 1) {
            cache_->note_prompt(tokens, cached_for(tokens, longest));
        }
    }
    size_t lo = slots_.size(), hi = 0;  // the running slots' span (lo > hi: none, or not counted)
    if (policy_.compact_slots) {
        for (const auto & sp : slots_) {
            if (sp->active()) {
                lo = std::min(lo, static_cast<size_t>(sp->seq));
                hi = std::max(hi, static_cast<size_t>(sp->seq));
            }
        }
    }
    Slot * best = nullptr;
    size_t best_n = 0, best_widens = 0;
    bool best_saves = false;
    uint64_t best_since = 0;
    for (auto & sp : slots_) {
        if (sp->active()) {
            continue;
        }
        const auto seq = static_cast<size_t>(sp->seq);
        size_t n = 0;
        bool saves = false;
        uint64_t since = 0;
        if (cache_ != nullptr) {
            n = cache_->reusable(held_n[seq]);
            saves = n < cache_->held(seq).size() && cache_->may_save(seq);
            since = cache_->held_since(seq);
        }
        const size_t widens = lo > hi ? 0 : seq > hi ? seq - hi : lo > seq ? lo - seq : 0;
        if (best == nullptr || n > best_n ||
            (n == best_n && (saves < best_saves ||
                             (saves == best_saves && (widens < best_widens ||
                                                      (widens == best_widens && since < best_since)))))) {
            best = sp.get();
            best_n = n;
            best_saves = saves;
            best_widens = widens;
            best_since = since;
        }
    }
    return *best;  // admit() calls it only while a slot is free
}

// The tokens `prompt` (not scored) will start from the cache, given the most of it an idle
// slot holds (`longest`; pick_slot takes that slot): as reuse_cached decides.
size_t Scheduler::cached_for(const std::vector<llama_token> & prompt, size_t longest) const {
    const size_t limit = prompt.size() - 1;
    const size_t n = cache_->reusable(std::min(longest, limit));
    const CacheMatch host = cache_->longest_on_host(prompt, limit);
    return cache_->host_beats(host, n) ? host.n : n;
}

// Where a prompt with `n_cached` tokens cached or copied starts decoding. On a CPU a suffix
// of fewer than kCpuTiledAttentionRows tokens is that many query rows of its slot's KV
// stream, which llama.cpp's flash attention computes a row at a time; over a long prefix
// that kernel is the step's cost (a 51-token suffix after 1,500 cached tokens: 18 ms a
// token, against 4.9 for 65 tokens). Decoding a few cached tokens again brings the suffix
// to the tiled kernel's rows, when the cost model (step_policy.hpp) says that is cheaper.
// One row more than the kernel's: in a step beside generating slots (one token each)
// llama.cpp's first pass takes one token of every sequence, and the rest must still be
// kCpuTiledAttentionRows (64 tokens then went 1 + 63, the row kernel: 8.4 s a step, not 2).
size_t Scheduler::tiled_suffix_start(size_t n_cached, size_t n_prompt) const {
    const size_t rows = kCpuTiledAttentionRows + 1;
    const double weight = policy_.tiled_suffix_cell_weight;
    if (weight <= 0.0 || n_cached == 0 || n_prompt < rows || n_prompt - n_cached >= rows ||
        static_cast<size_t>(n_batch_) < rows) {
        return n_cached;  // a batch of fewer rows never reaches the tiled kernel
    }
    // A row's cost in units of its matrix products: 1, plus its attention over the cells before it.
    const double as_is = static_cast<double>(n_prompt - n_cached) *
                         (1.0 + kRowKernelCellCost * static_cast<double>(n_cached) * weight);
    const double widened = static_cast<double>(rows) *
                           (1.0 + kTiledKernelCellCost * static_cast<double>(n_prompt - rows) * weight);
    return widened * kTiledSuffixMinGain < as_is ? n_prompt - rows : n_cached;
}

// Starts `slot`'s prompt from the longest prefix cached in the slot or in host memory, and
// trims the slot's sequence to it (prefix_cache.hpp). The last prompt token is always
// decoded (its logits start generation), and so is every position whose logits score a
// token (prompt_logprobs). A scoring request takes nothing from it: reused KV was computed in
// other batch shapes, which round differently, and scores must equal llama-perplexity's.
void Scheduler::reuse_cached(Slot & slot) {
    const auto seq = static_cast<size_t>(slot.seq);
    if (cache_ == nullptr) {
        // Defensive: the slot's sequence must be empty before it is reused.
        if (llama_memory_seq_pos_max(mem_, slot.seq) >= 0) {
            llama_memory_seq_rm(mem_, slot.seq, -1, -1);
        }
        return;
    }
    const size_t limit = slot.scoring.on() ? 0 : slot.prompt.size() - 1;
    const std::vector<llama_token> & held = cache_->held(seq);
    size_t n = cache_->reusable(std::min(common_prefix(held, slot.prompt), limit));
    CacheMatch host = cache_->longest_on_host(slot.prompt, limit);
    bool from_host = cache_->host_beats(host, n);
    if (n < held.size() && cache_->worth_saving(seq, from_host ? 0 : n)) {
        if (from_host) {
            cache_->touch(host.host);  // the entry about to be restored is evicted last
        }
        cache_->save(ctx_, seq);  // what this slot held beyond n stays cached in host memory
        if (from_host) {
            // The save dropped entries (superseded, or evicted for room), which moves the
            // others: restoring by the old index gave a prompt another prompt's KV. Look
            // again; the entry is gone only if the budget cannot hold it beside the new one.
            host = cache_->longest_on_host(slot.prompt, limit);
            from_host = cache_->host_beats(host, n);
        }
    }
    if (from_host) {
        llama_memory_seq_rm(mem_, slot.seq, -1, -1);
        n = cache_->restore(ctx_, host.host, seq) ? host.n : 0;
    }
    cache_->release(seq);
    n = tiled_suffix_start(n, slot.prompt.size());
    llama_memory_seq_rm(mem_, slot.seq, static_cast<llama_pos>(n), -1);
    if (n == 0) {
        return;
    }
    cache_->count_hit(n);
    slot.n_fed = n;
    slot.n_past = static_cast<llama_pos>(n);
    slot.completion.n_prompt_tokens_cached = static_cast<int32_t>(n);
    stats_.n_prompt_tokens_cached += static_cast<int64_t>(n);
}

}  // namespace fastpar
