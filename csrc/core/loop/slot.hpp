// One slot of the scheduler: slot i is llama.cpp sequence i, and holds at most one request
// at a time, with its prompt's progress, its sampler chain, its constraint and its text.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/base/results.hpp"
#include "core/loop/prompt_scoring.hpp"
#include "core/loop/scheduler.hpp"
#include "core/loop/text_stream.hpp"
#include "core/sampling/chain_shape.hpp"
#include "core/sampling/sampling.hpp"
#include "core/structured/structured.hpp"
#include "llama.h"

namespace fastpar {

// Milliseconds from t0 to now.
inline double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A slot's life, one state at a time (as llama.cpp's server gives its slots one). Idle ->
// Prompt (admitted) -> Generating (its prompt decoded) -> Idle (finished); a scoring
// request that generates nothing goes Prompt -> Scored -> Idle instead; a Prompt slot may
// be Waiting for a step while another slot decodes the prefix it will copy.
enum class SlotState : uint8_t {
    Idle,        // holds no request
    Prompt,      // decodes its prompt, chunk by chunk
    Waiting,     // this step: leaves its prompt's prefix to a slot that decodes it first
    Generating,  // decodes one token a step: the last one it chose
    // Scored its whole prompt and generates nothing (max_tokens = 0); it ends at the next
    // step, after that step's prefix copies, so that slots waiting for its prefix can
    // still copy it (Scheduler::retire_scored).
    Scored,
};

struct Slot {
    llama_seq_id seq = 0;
    SlotState state = SlotState::Idle;
    Request request;
    std::vector<llama_token> prompt;
    size_t n_fed = 0;          // prompt tokens already in the KV cache
    llama_pos n_past = 0;      // positions of this sequence in the KV cache
    llama_token pending = -1;  // sampled token still to be fed
    SamplerPtr sampler;        // this request's chain (it always runs on the host)
    ChainShape shape;          // and its shape, computed once with it
    GrammarPtr grammar;        // its json_schema or grammar constraint, or null
    bool on_device = false;    // its logits are cut down on the device (device sampling)
    TextStream text;           // its text, streamed or not
    bool thought_open = false; // its prompt ends inside a thought (reasoning "split")
    Completion completion;
    PromptScoring scoring;     // with GenerateParams::prompt_logprobs
    uint64_t order = 0;        // admitted as the order-th request: an embeddings step goes oldest first,
                               // and a preemption suspends the latest of the least urgent
    size_t n_resumed = 0;      // a resumed request: its generated tokens that end `prompt`
    // Set while building a batch:
    int32_t n_plan = 0;        // tokens this slot adds to the batch
    int32_t i_logits = -1;     // batch index whose logits this slot samples, or -1
    bool pad = false;          // adds one throw-away token only, to keep the step one pass
    int32_t n_pad_tokens = 0;  // throw-away tokens after its prompt chunk (StepPolicy::equal_chunks)

    bool active() const { return state != SlotState::Idle; }
    // Still has prompt tokens to decode (n_fed < prompt.size()).
    bool prefilling() const { return state == SlotState::Prompt || state == SlotState::Waiting; }
    // Scores its prompt and generates nothing: finished once the prompt is decoded.
    bool score_only() const { return scoring.on() && request.params->max_tokens == 0; }
};

// The tokens whose KV `s`'s sequence holds: its prompt's decoded part and the generated
// tokens fed after it (scheduler.cpp).
std::vector<llama_token> kv_tokens(const Slot & s);

// Ends `request` with completion `c` and reason: the rest of its text (in `text`) streamed,
// its tool calls parsed out, its thought split off, its on_done called (scheduler.cpp).
void deliver(Request & request, Completion c, TextStream & text, bool thought_open, FinishReason reason,
             const std::string & error);

// A resumed slot's prompt is decoded: its completion counts the original prompt alone
// (the tokens it generated before it was suspended are no prompt tokens; preempt.cpp).
void uncount_resumed(Slot & s);

// A request preempted by a more urgent one (Scheduler::preempt), queued again with what it
// needs to go on exactly where it stopped: its prompt and every token chosen so far (decoded
// again when it resumes, or found in the prefix cache), its chain and constraint in their
// states, its text and its completion so far.
struct Suspended {
    std::vector<llama_token> tokens;
    SamplerPtr sampler;
    ChainShape shape;
    GrammarPtr grammar;
    bool thought_open = false;
    TextStream text;
    Completion completion;
    uint64_t order = 0;
};

}  // namespace fastpar
