// fastpar._testing: what the tests and the benchmark harness reach inside the core, kept
// out of the shipped module fastpar._core and out of libfastpar (CMake option
// FASTPAR_TESTING). The step planner, prefix sharing, the text stream and token choosing
// are exposed alone, so that their rules (the GPU-only ones too) are tested without a
// model; the probes that only tests use are in csrc/testing/.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/loop/context.hpp"
#include "core/threads/cpus.hpp"
#include "core/threads/thread_governor.hpp"
#include "core/base/errors.hpp"
#include "core/base/params.hpp"
#include "core/threads/pool.hpp"
#include "core/loop/prefix_sharing.hpp"
#include "core/sampling/sampling.hpp"
#include "core/loop/step_plan.hpp"
#include "core/loop/step_policy.hpp"
#include "core/sampling/device_sampling.hpp"
#include "core/model/model.hpp"
#include "core/structured/structured.hpp"
#include "core/loop/text_stream.hpp"
#include "core/sampling/token_chooser.hpp"
#include "testing/probes.hpp"

namespace py = pybind11;

namespace fastpar::python {
namespace {

void register_step_plan(py::module_ & m) {
    py::class_<StepPolicy>(m, "StepPolicy", "The step's CPU/GPU choices (core/loop/step_policy.hpp).")
        .def(py::init<>())
        .def_readwrite("max_padded_gap", &StepPolicy::max_padded_gap)
        .def_readwrite("compact_slots", &StepPolicy::compact_slots)
        .def_readwrite("refill_wave", &StepPolicy::refill_wave)
        .def_readwrite("max_wave_hold", &StepPolicy::max_wave_hold)
        .def_readwrite("prompts_first", &StepPolicy::prompts_first)
        .def_readwrite("last_prompt_token_alone", &StepPolicy::last_prompt_token_alone)
        .def_readwrite("equal_chunks", &StepPolicy::equal_chunks)
        .def_readwrite("max_decode_waits", &StepPolicy::max_decode_waits)
        .def_readwrite("split_rows", &StepPolicy::split_rows)
        .def_readwrite("mask_workers", &StepPolicy::mask_workers)
        .def_readwrite("share_prefixes", &StepPolicy::share_prefixes)
        .def_readwrite("longest_first", &StepPolicy::longest_first)
        .def_property_readonly("pool_anticipate_us", [](const StepPolicy & p) { return p.pool.anticipate_us; })
        .def_property_readonly("pool_caller_spin_us", [](const StepPolicy & p) { return p.pool.caller_spin_us; });
    m.def("resolve_step_policy", &resolve_step_policy, py::arg("output_on_gpu"), py::arg("kv_unified"),
          py::arg("memory_copies_by_position"), py::arg("share_prefixes"), py::arg("n_parallel"),
          py::arg("n_threads"));
    m.def("streaming_step_policy", &streaming_step_policy, py::arg("policy"),
          "An Engine's step policy over its context's (core/loop/step_policy.hpp).");
    m.attr("MAX_PADDED_GAP_GPU") = kMaxPaddedGapGpu;
    m.attr("STREAMING_DECODE_WAITS") = kStreamingDecodeWaits;
    m.attr("CHUNK_PADDING_PER_PASS") = kChunkPaddingPerPass;
    m.attr("UNLIMITED_DECODE_WAITS") = kUnlimitedDecodeWaits;
    m.attr("REFILL_WAVE_DIVISOR") = kRefillWaveDivisor;
    m.attr("STREAMING_WAVE_HOLD") = kStreamingWaveHold;
    m.attr("UNLIMITED_WAVE_HOLD") = kUnlimitedWaveHold;

    py::class_<PlanInput>(m, "PlanInput", "One slot as the step planner sees it.")
        .def(py::init([](bool active, bool prefilling, bool waiting, size_t left, int32_t priority, uint64_t order,
                         size_t room) {
                 PlanInput s;
                 s.active = active;
                 s.prefilling = prefilling;
                 s.waiting = waiting;
                 s.left = left;
                 s.priority = priority;
                 s.order = order;
                 s.room = room;
                 return s;
             }),
             py::arg("active") = false, py::arg("prefilling") = false, py::arg("waiting") = false,
             py::arg("left") = 0, py::arg("priority") = 0, py::arg("order") = 0, py::arg("room") = SIZE_MAX)
        .def_readwrite("active", &PlanInput::active)
        .def_readwrite("prefilling", &PlanInput::prefilling)
        .def_readwrite("waiting", &PlanInput::waiting)
        .def_readwrite("left", &PlanInput::left)
        .def_readwrite("priority", &PlanInput::priority)
        .def_readwrite("order", &PlanInput::order)
        .def_readwrite("room", &PlanInput::room);
    m.def(
        "plan_step",
        [](const std::vector<PlanInput> & slots, const StepPolicy & policy, int32_t n_batch, int32_t decode_waits) {
            StepPlan plan;
            plan_step(slots, policy, n_batch, decode_waits, plan);
            py::dict out;
            std::vector<int32_t> n_plan;
            std::vector<bool> pad;
            std::vector<int32_t> n_pad_tokens;
            for (const SlotPlan & p : plan.slots) {
                n_plan.push_back(p.n_plan);
                pad.push_back(p.pad);
                n_pad_tokens.push_back(p.n_pad_tokens);
            }
            out["n_plan"] = n_plan;
            out["pad"] = pad;
            out["n_pad_tokens"] = n_pad_tokens;
            out["decode_waits"] = plan.decode_waits;
            out["prompts_first"] = plan.prompts_first;
            out["n_tokens"] = plan.n_tokens;
            return out;
        },
        py::arg("slots"), py::arg("policy"), py::arg("n_batch"), py::arg("decode_waits") = 0,
        "core/loop/step_plan.hpp's plan_step: a dict of n_plan, pad and n_pad_tokens per slot, decode_waits, "
        "prompts_first, n_tokens.");
    m.def(
        "generate_with_policy",
        [](Context & ctx, const std::vector<std::string> & texts, const std::vector<GenerateParams> & params,
           const StepPolicy & policy) {
            py::gil_scoped_release nogil;
            return ContextTesting::generate_with_policy(ctx, texts, params, policy);
        },
        py::arg("ctx"), py::arg("prompts"), py::arg("params"), py::arg("policy"),
        "Context.generate of text prompts with another step policy than the context's (a GPU's rules on a CPU).");
}

void register_prefix_sharing(py::module_ & m) {
    py::class_<SharingView>(m, "SharingView", "One slot as prefix sharing sees it.")
        .def(py::init([](bool active, size_t n_fed, size_t prompt_size) {
                 SharingView s;
                 s.active = active;
                 s.n_fed = n_fed;
                 s.prompt_size = prompt_size;
                 return s;
             }),
             py::arg("active") = false, py::arg("n_fed") = 0, py::arg("prompt_size") = 0)
        .def_readwrite("active", &SharingView::active)
        .def_readwrite("n_fed", &SharingView::n_fed)
        .def_readwrite("prompt_size", &SharingView::prompt_size)
        .def_readonly("waiting", &SharingView::waiting)
        .def_readonly("copied", &SharingView::copied)
        .def_readonly("donor", &SharingView::donor);
    py::class_<PrefixSharing>(m, "PrefixSharing", "core/loop/prefix_sharing.hpp's decisions, without a KV cache.")
        .def(py::init<size_t, size_t>(), py::arg("n_slots"), py::arg("min_shared") = static_cast<size_t>(kMinSharedPrefix))
        .def("pair_up", &PrefixSharing::pair_up, py::arg("a"), py::arg("prompt_a"), py::arg("b"), py::arg("prompt_b"),
             py::arg("samples") = false)
        .def("common", &PrefixSharing::common, py::arg("a"), py::arg("b"))
        .def(
            "decide",
            [](const PrefixSharing & sharing, std::vector<SharingView> slots) {
                sharing.decide(slots);
                return slots;
            },
            py::arg("slots"), "The slots with waiting, copied, donor and n_fed decided for one step.");
    m.attr("MIN_SHARED_PREFIX") = kMinSharedPrefix;
}

void register_text_stream(py::module_ & m) {
    py::class_<TextStream>(m, "TextStream", "core/loop/text_stream.hpp: a generation's text, stop strings, pieces.")
        .def(py::init([](bool streaming) {
                 TextStream t;
                 t.reset(streaming);
                 return t;
             }),
             py::arg("streaming") = true)
        .def("append", [](TextStream & t, const py::bytes & piece,
                          const std::vector<std::string> & stops) { return t.append(std::string(piece), stops); },
             py::arg("piece"), py::arg("stops") = std::vector<std::string>())
        .def("next_piece", &TextStream::next_piece, py::arg("stops") = std::vector<std::string>(),
             py::arg("final") = false)
        .def("take_text", &TextStream::take_text)
        .def_property_readonly("bytes", [](const TextStream & t) { return py::bytes(t.bytes()); });
}

void register_token_chooser(py::module_ & m) {
    m.def(
        "choose_way",
        [](size_t n_rows, int64_t work, bool have_pool, bool split_rows, bool rows_split) {
            return std::string(way_name(TokenChooser::decide(n_rows, work, have_pool, split_rows, rows_split)));
        },
        py::arg("n_rows"), py::arg("work"), py::arg("have_pool"), py::arg("split_rows"), py::arg("rows_split"),
        "core/sampling/token_chooser.hpp's decision: 'one_thread', 'pooled' or 'split'.");
    m.def(
        "choose_work",
        [](const GenerateParams & params, int32_t n_logits) {
            LogitRow row;
            row.n = n_logits;
            return TokenChooser::work(ChainShape::of(params), row);
        },
        py::arg("params"), py::arg("n_logits"), "Work units of choosing from a row of n_logits with these params.");
    m.def(
        "rows_split",
        [](const GenerateParams & params, int32_t n_logits, bool device_blocks) {
            static const float logit = 0.0f;
            static const llama_token block = 0;
            LogitRow row;
            row.logits = &logit;
            row.n = n_logits;
            if (device_blocks) {
                row.blocks = &block;
                row.width = n_logits;
            }
            return splits(ChainShape::of(params), row);
        },
        py::arg("params"), py::arg("n_logits"), py::arg("device_blocks") = false,
        "core/sampling/sampling.hpp's splits(): whether a row of n_logits may be split over threads.");
    m.attr("MIN_POOLED") = kMinPooled;
    m.attr("MIN_POOLED_WORK") = kMinPooledWork;
    m.attr("MIN_SPLIT") = kMinSplit;
}

// `runs` runs of 0 to 39 items on a TaskPool of `n_workers` with those options,
// every seventh with one item that throws (with anticipate_us, 0 to 2 anticipate_us
// apart). Returns how many runs broke run()'s contract: an item run other than once, an
// exception lost, or one thrown where none was.
int64_t stress_task_pool(int32_t n_workers, int32_t runs, int32_t caller_spin_us, int32_t anticipate_us) {
    TaskPool::Options options;
    options.caller_spin_us = caller_spin_us;
    options.anticipate_us = anticipate_us;
    TaskPool pool(n_workers, options);
    uint32_t state = 12345u + static_cast<uint32_t>(n_workers);
    const auto next = [&state] {  // a small LCG: the same runs everywhere
        state = state * 1664525u + 1013904223u;
        return state >> 8;
    };
    int64_t broken = 0;
    for (int32_t r = 0; r < runs; ++r) {
        const size_t n = next() % 40;
        std::vector<std::atomic<int>> hits(n);
        const int64_t throw_at = (r % 7 == 0 && n > 0) ? static_cast<int64_t>(next() % n) : -1;
        if (anticipate_us > 0) {  // an uneven pace: runs before, during and after the polling
            std::this_thread::sleep_for(std::chrono::microseconds(anticipate_us * static_cast<int32_t>(next() % 3)));
        }
        bool thrown = false;
        try {
            pool.run(n, [&](size_t i) {
                hits[i].fetch_add(1);
                if (static_cast<int64_t>(i) == throw_at) {
                    throw Error("planned");
                }
            });
        } catch (const Error &) {
            thrown = true;
        }
        bool ok = thrown == (throw_at >= 0);
        for (const auto & h : hits) {
            ok = ok && h.load() == 1;
        }
        broken += ok ? 0 : 1;
    }
    return broken;
}

}  // namespace

void register_testing_engine(py::module_ & m);  // testing_engine.cpp

}  // namespace fastpar::python

