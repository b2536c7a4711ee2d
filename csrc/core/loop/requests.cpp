#include "core/loop/requests.hpp"

#include "core/base/errors.hpp"
#include "core/sampling/sampling.hpp"
#include "core/structured/structured.hpp"

namespace fastpar {

void check_params(const GenerateParams & params) {
    validate(params);
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
