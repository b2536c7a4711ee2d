#include "core/loop/context.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <iterator>
#include <numeric>
#include <string>
#include <thread>

#include "core/threads/cpus.hpp"
#include "core/base/errors.hpp"
#include "core/base/log.hpp"
#include "core/sampling/sampling.hpp"
#include "core/loop/requests.hpp"
#include "core/model/gguf_check.hpp"
#include "core/loop/scheduler.hpp"

namespace fastpar {
namespace {

// Whether a sequence's KV cache can be copied up to a position: plain attention caches
// can; recurrent state (one state per sequence, not per position) and sliding-window
// caches (positions fall out of the window) cannot.
bool memory_copies_by_position(const llama_model * model) {
    return !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model) && llama_model_n_swa(model) == 0;
}

// ggml's type of a KV-cache type name (validate() accepted the name: one of kKvCacheTypes).
ggml_type kv_cache_type(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * n = ggml_type_name(static_cast<ggml_type>(t));
        if (n != nullptr && name == n) {
            return static_cast<ggml_type>(t);
        }
    }
    throw InvalidArgument("unknown KV cache type \"" + name + "\"");
}

// Bytes one value of a KV cache type takes (a q8_0 block of 32 values takes 34 bytes).
double bytes_per_value(ggml_type t) {
    return static_cast<double>(ggml_type_size(t)) / static_cast<double>(ggml_blck_size(t));
}

// A context of n_ctx positions needs at least this much host memory: llama.cpp's record of
// each KV cell (its position, shift and 256 sequence bits) and, when the cache is on the
// host and every layer attends to all positions, each cell's K and V rows. Asking
// for more than the machine has does not fail cleanly: the records are written as they are
// allocated, so the kernel kills the process. Throws InvalidArgument instead.
void check_host_memory(const Model & model, const ContextParams & params, int64_t n_ctx) {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
#else
    const long pages = 0, page = 0;
#endif
    if (pages <= 0 || page <= 0) {
        return;
    }
    const double have = static_cast<double>(pages) * static_cast<double>(page);
    const llama_model * m = model.get();
    double per_cell = 40.0;
    const int32_t n_head = llama_model_n_head(m);
    if (!model.on_gpu() && memory_copies_by_position(m) && n_head > 0) {
        const double bytes = bytes_per_value(kv_cache_type(params.type_k)) + bytes_per_value(kv_cache_type(params.type_v));
        per_cell += bytes * llama_model_n_layer(m) * (static_cast<double>(llama_model_n_embd(m)) / n_head) *
                    llama_model_n_head_kv(m);
    }
    const double need = per_cell * static_cast<double>(n_ctx);
    if (need > have) {
        const auto gib = [](double b) { return std::to_string(static_cast<long long>(b / (1 << 30))) + " GiB"; };
        throw InvalidArgument("a context of " + std::to_string(n_ctx) +
                              " positions (n_parallel x n_ctx_per_seq) needs at least " + gib(need) +
                              " of memory for its KV cache; this machine has " + gib(have));
    }
}

// llama.cpp's pooling type of each name of kPoolings, in its order.
constexpr enum llama_pooling_type kPoolingTypes[] = {LLAMA_POOLING_TYPE_MEAN, LLAMA_POOLING_TYPE_CLS,
                                                     LLAMA_POOLING_TYPE_LAST, LLAMA_POOLING_TYPE_RANK};
static_assert(std::size(kPoolingTypes) == std::size(kPoolings), "a pooling type for every name");

// The pooling an embeddings context asks llama.cpp for: the one named, else the model's own
// (its GGUF's "<arch>.pooling_type") if it is one of kPoolings, else mean (ContextParams::pooling).
enum llama_pooling_type embedding_pooling(const Model & model, const std::string & name) {
    for (size_t i = 0; i < std::size(kPoolings); ++i) {
        if (name == kPoolings[i]) {
            return kPoolingTypes[i];
        }
    }
    char arch[128] = {0};
    if (llama_model_meta_val_str(model.get(), "general.architecture", arch, sizeof arch) > 0) {
        char value[32] = {0};
        const std::string key = std::string(arch) + ".pooling_type";
        if (llama_model_meta_val_str(model.get(), key.c_str(), value, sizeof value) > 0) {
            const int t = std::atoi(value);
            for (const enum llama_pooling_type known : kPoolingTypes) {
                if (t == known) {
                    return known;
                }
            }
        }
    }
    return LLAMA_POOLING_TYPE_MEAN;
}

