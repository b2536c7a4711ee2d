// repr() and to_dict() for the plain result records (Completion, Stats, EngineStats), made
// from their attribute names so that both always list the same, current fields.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/typing.h>

#include <string>
#include <vector>

namespace fastpar::python {

// A text longer than this shows its beginning and "..." in a repr.
constexpr size_t kReprText = 60;

// {name: value} of every field: only str, int, float, bool, None, and lists of these or of
// tuples of these, so that json.dumps takes it as it is.
inline pybind11::typing::Dict<pybind11::str, pybind11::object> record_dict(pybind11::handle self,
                                                                          const std::vector<const char *> & fields) {
    pybind11::typing::Dict<pybind11::str, pybind11::object> d;
    for (const char * f : fields) {
        pybind11::object v = self.attr(f);
        if (pybind11::isinstance<pybind11::list>(v) && pybind11::len(v) > 0 &&
            pybind11::hasattr(v.attr("__getitem__")(0), "to_dict")) {  // records in a list (tool calls)
            pybind11::list plain;
            for (pybind11::handle item : v) {
                plain.append(item.attr("to_dict")());
            }
            v = plain;
        }
        d[f] = v;
    }
    return d;
}

// Type(field=value, ...) with floats rounded to 3 decimals and long text cut.
inline std::string record_repr(pybind11::handle self, const char * type, const std::vector<const char *> & fields) {
    namespace py = pybind11;
    std::string out = std::string(type) + "(";
    for (size_t i = 0; i < fields.size(); ++i) {
        py::object v = self.attr(fields[i]);
        if (py::isinstance<py::float_>(v)) {
            v = py::module_::import("builtins").attr("round")(v, 3);
        } else if (py::isinstance<py::str>(v) && py::len(v) > kReprText) {
            v = py::str(v.attr("__getitem__")(py::slice(0, kReprText, 1)).attr("__add__")("..."));
        }
        out += (i ? ", " : "") + std::string(fields[i]) + "=" + py::repr(v).cast<std::string>();
    }
    return out + ")";
}

template <typename T>
void def_record(pybind11::class_<T> & cls, const char * type, std::vector<const char *> repr_fields,
                std::vector<const char *> dict_fields) {
    cls.def("__repr__", [type, repr_fields](pybind11::handle self) { return record_repr(self, type, repr_fields); });
    cls.def("to_dict", [dict_fields](pybind11::handle self) { return record_dict(self, dict_fields); },
            "Every field as a dict of plain values (json.dumps takes it as it is).");
}

}  // namespace fastpar::python
