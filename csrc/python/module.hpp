// pybind11 bindings of fastpar's core: conversion only, one register_<topic>() per file.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <variant>
#include <vector>

#include "core/base/params.hpp"

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
