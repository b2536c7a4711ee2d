// A loaded GGUF model: weights, vocabulary and chat template. Immutable after load,
// so several Contexts may share one Model from several threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/base/params.hpp"
#include "core/model/chat.hpp"
#include "llama.h"

namespace fastpar {

class Model {
public:
    // Throws FileNotFound, InvalidArgument or ModelLoadError (with llama.cpp's reason).
    Model(const std::string & path, const ModelParams & params);
    ~Model();
    Model(const Model &) = delete;
    Model & operator=(const Model &) = delete;

    llama_model * get() const { return model_; }
    const llama_vocab * vocab() const { return vocab_; }
    const std::string & path() const { return path_; }
    int32_t n_vocab() const;
    bool add_bos() const;           // the vocabulary puts BOS before a text it tokenizes
    llama_token token_bos() const;  // -1 = none
    llama_token token_eos() const;  // -1 = none
    bool is_eog(llama_token token) const;  // an end-of-generation token (EOS, EOT, ...)
    int32_t n_ctx_train() const;
    std::string description() const;
    bool has_chat_template() const { return chat_template_ != nullptr; }
    // The GGUF's chat template text (null: none).
    const char * chat_template() const { return chat_template_; }
    // True when every layer and the output layer run on a GPU (n_gpu_layers covers them all).
    bool output_on_gpu() const { return output_on_gpu_; }
    // True when any layer runs on a GPU (n_gpu_layers != 0 in a GPU build).
    bool on_gpu() const { return on_gpu_; }

    // Tokens of `text`, with the vocabulary's BOS/EOS rules and special tokens parsed.
    // `parse_special`: text such as "<|im_start|>"
    // becomes its special token (as prompts are fed), else plain text (llama-perplexity).
    // `add_special`: BOS/EOS as the vocabulary asks (off: the text's own tokens only).
    std::vector<llama_token> tokenize(const std::string & text, bool parse_special = true, bool add_special = true) const;
    // The tokens a reranker scores for (query, document), as llama-server's /rerank makes
    // them: the model's "rerank" template with {query} and {document} filled in when its
    // GGUF has one, else [BOS] query [EOS] [SEP] document [EOS] as the vocabulary adds them.
    std::vector<llama_token> rerank_prompt(const std::string & query, const std::string & document) const;
    // The bytes of one token (special tokens render empty); may be part of a UTF-8 character.
    std::string token_piece(llama_token token) const;
    // `messages` rendered with the model's chat template, the assistant turn opened.
    // Throws InvalidArgument when the model has no template llama.cpp can apply.
    std::string apply_chat_template(const std::vector<ChatMessage> & messages) const;
    // The Jinja chat template, for messages with tools (core/model/chat.hpp).
    const ChatTemplates & chat_templates() const { return *chat_templates_; }

private:
    std::string path_;
    llama_model * model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    const char * chat_template_ = nullptr;
    bool output_on_gpu_ = false;
    bool on_gpu_ = false;
    std::unique_ptr<ChatTemplates> chat_templates_;
};

// The backend this library was compiled for: "cpu", "cuda" or "metal".
const char * backend_name();
const char * version();

}  // namespace fastpar
