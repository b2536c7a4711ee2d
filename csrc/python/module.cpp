#include "python/module.hpp"

#include "core/model/model.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
    m.doc() = "fastpar's native core: many prompts through one llama.cpp model in one batch.";
    fastpar::python::register_errors(m);
    fastpar::python::register_model(m);
    fastpar::python::register_generate(m);
    fastpar::python::register_engine(m);
    m.def("version", &fastpar::version, "Version of the native library.");
    m.def("backend", &fastpar::backend_name, "Backend the native library was built for: 'cpu', 'cuda' or 'metal'.");
}
