// A Context's parts the tests set, as its friend: the step policy of one call, the grammar
// cache's allowed-sets option and the prefix cache's selective saving. Context::generate
// itself runs the call.
#include <memory>
#include <stdexcept>
#include <utility>

#include "core/loop/prefix_cache.hpp"
#include "core/structured/grammar_cache.hpp"
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

std::unique_ptr<Engine> ContextTesting::engine_with_policy(std::shared_ptr<const Model> model,
                                                           const ContextParams & params, int32_t max_queued,
                                                           const StepPolicy & policy) {
    return std::unique_ptr<Engine>(new Engine(std::make_unique<Context>(std::move(model), params), max_queued, policy));
}

void ContextTesting::set_allowed_sets(Context & ctx, bool on) {
    std::lock_guard<std::mutex> lock(ctx.mutex_);
    grammars(ctx).set_allowed_sets(on);
}

bool ContextTesting::allowed_sets(Context & ctx) {
    std::lock_guard<std::mutex> lock(ctx.mutex_);
    return !ctx.grammars_ || ctx.grammars_->allowed_sets();
}

void ContextTesting::set_cache_selective(Context & ctx, bool on) {
    std::lock_guard<std::mutex> lock(ctx.mutex_);
    if (!ctx.cache_) {
        throw std::invalid_argument("set_cache_selective: the context has no prefix cache");
    }
    ctx.cache_->set_selective(on);
}

}  // namespace fastpar
