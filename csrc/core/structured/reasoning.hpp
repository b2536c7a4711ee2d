// Thinking models' thoughts (<think>...</think>, as Qwen3 and DeepSeek-R1 write them), for
// GenerateParams::reasoning: where a prompt leaves a thought open, the grammar that lets a
// thought come first and constrains the answer after it, and the split of a finished text
// into the thought and the answer.
#pragma once

#include <string>

namespace fastpar {

constexpr const char * kThoughtOpen = "<think>";
constexpr const char * kThoughtClose = "</think>";
// The root rule of reasoning_grammar's grammars.
constexpr const char * kReasonedRoot = "fastpar-reasoned";

// Whether `prompt` (as rendered) ends inside a thought: its last non-blank text is <think>,
// as templates that start every answer thinking leave it.
bool opens_thought(const std::string & prompt);

// A chat prompt with its thought closed empty (reasoning "off"), as Qwen3's template does
// with enable_thinking false: an open thought is closed, else an empty one is added.
std::string close_thought(const std::string & prompt);

// GBNF whose root kReasonedRoot is a thought, then `answer`'s root: `answer` (GBNF with a
// rule "root") constrains the text after </think> and a little whitespace. The thought is any
// text without </think>; it must come first when the prompt `opened` one, and may otherwise
// open with <think> or be left out.
std::string reasoning_grammar(const std::string & answer, bool opened);

// Splits a finished output of reasoning "split": returns the thought (without its tags and
// surrounding whitespace) and leaves the answer in `text` (without leading whitespace). An
// output that never opened a thought (and a prompt that did not) returns "" and keeps
// `text`; a thought never closed takes the whole text, leaving "".
std::string split_thought(std::string & text, bool opened);

}  // namespace fastpar