// The name of kPoolings for one of kPoolingTypes.
const char * pooling_name(enum llama_pooling_type type) {
    for (size_t i = 0; i < std::size(kPoolingTypes); ++i) {
        if (type == kPoolingTypes[i]) {
            return kPoolings[i];
        }
    }
    return kPoolings[0];
}

// llama.cpp's physical batch (n_ubatch) for a model: params.hpp says why.
int32_t max_ubatch(const Model & model) { return model.on_gpu() ? kGpuBatch : kCpuBatch; }

#ifdef FASTPAR_DEBUG
void print_stats(const Stats & s) {
    std::fprintf(stderr,
                 "[fastpar] prompts %lld (failed %lld) | prompt %lld tok (+%lld shared), %.1f ms, %.1f tok/s | "
                 "generated %lld tok, %.1f ms, %.1f tok/s | wall %.1f ms, %.1f tok/s | decode calls %lld, "
                 "kv-full retries %lld, padding tokens %lld | sampling %.1f ms | backend %s, %lld tokens sampled "
                 "on the device\n",
                 static_cast<long long>(s.n_prompts), static_cast<long long>(s.n_failed),
                 static_cast<long long>(s.n_prompt_tokens), static_cast<long long>(s.n_prompt_tokens_shared),
                 s.t_prompt_ms, s.prompt_tokens_per_s(),
                 static_cast<long long>(s.n_gen_tokens), s.t_gen_ms, s.gen_tokens_per_s(), s.t_wall_ms,
                 s.total_tokens_per_s(), static_cast<long long>(s.n_decode_calls),
                 static_cast<long long>(s.n_kv_full_retries), static_cast<long long>(s.n_padding_tokens),
                 s.t_sample_ms, backend_name(),
                 static_cast<long long>(s.n_device_sampled));
}
#endif

}  // namespace

