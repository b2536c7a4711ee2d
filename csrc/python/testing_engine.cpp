// For tests (fastpar._testing, never fastpar._core): makes an Engine's worker fail the way
// a throwing step does, so that tests can check what every request and later submit see.
#include <string>

#include "core/loop/engine.hpp"
#include "core/base/errors.hpp"

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
}

}  // namespace fastpar::python
