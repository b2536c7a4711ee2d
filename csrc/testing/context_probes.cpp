// A Context's part the tests set, as its friend: the step policy of one call.
// Context::generate itself runs the call.
#include <memory>
#include <utility>

#include "core/structured/structured.hpp"
#include "testing/probes.hpp"

namespace fastpar {

GrammarCache & ContextTesting::grammars(Context & ctx) {
    if (!ctx.grammars_) {
        ctx.grammars_ = std::make_unique<GrammarCache>(ctx.model_->vocab(), ctx.policy_.mask_workers);
    }
    return *ctx.grammars_;
}

std::vector<Completion> ContextTesting::generate_with_policy(Context & ctx, const std::vector<std::string> & texts,
                                                             const std::vector<GenerateParams> & params,
                                                             const StepPolicy & policy) {
    std::vector<Prompt> prompts(texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
        prompts[i].text = texts[i];
    }
    StepPolicy own;
    {
        std::lock_guard<std::mutex> lock(ctx.mutex_);
        grammars(ctx);  // with the context's mask workers, not this call's
        own = std::exchange(ctx.policy_, policy);
    }
    struct Restore {
        Context & ctx;
        StepPolicy & own;
        ~Restore() {
            std::lock_guard<std::mutex> lock(ctx.mutex_);
            ctx.policy_ = own;
        }
    } restore{ctx, own};
    return ctx.generate(prompts, params);
}

}  // namespace fastpar
