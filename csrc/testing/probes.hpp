// The test and benchmark probes of fastpar._testing: compiled into that module only
// (CMake option FASTPAR_TESTING), never into libfastpar, which keeps llama.cpp's symbols
// private. So a probe calls the core's own functions (exported from libfastpar as
// fastpar:: symbols), never llama.cpp's: one copy of llama.cpp's state in the process.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/base/params.hpp"
#include "core/loop/context.hpp"
#include "core/loop/engine.hpp"
#include "core/loop/step_policy.hpp"
#include "core/model/model.hpp"
#include "core/sampling/token_chooser.hpp"
#include "llama.h"

namespace fastpar {

// ---------------------------------------------------------------------------
// Sampling (sampling_probes.cpp)
// ---------------------------------------------------------------------------

// `draws` tokens sample_logits picks with the chain `params` builds, from the whole row
// `logits` or, when `blocks` is not empty, from those blocks of `width` logits (as device
// sampling hands them over), next to the tokens llama.cpp's own chain picks applying every
// sampler to the whole row (apply_chain); both chains start from `seed`. With
// `split_rows` > 0 (a whole row that splits()), each draw chooses from that many copies of
// the row at once through choose_split on a pool of `pool_workers` workers with the
// options of a GPU's output, each copy with its own chain from `seed`: every copy's token
// is returned, one draw after another.
std::pair<std::vector<llama_token>, std::vector<llama_token>> sample_against_llama(
    const GenerateParams & params, uint32_t seed, const std::vector<float> & logits,
    const std::vector<llama_token> & blocks, int32_t width, int32_t draws, int32_t split_rows = 0,
    int32_t pool_workers = 0);

// TokenChooser's way by name: "one_thread", "pooled" or "split".
const char * way_name(TokenChooser::Way way);

// ---------------------------------------------------------------------------
// Structured output (grammar_probes.cpp)
// ---------------------------------------------------------------------------

// For the benchmark (bench/bench_structured.py): what the constraint of `params` costs with
// `model`'s vocabulary, walking the token sequence `tokens` (which it must allow).
// Milliseconds: the conversion to GBNF (uncached), one compile, one copy of the compiled
// grammar, and per token on average: masking the whole vocabulary with the grammar, and
// checking one token.
struct GrammarCosts {
    double convert_ms = 0, compile_ms = 0, clone_ms = 0, mask_ms = 0, check_ms = 0;
    int32_t n_allowed_first = 0;  // tokens the grammar allows at the start
    double tree_ms = 0;        // building the vocabulary's TokenTree (once per GrammarCache)
    double mask_tree_ms = 0;   // per token: a whole mask as AllowedSets computes it
};
GrammarCosts measure_grammar(const Model & model, const GenerateParams & params, const std::vector<llama_token> & tokens);

// For the tests: walks `steps` tokens of `params`' constraint, each drawn at random (with
// `seed`) among those the grammar allows, and at every state compares the whole mask
// AllowedSets computes (TokenTree, on `workers` threads besides the caller) with
// llama.cpp's mask of the whole vocabulary.
struct MaskComparison {
    int32_t n_states = 0;    // states walked
    int32_t n_compared = 0;  // of them, states TokenTree serves
    int32_t n_differ = 0;    // of those, states where the two masks differ
    int32_t n_partial = 0;   // of them, states with a partly decoded character
};
MaskComparison compare_masks(const Model & model, const GenerateParams & params, int32_t steps, uint32_t seed,
                             int32_t workers = 0);

// ---------------------------------------------------------------------------
// A Context's parts the tests set (context_probes.cpp; Context's friend)
// ---------------------------------------------------------------------------
struct ContextTesting {
    // Context::generate of text prompts with another step policy than the context's (a
    // GPU's rules on a CPU); its pool options stay the context's. Not for a context that
    // other threads use meanwhile: they would see that policy too.
    static std::vector<Completion> generate_with_policy(Context & ctx, const std::vector<std::string> & texts,
                                                        const std::vector<GenerateParams> & params,
                                                        const StepPolicy & policy);
    // An Engine over a new context whose worker runs with `policy` as it is (not the
    // Engine's streaming_step_policy of it): a GPU's rules on a CPU, or another wave rule.
    static std::unique_ptr<Engine> engine_with_policy(std::shared_ptr<const Model> model, const ContextParams & params,
                                                      int32_t max_queued, const StepPolicy & policy);
    // Whether the context's constrained rows share allowed-token sets (GrammarCache's
    // option; on by default). Off: each refusal masks with the row's grammar alone.
    static void set_allowed_sets(Context & ctx, bool on);
    static bool allowed_sets(Context & ctx);
    // Whether ctx's prefix cache saves selectively, as it does with its KV cache in GPU
    // memory (prefix_cache.hpp); std::invalid_argument when the context has no cache.
    static void set_cache_selective(Context & ctx, bool on);

private:
    // The context's grammar cache, made as Context::with_scheduler makes it (with the
    // context's own mask workers) when no call has made it yet. Under the context's lock.
    static GrammarCache & grammars(Context & ctx);
};

}  // namespace fastpar
