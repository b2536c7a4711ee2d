// fastpar._testing: hooks that tests need and the shipped module fastpar._core must not carry.
#include <pybind11/pybind11.h>

namespace fastpar::python {
void register_testing_engine(pybind11::module_ & m);
}  // namespace fastpar::python

PYBIND11_MODULE(_testing, m) {
    m.doc() = "Hooks for fastpar's tests; not part of the API.";
    fastpar::python::register_testing_engine(m);
}
