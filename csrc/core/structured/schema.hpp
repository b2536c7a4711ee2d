// JSON schemas and regular expressions for structured output: checked against the features
// the converter enforces and turned into GBNF by the vendored llama.cpp's converter
// (common/json-schema-to-grammar). docs/api.md lists the features supported.
#pragma once

#include <string>
#include <vector>

#include "core/base/params.hpp"

namespace fastpar {

// Throws InvalidArgument when `schema` is not JSON, uses a feature outside the supported
// list (naming it and where), or the converter cannot turn it into a grammar. What it
// converts is kept (by text), so checking every prompt of a call costs one conversion.
void validate_json_schema(const std::string & schema);

// The GBNF that constrains `params`: its grammar, its choices as alternatives of literals, or
// its JSON schema or regex converted (one that the validate functions reject throws
// InvalidArgument).
std::string constraint_grammar(const GenerateParams & params);

// Throws InvalidArgument when `regex` is empty or not a regular expression of the supported
// subset, naming why; what it converts is kept, as for schemas.
void validate_regex(const std::string & regex);

// GBNF whose root matches exactly the strings `regex` matches whole (as Python's
// re.fullmatch; ^ and $ at its ends are implied), or InvalidArgument. Not kept.
std::string regex_grammar(const std::string & regex);

// GBNF whose root is exactly one of `choices` (non-empty strings), each a literal.
std::string choice_grammar(const std::vector<std::string> & choices);

// One conversion of `schema` to GBNF, checked as validate_json_schema checks it, and not
// kept: what the two functions above cost the first time they see a schema.
std::string convert_json_schema(const std::string & schema);

}  // namespace fastpar
