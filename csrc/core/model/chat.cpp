#include "core/model/chat.hpp"

#include <random>

#include <nlohmann/json.hpp>

#include "chat.h"
#include "core/base/errors.hpp"
#include "json-schema-to-grammar.h"

namespace fastpar {

namespace {

using nlohmann::ordered_json;

ordered_json parse_json(const std::string & text, const char * what) {
    try {
        return ordered_json::parse(text);
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string(what) + " is not valid JSON: " + e.what());
    }
}

// The generic format, for templates that do not describe tools (as llama-server's generic
// handler did): the tools listed in a system message, and the reply one JSON object that
// the grammar forces: {"tool_call": {"name", "arguments"}} ({"tool_calls": [...]} when
// parallel) or, with tool_choice "auto", {"response": "..."}.
ordered_json generic_schema(const ordered_json & tools, bool required, bool parallel) {
    ordered_json calls = ordered_json::array();
    for (const auto & tool : tools) {
        const auto & fn = tool.at("function");
        ordered_json params = fn.contains("parameters") ? fn.at("parameters") : ordered_json::object();
        calls.push_back({{"type", "object"},
                         {"properties", {{"name", {{"const", fn.at("name")}}}, {"arguments", params}}},
                         {"required", {"name", "arguments"}}});
    }
    const ordered_json call = calls.size() == 1 ? calls[0] : ordered_json{{"anyOf", calls}};
    ordered_json options = ordered_json::array();
    if (parallel) {
        options.push_back({{"type", "object"},
                           {"properties", {{"tool_calls", {{"type", "array"}, {"items", call}, {"minItems", 1}}}}},
                           {"required", {"tool_calls"}}});
    } else {
        options.push_back(
            {{"type", "object"}, {"properties", {{"tool_call", call}}}, {"required", {"tool_call"}}});
    }
    if (!required) {
        options.push_back({{"type", "object"},
                           {"properties", {{"response", {{"type", "string"}}}}},
                           {"required", {"response"}}});
    }
    return options.size() == 1 ? options[0] : ordered_json{{"anyOf", options}};
}

std::string generic_system(const ordered_json & tools, bool required, bool parallel) {
    // Short: the grammar enforces the shape, the words only tell the model what it means.
    std::string out = "You can call these tools:\n";
    for (const auto & tool : tools) {
        out += tool.at("function").dump() + "\n";
    }
    const std::string call = "{\"name\": <tool name>, \"arguments\": <its arguments>}";
    out += parallel ? "To call tools, reply with {\"tool_calls\": [" + call + ", ...]}"
                    : "To call a tool, reply with {\"tool_call\": " + call + "}";
    out += required ? ".\n" : "; to answer directly, reply with {\"response\": <your answer>}.\n";
    return out;
}

// Earlier turns in the generic format: an assistant's calls as the JSON it would have
// written, a tool's result as a message of its own role.
ordered_json generic_messages(const ordered_json & messages, const std::string & system, bool parallel) {
    ordered_json out = ordered_json::array();
    bool merged = false;
    for (const auto & m : messages) {
        ordered_json msg = m;
        if (!merged && m.value("role", "") == "system" && m.contains("content") && m.at("content").is_string()) {
            msg["content"] = m.at("content").get<std::string>() + "\n\n" + system;
            merged = true;
        }
        if (m.value("role", "") == "assistant" && m.contains("tool_calls") && m.at("tool_calls").is_array()) {
            ordered_json calls = ordered_json::array();
            for (const auto & c : m.at("tool_calls")) {
                const auto & fn = c.at("function");
                ordered_json args = fn.at("arguments");
                if (args.is_string()) {
                    args = parse_json(args.get<std::string>(), "a tool call's arguments");
                }
                calls.push_back({{"name", fn.at("name")}, {"arguments", args}});
            }
            const ordered_json reply = parallel || calls.size() != 1 ? ordered_json{{"tool_calls", calls}}
                                                                      : ordered_json{{"tool_call", calls[0]}};
            msg.erase("tool_calls");
            msg["content"] = reply.dump();
        }
        out.push_back(msg);
    }
    if (!merged) {
        out.insert(out.begin(), ordered_json{{"role", "system"}, {"content", system}});
    }
    return out;
}

ChatReply parse_generic(const std::string & text, bool partial) {
    ChatReply r;
    ordered_json j;
    try {
        j = ordered_json::parse(text);
    } catch (const std::exception &) {
        if (!partial) {
            r.content = text;
        }
        return r;
    }
    const auto call_of = [](const ordered_json & c) {
        ToolCall t;
        t.name = c.at("name").get<std::string>();
        t.arguments = c.at("arguments").dump();
        return t;
    };
    try {
        if (j.is_object() && j.contains("tool_call")) {
            r.tool_calls.push_back(call_of(j.at("tool_call")));
        } else if (j.is_object() && j.contains("tool_calls") && j.at("tool_calls").is_array()) {
            for (const auto & c : j.at("tool_calls")) {
                r.tool_calls.push_back(call_of(c));
            }
        } else if (j.is_object() && j.contains("response") && j.at("response").is_string()) {
            r.content = j.at("response").get<std::string>();
        } else {
            r.content = text;
        }
    } catch (const std::exception &) {
        r = ChatReply();
        r.content = text;
    }
    return r;
}

}  // namespace

ChatTemplates::ChatTemplates(const llama_model * model)
    : model_(model), templates_(nullptr, common_chat_templates_free) {}

ChatTemplates::~ChatTemplates() = default;

const common_chat_templates * ChatTemplates::parsed() const {
    if (!templates_) {
        templates_.reset(common_chat_templates_init(model_, "").release());
    }
    return templates_.get();
}

