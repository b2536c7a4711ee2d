#include <optional>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "core/loop/engine.hpp"
#include "python/module.hpp"
#include "python/records.hpp"

namespace py = pybind11;

namespace fastpar::python {
namespace {

double timeout_arg(const std::optional<double> & timeout) { return timeout ? std::max(0.0, *timeout) : -1.0; }

}  // namespace

void register_engine(py::module_ & m) {
    auto engine_stats = py::class_<EngineStats>(m, "EngineStats", "A snapshot of an Engine's counters.")
        .def_readonly("n_active", &EngineStats::n_active)
        .def_readonly("n_queued", &EngineStats::n_queued)
        .def_readonly("n_submitted", &EngineStats::n_submitted)
        .def_readonly("n_completed", &EngineStats::n_completed)
        .def_readonly("n_failed", &EngineStats::n_failed)
        .def_readonly("n_cancelled", &EngineStats::n_cancelled)
        .def_readonly("n_prompt_tokens", &EngineStats::n_prompt_tokens)
        .def_readonly("n_prompt_tokens_shared", &EngineStats::n_prompt_tokens_shared)
        .def_readonly("n_prompt_tokens_cached", &EngineStats::n_prompt_tokens_cached)
        .def_readonly("n_gen_tokens", &EngineStats::n_gen_tokens)
        .def_readonly("n_decode_calls", &EngineStats::n_decode_calls)
        .def_readonly("n_padding_tokens", &EngineStats::n_padding_tokens)
        .def_readonly("n_preempted", &EngineStats::n_preempted)
        .def_readonly("uptime_s", &EngineStats::uptime_s)
        .def_readonly("busy_s", &EngineStats::busy_s)
        .def_property_readonly("gen_tokens_per_s", &EngineStats::gen_tokens_per_s);
    const std::vector<const char *> engine_stats_fields = {
        "n_active", "n_queued", "n_submitted", "n_completed", "n_failed", "n_cancelled", "n_prompt_tokens",
        "n_prompt_tokens_shared", "n_prompt_tokens_cached", "n_gen_tokens", "n_decode_calls", "n_padding_tokens",
        "n_preempted", "uptime_s", "busy_s",
        "gen_tokens_per_s"};
    def_record(engine_stats, "EngineStats", engine_stats_fields, engine_stats_fields);

    py::class_<WakePipe, std::shared_ptr<WakePipe>>(m, "WakePipe",
                                                  "A pipe the engine's thread writes to when watched requests have news.")
        .def(py::init<>())
        .def("fileno", &WakePipe::fileno)
        .def("drain", &WakePipe::drain, py::call_guard<py::gil_scoped_release>());

    py::class_<RequestHandle, std::shared_ptr<RequestHandle>>(m, "RequestHandle",
                                                            "One request of an Engine: a prompt and its samples.")
        .def_property_readonly("id", &RequestHandle::id)
        .def_property_readonly("n_samples", &RequestHandle::n_samples)
        .def("cancel", &RequestHandle::cancel)
        .def("done", [](const RequestHandle & h) { return h.done(); }, py::call_guard<py::gil_scoped_release>())
        .def("sample_done", [](const RequestHandle & h, int32_t sample) { return h.done(sample); },
             py::arg("sample"), py::call_guard<py::gil_scoped_release>())
        .def("result", [](const RequestHandle & h, std::optional<double> timeout) {
                 py::gil_scoped_release nogil;
                 return h.result(timeout_arg(timeout));
             }, py::arg("timeout") = py::none())
        .def("sample_result", [](const RequestHandle & h, int32_t sample, std::optional<double> timeout) {
                 py::gil_scoped_release nogil;
                 return h.result(sample, timeout_arg(timeout));
             }, py::arg("sample"), py::arg("timeout") = py::none())
        .def("next_piece", [](RequestHandle & h, std::optional<double> timeout) {
                 py::gil_scoped_release nogil;
                 return h.next_piece(timeout_arg(timeout));
             }, py::arg("timeout") = py::none())
        .def("take_pieces", &RequestHandle::take_pieces, py::call_guard<py::gil_scoped_release>())
        // pybind11's wrapper takes the GIL whenever the engine's thread calls the listener.
        .def("set_listener", &RequestHandle::set_listener, py::arg("listener"))
        // No GIL on the engine's thread: it only writes to the pipe.
        .def("set_wake", &RequestHandle::set_wake, py::arg("pipe"), py::arg("token"),
             py::call_guard<py::gil_scoped_release>());

    py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine", "The scheduler loop on a worker thread.")
        .def(py::init([](std::shared_ptr<const Model> model, const ContextParams & params, int32_t max_queued) {
                 py::gil_scoped_release nogil;
                 // Destroyed without the GIL: joining the worker may wait on a listener
                 // that needs it.
                 return std::shared_ptr<Engine>(new Engine(std::move(model), params, max_queued), [](Engine * e) {
                     py::gil_scoped_release release;
                     delete e;
                 });
             }),
             py::arg("model"), py::arg("params"), py::arg("max_queued"))
        // Everything that takes the engine's or a request's lock lets the GIL go first: the
        // engine's thread may need the GIL (a listener) while it holds one of those locks.
        // timeout: 0 = refuse at once when there is no room, None = wait for ever.
        .def("submit", [](Engine & e, const PromptIn & prompt, const GenerateParams & params,
                          std::optional<double> timeout) {
                 Prompt p = to_prompt(prompt);
                 py::gil_scoped_release nogil;
                 return e.submit(std::move(p), params, timeout_arg(timeout));
             }, py::arg("prompt"), py::arg("params"), py::arg("timeout") = 0.0)
        .def("submit_embedding", [](Engine & e, const PromptIn & prompt, bool normalize, std::optional<double> timeout) {
                 Prompt p = to_prompt(prompt);
                 EmbedParams params;
                 params.normalize = normalize;
                 py::gil_scoped_release nogil;
                 return e.submit_embedding(std::move(p), params, timeout_arg(timeout));
             }, py::arg("prompt"), py::arg("normalize"), py::arg("timeout") = 0.0)
        .def_property_readonly("embeddings", [](const Engine & e) { return e.context().params().embeddings; })
        .def_property_readonly("pooling", [](const Engine & e) { return e.context().pooling(); })
        .def_property_readonly("embedding_size", [](const Engine & e) { return e.context().embedding_size(); })
        .def("close", &Engine::close, py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("closed", [](const Engine & e) {
                 py::gil_scoped_release nogil;
                 return e.closed();
             })
        .def("stats", &Engine::stats, py::call_guard<py::gil_scoped_release>())
        .def("seq_pos_max", &Engine::seq_pos_max, py::call_guard<py::gil_scoped_release>())
        .def("clear_prefix_cache", &Engine::clear_prefix_cache, py::call_guard<py::gil_scoped_release>())
        .def("prefix_cache_stats", [](const Engine & e) { return e.context().prefix_cache_stats(); })
        .def_property_readonly("n_parallel", [](const Engine & e) { return e.context().params().n_parallel; })
        .def_property_readonly("n_ctx_per_seq", [](const Engine & e) { return e.context().n_ctx_per_seq(); });
}

}  // namespace fastpar::python