Context::Context(std::shared_ptr<const Model> model, const ContextParams & params)
    : model_(std::move(model)), params_(params) {
    if (!model_) {
        throw InvalidArgument("model is null");
    }
    validate(params_);
    if (!params_.embeddings) {
        check_host_memory(*model_, params_, static_cast<int64_t>(params_.n_parallel) * params_.n_ctx_per_seq);
    }
    if (params_.n_batch == 0 && params_.embeddings) {
        // A text is embedded whole in one batch: by default any text a slot can hold fits.
        const int32_t n_train = llama_model_n_ctx_train(model_->get());
        params_.n_batch = std::max(params_.n_parallel,
                                   n_train > 0 ? std::min(params_.n_ctx_per_seq, n_train) : params_.n_ctx_per_seq);
    } else if (params_.n_batch == 0) {
        params_.n_batch = std::max(params_.n_parallel, max_ubatch(*model_));
    }
    n_threads_ = params_.n_threads > 0 ? params_.n_threads : available_cpus();

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(params_.n_parallel) * static_cast<uint32_t>(params_.n_ctx_per_seq);
    cp.n_batch = static_cast<uint32_t>(params_.n_batch);
    cp.n_ubatch = static_cast<uint32_t>(std::min(params_.n_batch, max_ubatch(*model_)));
    cp.n_seq_max = static_cast<uint32_t>(params_.n_parallel);
    cp.n_threads = n_threads_;
    cp.n_threads_batch = n_threads_;
    cp.kv_unified = params_.kv_unified;
    if (params_.embeddings) {
        // A step is one physical batch with one KV buffer: llama.cpp pools a sequence over
        // the tokens one physical batch holds of it, and with a buffer per sequence it would
        // cut texts of different lengths into several (ContextParams::embeddings).
        if (llama_model_has_encoder(model_->get())) {
            throw InvalidArgument("embeddings from encoder-decoder models (T5 kinds) are not supported");
        }
        // A step's texts are all its KV holds, each removed when its vector is read: one
        // batch of cells is all the cache needs, whatever n_parallel x n_ctx_per_seq is.
        check_host_memory(*model_, params_, params_.n_batch);
        cp.kv_unified = true;
        params_.kv_unified = true;
        cp.embeddings = true;
        // llama.cpp reserves its graph for n_ubatch tokens of n_seq_max sequences, rounding
        // the tokens up to a multiple of the sequences but not the pooled rows it outputs,
        // and aborts on the mismatch (n_parallel=5, n_batch=512): a step's buffers hold the
        // next multiple. Texts and steps stay within n_batch (steps_n_batch).
        const uint32_t n_seq = cp.n_seq_max;
        cp.n_batch = (cp.n_batch + n_seq - 1) / n_seq * n_seq;
        cp.n_ctx = cp.n_batch;
        cp.n_ubatch = cp.n_batch;
        // Flash attention stays llama.cpp's auto (on): without it a batch of texts costs 3.3x
        // (each token attends to the whole batch, masked), though its CPU kernel, chosen by
        // the rows a batch holds, rounds a decoder's vector apart by batch shape (docs/api.md).
        cp.pooling_type = embedding_pooling(*model_, params_.pooling);
        pooling_ = pooling_name(cp.pooling_type);
        if (cp.pooling_type == LLAMA_POOLING_TYPE_RANK && !has_classification_head(model_->path())) {
            throw InvalidArgument("pooling \"rank\" needs a reranker, and " + model_->path() +
                                  " has no classification head (no cls or cls.output tensor) to score with");
        }
    }
    // flash_attn_type stays llama.cpp's auto, which it turns on for a quantized V cache.
    cp.type_k = kv_cache_type(params_.type_k);
    cp.type_v = kv_cache_type(params_.type_v);
    cp.no_perf = true;
    // Device sampling: every slot's chain goes in with the context, so llama.cpp
    // sizes its output buffer (pinned, about 3 x n_vocab floats a slot with samplers) and
    // reserves its graph for them now; attached later, both would happen again inside the
    // first generate call (docs/performance.md).
    std::vector<llama_sampler_seq_config> samplers;
    if (device_sampling()) {
        device_ = std::make_unique<DeviceSampling>(model_->n_vocab(), params_.n_parallel);
        for (int32_t seq = 0; seq < params_.n_parallel; ++seq) {
            samplers.push_back(llama_sampler_seq_config{seq, device_->new_chain(seq)});
        }
        cp.samplers = samplers.data();
        cp.n_samplers = samplers.size();
    }
    clear_last_llama_error();
    ctx_ = llama_init_from_model(model_->get(), cp);
    if (ctx_ == nullptr) {
        const std::string why = last_llama_error();
        throw Error("llama.cpp could not create a context with n_parallel=" + std::to_string(params_.n_parallel) +
                    ", n_ctx_per_seq=" + std::to_string(params_.n_ctx_per_seq) + ", type_k=" + params_.type_k +
                    ", type_v=" + params_.type_v +
                    (why.empty() ? std::string() : ": " + why));
    }
    // Read back what llama.cpp really gave: with kv_unified off each sequence owns
    // n_ctx / n_seq_max cells; with it on, our own per-sequence limit keeps the sum in bounds.
    const auto actual = static_cast<int32_t>(params_.kv_unified ? llama_n_ctx(ctx_) : llama_n_ctx_seq(ctx_));
    n_ctx_seq_ = std::min(params_.n_ctx_per_seq, actual);
    batch_ = llama_batch_init(steps_n_batch(), 0, 1);
    policy_ = resolve_step_policy(model_->output_on_gpu(), params_.kv_unified, memory_copies_by_position(model_->get()),
                                  params_.share_prefixes, params_.n_parallel, n_threads_);
    if (params_.embeddings) {
        policy_.refill_wave = 0;  // a step embeds whole texts: no prompt chunks to gather
    }
    if (!model_->on_gpu() && !params_.kv_unified) {
        const llama_model * m = model_->get();
        const double params = static_cast<double>(llama_model_n_params(m));
        const double n_head = llama_model_n_head(m);
        const double head = n_head > 0 ? llama_model_n_embd(m) / n_head : 0.0;
        policy_.tiled_suffix_cell_weight = params > 0 ? llama_model_n_layer(m) * n_head * head / params : 0.0;
    }
    // Host sampling of many sequences at once uses the decode threads' cores, idle then.
    pool_ = std::make_unique<TaskPool>(std::max(0, n_threads_ - 1), policy_.pool);
    // Trimming a cached sequence to a prompt's prefix needs a cache indexed by position.
    if (params_.prefix_cache_mib != 0 && !params_.embeddings && memory_copies_by_position(model_->get())) {
        cache_ = std::make_unique<PrefixCache>(static_cast<size_t>(params_.n_parallel),
                                               prefix_cache_budget(params_.prefix_cache_mib),
                                               static_cast<size_t>(kMinSharedPrefix), model_->on_gpu());
        if (!params_.prefix_cache_dir.empty()) {
            try {
                cache_->keep_in(params_.prefix_cache_dir, prefix_cache_identity(*model_, params_));
            } catch (...) {
                release();  // no destructor runs for a constructor that throws
                throw;
            }
        }
    }
    // A count the user chose is kept; fastpar's own default adapts to a shared machine.
    governor_ = std::make_unique<ThreadGovernor>(n_threads_, params_.n_threads == 0);
    llama_set_abort_callback(
        ctx_, [](void * data) { return static_cast<std::atomic<bool> *>(data)->load(); }, &abort_);
    // An embeddings context's decodes output every token, which the warm-up's do not.
    if (!params_.embeddings && (params_.warmup == 1 || (params_.warmup == -1 && model_->on_gpu()))) {
        try {
            warm_up();
        } catch (...) {
            release();  // no destructor runs for a constructor that throws
            throw;
        }
    }
}

