// pybind11 bindings of fastpar's core: conversion only, one register_<topic>() per file.
#pragma once

#include <pybind11/pybind11.h>

namespace fastpar::python {

void register_errors(pybind11::module_ & m);
void register_model(pybind11::module_ & m);
void register_generate(pybind11::module_ & m);

}  // namespace fastpar::python
