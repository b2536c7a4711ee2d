// For tests (fastpar._testing, never fastpar._core): makes an Engine's worker fail the way
// a throwing step does, so that tests can check what every request and later submit see;
// makes an Engine whose worker runs with another step policy.
#include <string>

#include "core/loop/engine.hpp"
#include "core/base/errors.hpp"
#include "testing/probes.hpp"

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace fastpar::python {

void register_testing_engine(py::module_ & m) {
    m.def(
        "fail_engine_worker",
        [](Engine & engine, const std::string & message) {
            engine.post([message] { throw Error(message); });
        },
        py::arg("engine"), py::arg("message"), py::call_guard<py::gil_scoped_release>(),
        "For tests: the engine's worker throws Error(message) between two steps, as a failing "
        "step would (Engine::post).");
    m.def(
        "engine_with_policy",
        [](std::shared_ptr<const Model> model, const ContextParams & params, int32_t max_queued,
           const StepPolicy & policy) {
            py::gil_scoped_release nogil;
            // Destroyed without the GIL, as fastpar._core's engines are (bind_engine.cpp).
            return std::shared_ptr<Engine>(
                ContextTesting::engine_with_policy(std::move(model), params, max_queued, policy).release(),
                [](Engine * e) {
                    py::gil_scoped_release release;
                    delete e;
                });
        },
        py::arg("model"), py::arg("params"), py::arg("max_queued"), py::arg("policy"),
        "A fastpar._core.Engine whose worker runs with `policy` as it is (a GPU's rules on a CPU).");
}

}  // namespace fastpar::python