void Context::warm_up() {
    // The shapes of a call: one batch of prompt tokens from every slot (as many as one
    // physical batch holds, one output a slot), then one token a slot with every row out,
    // twice (llama.cpp's CUDA backend captures a graph the second time it sees it). Every
    // slot's positions are removed afterwards; only the device's state stays.
    const int32_t n = params_.n_parallel;
    const int32_t n_prompt = std::min(std::max(1, static_cast<int32_t>(llama_n_ubatch(ctx_)) / n), n_ctx_seq_ - 2);
    if (n_prompt < 1) {
        return;  // a slot holds fewer than three positions: nothing call-shaped fits
    }
    const llama_vocab * vocab = model_->vocab();
    const llama_token token = llama_vocab_bos(vocab) != LLAMA_TOKEN_NULL ? llama_vocab_bos(vocab) : 0;
    auto decode = [&](int32_t n_tokens, llama_pos pos0) {
        batch_.n_tokens = 0;
        for (int32_t seq = 0; seq < n; ++seq) {
            for (int32_t j = 0; j < n_tokens; ++j) {
                batch_add(batch_, token, pos0 + j, seq, j == n_tokens - 1);
            }
        }
        if (device_) {
            device_->expect(batch_, true);
        }
        clear_last_llama_error();
        const int32_t rc = llama_decode(ctx_, batch_);
        if (rc != 0) {
            const std::string why = last_llama_error();
            throw Error("llama.cpp failed the warm-up decode of a new context (n_parallel=" + std::to_string(n) +
                        ", code " + std::to_string(rc) + (why.empty() ? std::string() : ": " + why) +
                        "); warmup=False skips it");
        }
    };
    decode(n_prompt, 0);
    decode(1, n_prompt);
    decode(1, n_prompt + 1);
    llama_synchronize(ctx_);
    llama_memory_t mem = llama_get_memory(ctx_);
    for (int32_t seq = 0; seq < n; ++seq) {
        llama_memory_seq_rm(mem, seq, -1, -1);
    }
    batch_.n_tokens = 0;
    warmed_up_ = true;
}

