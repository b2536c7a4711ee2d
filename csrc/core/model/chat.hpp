// Tool calls: chat messages and tools rendered by the model's own Jinja template, and the
// calls parsed back out of the generated text, both by the vendored llama.cpp's chat
// library (common/chat.h), the code llama-server runs with --jinja; so a template's tools
// block, its call format (Hermes/Qwen <tool_call>, Llama 3.x, Mistral [TOOL_CALLS], ...)
// and the parse match llama-server's exactly. A template that does not describe tools gets
// the generic format (chat.cpp): the tools in a system message and a JSON object
// the grammar forces, so every model can call tools.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/params.hpp"
#include "core/base/results.hpp"
#include "llama.h"

struct common_chat_templates;

namespace fastpar {

// What a prompt with tools generates with: the prompt text, the constraint (empty: none),
// the text that grammar reads before the output (the part of the prompt the template's
// call format starts with), extra stop strings, and the parser of the output (opaque).
struct ChatRender {
    std::string prompt;
    std::string grammar;
    std::string grammar_prefill;
    std::vector<std::string> stops;
    std::string parser;
    std::string format;  // the call format's name: "generic", "native", "content-only"
};

struct ChatReply {
    std::string content;
    std::string reasoning;
    std::vector<ToolCall> tool_calls;
};

// The model's templates, parsed once (Model owns one).
class ChatTemplates {
public:
    explicit ChatTemplates(const llama_model * model);
    ~ChatTemplates();
    // messages: an OpenAI messages array (JSON text: roles system, user, assistant with
    // tool_calls, tool with tool_call_id); tools: an OpenAI tools array (JSON text, may be
    // empty); tool_choice: "auto", "none", "required" or a function's name. Throws
    // InvalidArgument naming what is wrong.
    ChatRender render(const std::string & messages, const std::string & tools, const std::string & tool_choice,
                      bool parallel_tool_calls) const;
    // Whether the template itself describes tools (else the generic format is used).
    bool native_tools() const;

private:
    // The templates, parsed on first use; the caller holds mutex_.
    const common_chat_templates * parsed() const;

    const llama_model * model_;
    mutable std::mutex mutex_;
    mutable std::unique_ptr<common_chat_templates, void (*)(common_chat_templates *)> templates_;  // parsed on first use
};

// The reply in `text` (a whole output, or a prefix of one when `partial`), as `parser`
// (ChatRender::parser) reads it. Never throws: text that is no well-formed call comes back
// as content. Calls get no ids here.
ChatReply parse_reply(const std::string & parser, const std::string & text, bool partial);

// A fresh tool-call id.
std::string new_tool_call_id();

// OpenAI's messages array (JSON text) of these messages: an assistant's calls as
// tool_calls (its content null when empty), a tool's result with its tool_call_id.
std::string messages_json(const std::vector<ChatMessage> & messages);

}  // namespace fastpar
