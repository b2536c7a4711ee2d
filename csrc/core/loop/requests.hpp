// The one way a request enters the loop: Context::generate and Engine::submit both check
// their options and prompts here, resolve seeds here and fan a prompt's n samples out
// here, so that the two doors cannot drift apart.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/base/params.hpp"
#include "core/loop/scheduler.hpp"
#include "core/model/model.hpp"

namespace fastpar {

// One entry of a call's options, checked and with its seed drawn: the samples of every
// prompt that uses it start from this seed.
struct AdmittedParams {
    std::shared_ptr<const GenerateParams> params;
    uint32_t seed = 0;
};

// Throws InvalidArgument naming the first option out of range: validate()'s ranges, then
// the JSON schema, which must compile (a GBNF grammar is compiled per prompt, where it may
// fail alone). Nothing has been queued when it throws.
void check_params(const GenerateParams & params);

// check_params, then the seed resolved once (-1 draws one at random).
AdmittedParams admit_params(const GenerateParams & params);

// Throws InvalidArgument for a prompt this model cannot take before any work: chat
// messages for a model without a chat template.
void check_prompt(const Model & model, const Prompt & prompt);

// Tools (GenerateParams::tools): the params for the prompt text that `messages_json` (an
// OpenAI messages array) renders to with them, which is stored in `prompt_out`: the calls'
// grammar (tool_choice "required", a named function, or the generic format), its prefill,
// the parser of the output and the template's stop strings added, and the tools fields
// cleared (rendered once). Throws InvalidArgument for tools or messages the template
// cannot take.
GenerateParams render_tools(const Model & model, const std::string & messages_json, const GenerateParams & params,
                            std::string & prompt_out);

// A prompt whose params have tools, rendered (render_tools) into a text prompt with its own
// params (the seed kept); others are left as they are. Throws InvalidArgument for a prompt
// with tools that is not chat messages.
void apply_tools(const Model & model, Prompt & prompt, AdmittedParams & admitted);

// A call's prompts with apply_tools done, each with its own params (admitted holds one
// entry for all or one per prompt); both empty when no params have tools, so that the
// caller uses its own. InvalidArgument names the prompt.
struct Rendered {
    std::vector<Prompt> prompts;
    std::vector<AdmittedParams> params;
};
Rendered apply_tools(const Model & model, const std::vector<Prompt> & prompts,
                     const std::vector<AdmittedParams> & admitted);

// The scheduler requests of one prompt: params.n of them, sample j seeded seed + j
// (modulo 2^32); with n > 1 they carry `group` (nonzero, unique among the requests the
// scheduler holds) so that they decode the prompt once and copy its KV cache
// (StepPolicy::share_samples). The caller sets each one's callbacks.
std::vector<Request> fan_out(Prompt prompt, const AdmittedParams & admitted, uint64_t group,
                             Clock::time_point t_submit);

}  // namespace fastpar
