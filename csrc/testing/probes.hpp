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
// A Context's part the tests set (context_probes.cpp; Context's friend)
// ---------------------------------------------------------------------------
struct ContextTesting {
    // Context::generate of text prompts with another step policy than the context's (a
    // GPU's rules on a CPU); its pool options stay the context's. Not for a context that
    // other threads use meanwhile: they would see that policy too.
    static std::vector<Completion> generate_with_policy(Context & ctx, const std::vector<std::string> & texts,
                                                        const std::vector<GenerateParams> & params,
                                                        const StepPolicy & policy);

private:
    // The context's grammar cache, made as Context::with_scheduler makes it (with the
    // context's own mask workers) when no call has made it yet. Under the context's lock.
    static GrammarCache & grammars(Context & ctx);
};

}  // namespace fastpar
