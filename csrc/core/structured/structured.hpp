// Structured output, as the rest of the core uses it: a GBNF grammar, or a JSON schema
// turned into one by the vendored llama.cpp's converter, constrains every token a prompt
// generates. docs/api.md lists the JSON-schema features supported and what happens when a
// constraint fails. The units of this folder, one job each:
//   schema              JSON schema and regex checks and conversion to GBNF
//   reasoning           thoughts (<think>): open prompts, the grammar after one, the split
//   grammar             llama.cpp's grammar internals (the one header that includes them)
//   token_tree          the vocabulary arranged once for masking it whole
//   allowed_sets        allowed-token sets by grammar state, and the state key
//   grammar_cache       grammars compiled once per vocabulary, a copy per request
//   constrained_choice  a constrained request's next token (sample_constrained)
#pragma once

#include "core/structured/constrained_choice.hpp"
#include "core/structured/grammar_cache.hpp"
#include "core/structured/reasoning.hpp"
#include "core/structured/schema.hpp"