bool Context::device_sampling() const {
    if (params_.embeddings) {
        return false;  // an embeddings context samples nothing
    }
    const bool wanted = params_.device_sampling == 1 ||
                        (params_.device_sampling == -1 && model_->output_on_gpu() &&
                         params_.n_parallel >= kAutoDeviceSamplingSlots);
    return wanted && DeviceSampling::block_for(model_->n_vocab()) > 0;
}

Context::~Context() { release(); }

void Context::release() {
    if (cache_ && ctx_ != nullptr) {
        try {
            cache_->persist(ctx_);  // a no-op without a folder
        } catch (...) {
            // Freeing must not fail: a cache that could not be written is only lost.
        }
    }
    llama_batch_free(batch_);
    batch_ = llama_batch{};
    if (ctx_ != nullptr) {
        if (device_) {
            device_->detach_all(ctx_);
        }
        llama_free(ctx_);  // before device_, whose chains it may still point to
        ctx_ = nullptr;
    }
}

void Context::with_scheduler(Stats & stats, const std::function<void(Scheduler &)> & body) {
    with_scheduler(stats, policy_, body);
}

void Context::with_scheduler(Stats & stats, const StepPolicy & policy, const std::function<void(Scheduler &)> & body) {
    std::lock_guard<std::mutex> lock(mutex_);
    SchedulerOptions options;
    options.n_parallel = params_.n_parallel;
    options.n_batch = steps_n_batch();
    options.n_ctx_seq = n_ctx_seq_;
    options.policy = policy;
    options.pool = pool_.get();
    options.device = device_.get();
    options.threads = governor_.get();
    if (!grammars_) {
        grammars_ = std::make_unique<GrammarCache>(model_->vocab(), policy_.mask_workers);
    }
    options.grammars = grammars_.get();
    options.cache = cache_.get();
    options.embeddings = params_.embeddings;
    options.embedding_size = embedding_size();
    options.embed_step_tokens = model_->on_gpu() ? kGpuEmbedStep : kCpuEmbedStep;
    Scheduler scheduler(*model_, ctx_, batch_, options, stats);
    try {
        body(scheduler);
    } catch (...) {
        scheduler.cancel_all();  // the context keeps nothing of this call
        abort_.store(false);
        throw;
    }
    scheduler.cancel_all();
    abort_.store(false);
}

std::vector<Completion> Context::generate(const std::vector<Prompt> & prompts, const GenerateParams & params,
                                          const std::function<bool()> & interrupt,
                                          const std::function<void(size_t, const Completion &)> & on_completion) {
    return generate(prompts, std::vector<GenerateParams>{params}, interrupt, on_completion);
}

std::vector<Completion> Context::generate(const std::vector<Prompt> & prompts,
                                          const std::vector<GenerateParams> & params,
                                          const std::function<bool()> & interrupt,
                                          const std::function<void(size_t, const Completion &)> & on_completion) {
    if (params_.embeddings) {
        throw InvalidArgument("this context was made for embeddings (embeddings=True): make one without it to "
                              "generate");
    }
    if (params.size() != 1 && params.size() != prompts.size()) {
        throw InvalidArgument("params must hold one entry for every prompt (" + std::to_string(prompts.size()) +
                              ") or one for all, got " + std::to_string(params.size()));
    }
    std::vector<AdmittedParams> admitted;
    for (const auto & p : params) {
        admitted.push_back(admit_params(p));
    }
    for (const auto & p : prompts) {
        check_prompt(*model_, p);
    }
    const auto entry = [&](size_t i) { return params.size() == 1 ? 0 : i; };
    Rendered rendered = apply_tools(*model_, prompts, admitted);  // before any work
    const auto t0 = Clock::now();
    Stats stats;
    stats.n_prompts = static_cast<int64_t>(prompts.size());
    std::vector<size_t> first_result(prompts.size());  // each prompt's first index into results
    size_t n_results = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        first_result[i] = n_results;
        n_results += static_cast<size_t>(params[entry(i)].n);
    }
    std::vector<Completion> results(n_results);
    // Prompts go in in order of max_tokens, largest first (StepPolicy::longest_first); results
    // stay in input order.
    std::vector<size_t> order(prompts.size());
    std::iota(order.begin(), order.end(), size_t{0});
    if (params.size() > 1 && policy_.longest_first) {
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return params[a].max_tokens > params[b].max_tokens; });
    }

    auto finish_stats = [&] {
        stats.t_wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(stats_mutex_);
        last_stats_ = stats;
#ifdef FASTPAR_DEBUG
        print_stats(stats);
#endif
    };
    try {
        with_scheduler(stats, policy_, [&](Scheduler & scheduler) {
            for (const size_t i : order) {
                size_t k = first_result[i];  // index into results
                const bool own = !rendered.prompts.empty();
                for (Request & request : fan_out(own ? std::move(rendered.prompts[i]) : prompts[i],
                                                 own ? rendered.params[i] : admitted[entry(i)],
                                                 static_cast<uint64_t>(i) + 1, t0)) {
                    request.on_done = [&results, &on_completion, k](Completion && c) {
                        results[k] = std::move(c);
                        if (on_completion) {
                            on_completion(k, results[k]);
                        }
                    };
                    scheduler.enqueue(std::move(request));
                    ++k;
                }
            }
            while (!scheduler.idle()) {
                if (interrupt && interrupt()) {
                    throw Interrupted();
                }
                scheduler.step();
            }
        });
    } catch (...) {
        finish_stats();
        throw;
    }
    finish_stats();
    return results;
}

