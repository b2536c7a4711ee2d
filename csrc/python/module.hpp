// pybind11 bindings of fastpar's core: conversion only, one register_<topic>() per file.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "capi/fastpar_fields.h"
#include "core/base/params.hpp"

// The C++ type of each KIND of fastpar_fields.h.
#define FASTPAR_CORE_TYPE_INT32 int32_t
#define FASTPAR_CORE_TYPE_INT64 int64_t
#define FASTPAR_CORE_TYPE_FLOAT float
#define FASTPAR_CORE_TYPE_BOOL bool
#define FASTPAR_CORE_TYPE_STRING std::string
#define FASTPAR_CORE_TYPE_STRINGS std::vector<std::string>
#define FASTPAR_CORE_TYPE_BIASES std::vector<std::pair<int32_t, float>>
#define FASTPAR_CORE_TYPE_TOKENS std::vector<int32_t>

// One field of a fastpar_fields.h list as a read-write attribute of `options`, the
// pybind11::class_ of its params struct in scope: FASTPAR_GENERATE_FIELDS(FASTPAR_PY_OPTION)
// binds them all. A field whose type is not its kind's fails to compile.
#define FASTPAR_PY_OPTION(name, kind, c, py, r)                                                             \
    static_assert(std::is_same_v<decltype(decltype(options)::type::name), FASTPAR_CORE_TYPE_##kind>,        \
                  #name " is not of its kind " #kind " (capi/fastpar_fields.h)");                           \
    options.def_readwrite(#name, &decltype(options)::type::name);

namespace fastpar::python {

// What Python passes as one prompt: raw text, chat messages, or token ids (checked in
// src/fastpar; an empty list is an empty chat).
using PromptIn = std::variant<std::string, std::vector<ChatMessage>, std::vector<int32_t>>;
Prompt to_prompt(const PromptIn & in);

void register_errors(pybind11::module_ & m);
void register_model(pybind11::module_ & m);
void register_generate(pybind11::module_ & m);
void register_engine(pybind11::module_ & m);

}  // namespace fastpar::python