PYBIND11_MODULE(_testing, m) {
    using namespace fastpar;
    m.doc() = "fastpar's test and benchmark hooks (not part of the API).";
    // GenerateParams and the other shared types are registered by fastpar._core.
    py::module_::import("fastpar._core");
    fastpar::python::register_step_plan(m);
    fastpar::python::register_prefix_sharing(m);
    fastpar::python::register_text_stream(m);
    fastpar::python::register_token_chooser(m);
    fastpar::python::register_testing_engine(m);
    m.def(
        "sample_against_llama",
        [](const GenerateParams & params, uint32_t seed, const std::vector<float> & logits,
           const std::vector<llama_token> & blocks, int32_t width, int32_t draws, int32_t split_rows,
           int32_t pool_workers) {
            return sample_against_llama(params, seed, logits, blocks, width, draws, split_rows, pool_workers);
        },
        py::arg("params"), py::arg("seed"), py::arg("logits"), py::arg("blocks"), py::arg("width"), py::arg("draws"),
        py::arg("split_rows") = 0, py::arg("pool_workers") = 0,
        "Tokens fastpar's host sampling picks next to those llama.cpp's own chain picks "
        "(testing/probes.hpp, sample_against_llama).");
    m.def(
        "device_serves", [](const GenerateParams & params) { return DeviceSampling::serves(ChainShape::of(params)); },
        py::arg("params"), "Whether device sampling may cut this request's rows down (DeviceSampling::serves).");
    m.def(
        "measure_grammar",
        [](const std::shared_ptr<Model> & model, const GenerateParams & params, const std::vector<llama_token> & tokens) {
            const GrammarCosts c = measure_grammar(*model, params, tokens);
            py::dict d;
            d["convert_ms"] = c.convert_ms;
            d["compile_ms"] = c.compile_ms;
            d["clone_ms"] = c.clone_ms;
            d["mask_ms"] = c.mask_ms;
            d["check_ms"] = c.check_ms;
            d["n_allowed_first"] = c.n_allowed_first;
            d["tree_ms"] = c.tree_ms;
            d["mask_tree_ms"] = c.mask_tree_ms;
            return d;
        },
        py::arg("model"), py::arg("params"), py::arg("tokens"),
        "What a json_schema or grammar constraint costs (testing/probes.hpp, measure_grammar).");
    m.def(
        "compare_masks",
        [](const std::shared_ptr<Model> & model, const GenerateParams & params, int32_t steps, uint32_t seed,
           int32_t workers) {
            MaskComparison c;
            {
                py::gil_scoped_release released;
                c = compare_masks(*model, params, steps, seed, workers);
            }
            py::dict d;
            d["n_states"] = c.n_states;
            d["n_compared"] = c.n_compared;
            d["n_differ"] = c.n_differ;
            d["n_partial"] = c.n_partial;
            return d;
        },
        py::arg("model"), py::arg("params"), py::arg("steps"), py::arg("seed"), py::arg("workers") = 0,
        "Whole masks of the allowed-token sets against llama.cpp's, along a random walk (testing/probes.hpp).");
    m.def("set_allowed_sets", &ContextTesting::set_allowed_sets, py::arg("ctx"), py::arg("on"),
          py::call_guard<py::gil_scoped_release>(),
          "Whether ctx's constrained rows share allowed-token sets by grammar state (its grammar cache's\n"
          "option, on by default; read when a call starts a constrained request). Off: each refusal masks\n"
          "with the row's grammar alone, the oracle the sets are compared with.");
    m.def("set_cache_selective", &ContextTesting::set_cache_selective, py::arg("ctx"), py::arg("on"),
          py::call_guard<py::gil_scoped_release>(),
          "Whether ctx's prefix cache saves sequences to host memory only while saved or unsaved ones are\n"
          "reused, as it does with its KV cache in GPU memory (ValueError without a cache).");
    m.def("allowed_sets", &ContextTesting::allowed_sets, py::arg("ctx"), py::call_guard<py::gil_scoped_release>(),
          "Whether ctx's constrained rows share allowed-token sets.");
    m.def("stress_task_pool", &fastpar::python::stress_task_pool, py::call_guard<py::gil_scoped_release>(), py::arg("n_workers"),
          py::arg("runs"), py::arg("caller_spin_us") = 0, py::arg("anticipate_us") = 0,
          "Runs that broke the sampling pool's contract (testing.cpp, stress_task_pool).");
    m.def("thread_governor_decide", &ThreadGovernor::decide, py::arg("threads"), py::arg("max_threads"),
          py::arg("waited"), py::arg("since_change_s"),
          "ThreadGovernor's rule on one window (core/threads/thread_governor.hpp): the next thread count.");
    m.def("available_cpus", &available_cpus, "CPUs this process may use: n_threads=None's threads (core/threads/cpus.hpp).");
    m.def("cgroup_cpu_quota", &cgroup_cpu_quota, py::arg("root"),
          "The CPU quota (CPUs; 0: none) of the cgroups named under root/proc/self (core/threads/cpus.hpp).");
    m.def("cpus_within", &cpus_within, py::arg("n_affinity"), py::arg("quota"),
          "Threads for an affinity mask of n_affinity CPUs and a quota (core/threads/cpus.hpp).");
    // n_batch=None's physical batch on the CPU and on a GPU, for bench/run.py's raw baseline.
    m.attr("cpu_batch") = kCpuBatch;
    m.attr("gpu_batch") = kGpuBatch;
}