std::vector<Completion> Context::embed(const std::vector<Prompt> & prompts, const EmbedParams & params,
                                       const std::function<bool()> & interrupt,
                                       const std::function<void(size_t, const Completion &)> & on_completion) {
    if (!params_.embeddings) {
        throw InvalidArgument("this context was made for generation: make one with embeddings=True to embed");
    }
    for (const auto & p : prompts) {
        check_prompt(*model_, p);
    }
    const auto t0 = Clock::now();
    Stats stats;
    stats.n_prompts = static_cast<int64_t>(prompts.size());
    std::vector<Completion> results(prompts.size());
    const auto shared = std::make_shared<const GenerateParams>();
    auto finish_stats = [&] {
        stats.t_wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(stats_mutex_);
        last_stats_ = stats;
    };
    try {
        with_scheduler(stats, policy_, [&](Scheduler & scheduler) {
            for (size_t i = 0; i < prompts.size(); ++i) {
                Request request;
                request.prompt = prompts[i];
                request.params = shared;
                request.embed = params;
                request.t_submit = t0;
                request.on_done = [&results, &on_completion, i](Completion && c) {
                    results[i] = std::move(c);
                    if (on_completion) {
                        on_completion(i, results[i]);
                    }
                };
                scheduler.enqueue(std::move(request));
            }
            while (!scheduler.idle()) {
                if (interrupt && interrupt()) {
                    throw Interrupted();
                }
                scheduler.step();
            }
        });
    } catch (...) {
        finish_stats();
        throw;
    }
    finish_stats();
    return results;
}

int32_t Context::embedding_size() const {
    // A reranker's (rank pooling) vector is its classification head's outputs, the score first.
    return pooling_ == "rank" ? static_cast<int32_t>(llama_model_n_cls_out(model_->get()))
                              : llama_model_n_embd_out(model_->get());
}

Stats Context::last_stats() const {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    return last_stats_;
}

PrefixCacheStats Context::prefix_cache_stats() const { return cache_ ? cache_->stats() : PrefixCacheStats(); }

void Context::clear_prefix_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    clear_prefix_cache_unlocked();
}

void Context::save_prefix_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cache_) {
        cache_->persist(ctx_);
    }
}

void Context::clear_prefix_cache_unlocked() {
    if (cache_) {
        cache_->clear(ctx_);
    }
}

std::vector<int32_t> Context::seq_pos_max() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return seq_pos_max_unlocked();
}

std::vector<int32_t> Context::seq_pos_max_unlocked() const {
    std::vector<int32_t> out;
    llama_memory_t mem = llama_get_memory(ctx_);
    for (int32_t s = 0; s < params_.n_parallel; ++s) {
        out.push_back(llama_memory_seq_pos_max(mem, s));
    }
    return out;
}

}  // namespace fastpar
