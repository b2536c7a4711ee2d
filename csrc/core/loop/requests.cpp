#include "core/loop/requests.hpp"

#include <algorithm>

#include "core/base/errors.hpp"
#include "core/model/chat.hpp"
#include "core/sampling/sampling.hpp"
#include "core/structured/structured.hpp"

namespace fastpar {

void check_params(const GenerateParams & params) {
    validate(params);
    if (!params.tools.empty() && constrained(params)) {
        throw InvalidArgument("tools cannot be combined with json_schema, grammar, choice or regex: tool calls are "
                              "constrained by the functions' parameters");
    }
    if (params.tools.empty() && !params.tool_choice.empty()) {
        throw InvalidArgument("tool_choice was given without tools");
    }
    if (!params.json_schema.empty()) {
        validate_json_schema(params.json_schema);
    }
    if (!params.regex.empty()) {
        validate_regex(params.regex);
    }
}

AdmittedParams admit_params(const GenerateParams & params) {
    check_params(params);
    return AdmittedParams{std::make_shared<const GenerateParams>(params), resolve_seed(params)};
}

void check_prompt(const Model & model, const Prompt & prompt) {
    if (prompt.is_chat && !model.has_chat_template()) {
        throw InvalidArgument("model '" + model.path() + "' has no chat template; pass prompts as plain strings");
    }
}

GenerateParams render_tools(const Model & model, const std::string & messages_json, const GenerateParams & params,
                            std::string & prompt_out) {
    ChatRender r = model.chat_templates().render(messages_json, params.tools,
                                                 params.tool_choice.empty() ? "auto" : params.tool_choice,
                                                 params.parallel_tool_calls);
    GenerateParams out = params;
    out.tools.clear();
    out.tool_choice.clear();
    out.parallel_tool_calls = false;
    if (!r.grammar.empty()) {
        out.grammar = std::move(r.grammar);
        out.grammar_prefill = std::move(r.grammar_prefill);
    }
    out.tool_parser = std::move(r.parser);
    for (std::string & s : r.stops) {
        if (std::find(out.stop.begin(), out.stop.end(), s) == out.stop.end()) {
            out.stop.push_back(std::move(s));
        }
    }
    prompt_out = std::move(r.prompt);
    return out;
}

void apply_tools(const Model & model, Prompt & prompt, AdmittedParams & admitted) {
    if (admitted.params->tools.empty()) {
        return;
    }
    if (!prompt.is_chat) {
        throw InvalidArgument("a prompt with tools must be chat messages: the model's template renders the tools");
    }
    std::string text;
    admitted.params = std::make_shared<const GenerateParams>(
        render_tools(model, messages_json(prompt.messages), *admitted.params, text));
    prompt = Prompt{};
    prompt.text = std::move(text);
}

Rendered apply_tools(const Model & model, const std::vector<Prompt> & prompts,
                     const std::vector<AdmittedParams> & admitted) {
    Rendered out;
    if (std::none_of(admitted.begin(), admitted.end(), [](const AdmittedParams & a) { return !a.params->tools.empty(); })) {
        return out;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
        out.prompts.push_back(prompts[i]);
        out.params.push_back(admitted[admitted.size() == 1 ? 0 : i]);
        try {
            apply_tools(model, out.prompts.back(), out.params.back());
        } catch (const InvalidArgument & e) {
            throw InvalidArgument("prompts[" + std::to_string(i) + "]: " + e.what());
        }
    }
    return out;
}

std::vector<Request> fan_out(Prompt prompt, const AdmittedParams & admitted, uint64_t group,
                             Clock::time_point t_submit) {
    const int32_t n = admitted.params->n;
    std::vector<Request> out(static_cast<size_t>(n));
    for (int32_t j = 0; j < n; ++j) {
        Request & request = out[static_cast<size_t>(j)];
        request.prompt = j + 1 < n ? prompt : std::move(prompt);  // the last sample takes it
        request.params = admitted.params;
        request.seed = admitted.seed + static_cast<uint32_t>(j);  // wraps modulo 2^32
        request.group = n > 1 ? group : 0;
        request.t_submit = t_submit;
    }
    return out;
}

}  // namespace fastpar