bool ChatTemplates::native_tools() const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto caps = common_chat_templates_get_caps(parsed());
    const auto it = caps.find("supports_tools");
    return it != caps.end() && it->second;
}

ChatRender ChatTemplates::render(const std::string & messages, const std::string & tools,
                                 const std::string & tool_choice, bool parallel_tool_calls) const {
    ordered_json msgs = parse_json(messages, "messages");
    ordered_json tool_list = tools.empty() ? ordered_json::array() : parse_json(tools, "tools");
    if (!msgs.is_array() || msgs.empty()) {
        throw InvalidArgument("messages must be a non-empty array of chat messages");
    }
    if (!tool_list.is_array()) {
        throw InvalidArgument("tools must be an array of {\"type\": \"function\", \"function\": {...}}");
    }
    for (const auto & t : tool_list) {
        if (!t.is_object() || !t.contains("function") || !t.at("function").is_object() ||
            !t.at("function").contains("name") || !t.at("function").at("name").is_string()) {
            throw InvalidArgument("each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
    }
    bool required = tool_choice == "required";
    if (tool_choice != "auto" && tool_choice != "none" && tool_choice != "required") {
        // A named function: the call must be to it.
        ordered_json named = ordered_json::array();
        for (const auto & t : tool_list) {
            if (t.at("function").at("name") == tool_choice) {
                named.push_back(t);
            }
        }
        if (named.empty()) {
            throw InvalidArgument("tool_choice names function '" + tool_choice + "', which tools do not define");
        }
        tool_list = named;
        required = true;
    }
    const bool use_tools = !tool_list.empty() && tool_choice != "none";
    const bool native = use_tools && native_tools();

    ChatRender out;
    common_chat_templates_inputs in;
    in.add_generation_prompt = true;
    in.use_jinja = true;
    in.parallel_tool_calls = parallel_tool_calls;
    ordered_json generic;
    if (use_tools && !native) {
        generic = generic_schema(tool_list, required, parallel_tool_calls);
        msgs = generic_messages(msgs, generic_system(tool_list, required, parallel_tool_calls), parallel_tool_calls);
    }
    try {
        in.messages = common_chat_msgs_parse_oaicompat(common_json::parse(msgs.dump()));
        if (native) {
            in.tools = common_chat_tools_parse_oaicompat(common_json::parse(tool_list.dump()));
            in.tool_choice = required ? COMMON_CHAT_TOOL_CHOICE_REQUIRED : COMMON_CHAT_TOOL_CHOICE_AUTO;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        common_chat_params p = common_chat_templates_apply(parsed(), in);
        out.prompt = std::move(p.prompt);
        out.stops = std::move(p.additional_stops);
        ordered_json parser = {{"kind", "native"},
                               {"format", static_cast<int>(p.format)},
                               {"generation_prompt", p.generation_prompt},
                               {"parser", p.parser}};
        out.format = use_tools ? "native" : "content-only";
        if (!generic.is_null()) {
            out.grammar = json_schema_to_grammar(common_json::parse(generic.dump()));
            parser = {{"kind", "generic"}};
            out.format = "generic";
        } else if (native && !p.grammar_lazy && !p.grammar.empty()) {
            // A lazy grammar (tool_choice "auto") starts at a call's first marker; the
            // engine has no lazy grammars, so there the output is parsed, not constrained.
            out.grammar = std::move(p.grammar);
            out.grammar_prefill = p.generation_prompt;
        }
        out.parser = parser.dump();
    } catch (const InvalidArgument &) {
        throw;
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string("the chat template cannot render these messages and tools: ") + e.what());
    }
    return out;
}

std::string messages_json(const std::vector<ChatMessage> & messages) {
    ordered_json out = ordered_json::array();
    for (const ChatMessage & m : messages) {
        ordered_json j = {{"role", m.role}};
        j["content"] = m.content.empty() && !m.tool_calls.empty() ? ordered_json() : ordered_json(m.content);
        if (!m.tool_calls.empty()) {
            ordered_json calls = ordered_json::array();
            for (const ToolCall & c : m.tool_calls) {
                calls.push_back({{"id", c.id}, {"type", "function"},
                                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
            }
            j["tool_calls"] = std::move(calls);
        }
        if (!m.tool_call_id.empty()) {
            j["tool_call_id"] = m.tool_call_id;
        }
        out.push_back(std::move(j));
    }
    try {
        return out.dump();
    } catch (const std::exception &) {
        throw InvalidArgument("a chat message is not valid UTF-8");
    }
}

ChatReply parse_reply(const std::string & parser, const std::string & text, bool partial) {
    ChatReply r;
    try {
        const ordered_json p = ordered_json::parse(parser);
        if (p.at("kind") == "generic") {
            return parse_generic(text, partial);
        }
        common_chat_parser_params params;
        params.format = static_cast<common_chat_format>(p.at("format").get<int>());
        params.generation_prompt = p.at("generation_prompt").get<std::string>();
        params.parse_tool_calls = true;
        const std::string arena = p.at("parser").get<std::string>();
        if (!arena.empty()) {
            params.parser.load(arena);
        }
        const common_chat_msg msg = common_chat_parse(text, partial, params);
        r.content = msg.content;
        r.reasoning = msg.reasoning_content;
        for (const auto & c : msg.tool_calls) {
            r.tool_calls.push_back({c.id, c.name, c.arguments});
        }
    } catch (const std::exception &) {
        // Not a well-formed call (or not yet, when partial): the text is the answer.
        r = ChatReply();
        r.content = partial ? std::string() : text;
    }
    return r;
}

std::string new_tool_call_id() {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) {
        id += alphabet[rng() % (sizeof(alphabet) - 1)];
    }
    return id;
}

}  // namespace fastpar
