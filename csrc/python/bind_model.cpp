#include <pybind11/stl.h>

#include "core/loop/engine.hpp"
#include "core/base/errors.hpp"
#include "core/base/params.hpp"
#include "core/model/model.hpp"
#include "python/module.hpp"
#include "python/records.hpp"

namespace py = pybind11;

namespace fastpar::python {

void register_errors(py::module_ & m) {
    PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> error_type;
    PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> load_error_type;
    PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> closed_type;
    PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> queue_full_type;
    error_type.call_once_and_store_result([&] {
        return py::object(py::exception<Error>(m, "FastparError", PyExc_RuntimeError));
    });
    load_error_type.call_once_and_store_result([&] {
        return py::object(py::exception<ModelLoadError>(m, "ModelLoadError", error_type.get_stored().ptr()));
    });
    closed_type.call_once_and_store_result([&] {
        return py::object(py::exception<EngineClosed>(m, "EngineClosed", error_type.get_stored().ptr()));
    });
    queue_full_type.call_once_and_store_result([&] {
        return py::object(py::exception<QueueFull>(m, "QueueFull", error_type.get_stored().ptr()));
    });
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const Timeout & e) {
            PyErr_SetString(PyExc_TimeoutError, e.what());
        } catch (const EngineClosed & e) {
            PyErr_SetString(closed_type.get_stored().ptr(), e.what());
        } catch (const QueueFull & e) {
            PyErr_SetString(queue_full_type.get_stored().ptr(), e.what());
        } catch (const FileNotFound & e) {
            PyErr_SetString(PyExc_FileNotFoundError, e.what());
        } catch (const ModelLoadError & e) {
            PyErr_SetString(load_error_type.get_stored().ptr(), e.what());
        } catch (const Error & e) {
            PyErr_SetString(error_type.get_stored().ptr(), e.what());
        }
    });
}

void register_model(py::module_ & m) {
    {
        py::class_<ModelParams> options(m, "ModelParams", "Options of a model load; defaults are fastpar's.");
        options.def(py::init<>());
        FASTPAR_MODEL_FIELDS(FASTPAR_PY_OPTION)
        options.def("validate", [](const ModelParams & p) { validate(p); },
                    "Raises ValueError naming the first option out of range.");
    }

    // Before Model, whose apply_chat_template takes it: a signature names only the types
    // registered before it (and the generated stub reads the signatures).
    py::class_<ChatMessage>(m, "ChatMessage")
        .def(py::init([](std::string role, std::string content) { return ChatMessage{std::move(role), std::move(content)}; }),
             py::arg("role"), py::arg("content"))
        .def_readonly("role", &ChatMessage::role)
        .def_readonly("content", &ChatMessage::content);

    // Before Model and Completion, whose signatures name them.
    auto tool_call = py::class_<ToolCall>(m, "ToolCall", "One tool call an output made.")
        .def_readonly("id", &ToolCall::id)
        .def_readonly("name", &ToolCall::name)
        .def_readonly("arguments", &ToolCall::arguments, "The arguments, a JSON object as text.");
    def_record(tool_call, "ToolCall", {"id", "name", "arguments"}, {"id", "name", "arguments"});
    auto render = py::class_<ChatRender>(m, "ChatRender", "A chat prompt with tools, as Model.render_chat makes it.")
        .def_readonly("prompt", &ChatRender::prompt)
        .def_readonly("grammar", &ChatRender::grammar)
        .def_readonly("grammar_prefill", &ChatRender::grammar_prefill)
        .def_readonly("stops", &ChatRender::stops)
        .def_readonly("parser", &ChatRender::parser)
        .def_readonly("format", &ChatRender::format);
    def_record(render, "ChatRender", {"format", "prompt"},
               {"prompt", "grammar", "grammar_prefill", "stops", "parser", "format"});
    auto reply = py::class_<ChatReply>(m, "ChatReply", "A reply with tools, as parse_reply reads it.")
        .def_readonly("content", &ChatReply::content)
        .def_readonly("reasoning", &ChatReply::reasoning)
        .def_readonly("tool_calls", &ChatReply::tool_calls);
    def_record(reply, "ChatReply", {"content", "tool_calls"}, {"content", "reasoning", "tool_calls"});
    py::class_<Model, std::shared_ptr<Model>>(m, "Model", "A GGUF model loaded with llama.cpp.")
        .def(py::init<const std::string &, const ModelParams &>(), py::arg("path"), py::arg("params"),
             py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("path", &Model::path)
        .def_property_readonly("n_vocab", &Model::n_vocab)
        .def_property_readonly("n_ctx_train", &Model::n_ctx_train)
        .def_property_readonly("description", &Model::description)
        .def_property_readonly("has_chat_template", &Model::has_chat_template)
        .def_property_readonly("chat_template",
                               [](const Model & m) -> std::optional<std::string> {
                                   const char * t = m.chat_template();
                                   return t != nullptr ? std::optional<std::string>(t) : std::nullopt;
                               })
        .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("parse_special") = true,
             py::arg("add_special") = true,
             "Token ids of text, as generate would feed them (special tokens parsed unless parse_special=False;\n"
             "BOS/EOS as the vocabulary asks unless add_special=False).")
        .def("rerank_prompt", &Model::rerank_prompt, py::arg("query"), py::arg("document"),
             "The tokens a reranker scores for (query, document), as llama-server's /rerank makes them.")
        .def_property_readonly("add_bos", &Model::add_bos)
        .def_property_readonly("token_bos", &Model::token_bos)
        .def_property_readonly("token_eos", &Model::token_eos)
        .def("apply_chat_template", &Model::apply_chat_template, py::arg("messages"),
             "Messages rendered with the model's chat template, assistant turn opened.")
        .def("token_bytes", [](const Model & m, int32_t token) {
                 if (token < 0 || token >= m.n_vocab()) {
                     throw py::value_error("token " + std::to_string(token) + " is not in the vocabulary of " +
                                           std::to_string(m.n_vocab()));
                 }
                 return py::bytes(m.token_piece(token));
             },
             py::arg("token"), "The bytes one token stands for (possibly part of a UTF-8 character).")
        .def("render_chat",
             [](const Model & m, const std::string & messages, const std::string & tools, const std::string & tool_choice,
                bool parallel_tool_calls) {
                 py::gil_scoped_release release;
                 return m.chat_templates().render(messages, tools, tool_choice, parallel_tool_calls);
             },
             py::arg("messages"), py::arg("tools") = "", py::arg("tool_choice") = "auto",
             py::arg("parallel_tool_calls") = false,
             "OpenAI messages and tools (JSON text) rendered with the model's Jinja chat template: "
             "the prompt, and the grammar and parser of its tool calls.")
        .def_property_readonly("native_tools", [](const Model & m) { return m.chat_templates().native_tools(); },
                               "Whether the chat template describes tools itself (else the generic format is used).");

    m.def("parse_reply", &parse_reply, py::arg("parser"), py::arg("text"), py::arg("partial") = false,
          "The content, thought and tool calls of `text` as a ChatRender's parser reads them; with partial, "
          "of a prefix of an output (calls not finished yet are left out). Calls get no ids.");
    m.def("new_tool_call_id", &new_tool_call_id, "A fresh tool-call id (\"call_\" and 24 random characters).");
}

}  // namespace fastpar::python
