#include "core/model/model.hpp"

#include <climits>
#include <filesystem>
#include <system_error>

#include "core/base/errors.hpp"
#include "core/model/gguf_check.hpp"
#include "core/base/log.hpp"
#include "ggml-backend.h"
#include "gguf.h"

namespace fastpar {
namespace {

// llama.cpp offloads the output layer, after every repeating one, once n_gpu_layers
// exceeds the repeating layers (-1: all).
bool offloads_every_layer(int32_t n_gpu_layers, int64_t n_layer) {
    return n_gpu_layers < 0 || n_gpu_layers > n_layer;
}

// Whether the model's token-embedding table is quantized and `n_gpu_layers` offloads every
// layer, read from the GGUF header alone (false for a file that has no readable header:
// llama.cpp then says what is wrong with it).
bool quantized_embeddings_all_offloaded(const std::string & path, int32_t n_gpu_layers) {
    gguf_init_params gp{};
    gp.no_alloc = true;
    gguf_context * g = gguf_init_from_file(path.c_str(), gp);
    if (g == nullptr) {
        return false;
    }
    bool quantized = false;
    int64_t n_layer = -1;
    const int64_t ti = gguf_find_tensor(g, "token_embd.weight");
    if (ti >= 0) {
        quantized = ggml_is_quantized(gguf_get_tensor_type(g, ti));
    }
    const int64_t ai = gguf_find_key(g, "general.architecture");
    if (ai >= 0 && gguf_get_kv_type(g, ai) == GGUF_TYPE_STRING) {
        const std::string key = std::string(gguf_get_val_str(g, ai)) + ".block_count";
        const int64_t bi = gguf_find_key(g, key.c_str());
        if (bi >= 0 && gguf_get_kv_type(g, bi) == GGUF_TYPE_UINT32) {
            n_layer = gguf_get_val_u32(g, bi);
        } else if (bi >= 0 && gguf_get_kv_type(g, bi) == GGUF_TYPE_INT32) {
            n_layer = gguf_get_val_i32(g, bi);
        }
    }
    gguf_free(g);
    return quantized && n_layer >= 0 && offloads_every_layer(n_gpu_layers, n_layer);
}

}  // namespace

const char * backend_name() { return FASTPAR_BACKEND_NAME; }
const char * version() { return FASTPAR_VERSION; }

Model::Model(const std::string & path, const ModelParams & params) : path_(path) {
    validate(params);
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(status)) {
        throw FileNotFound("model file not found: '" + path + "'");
    }
    if (!std::filesystem::is_regular_file(status)) {
        throw InvalidArgument("model path is not a regular file: '" + path + "'");
    }
    backend_init();
    if (params.n_gpu_layers != 0 && !llama_supports_gpu_offload()) {
        throw InvalidArgument("n_gpu_layers=" + std::to_string(params.n_gpu_layers) +
                              " asks for GPU layers, but fastpar was built without a GPU backend "
                              "(FASTPAR_BACKEND=" + std::string(backend_name()) +
                              "); use n_gpu_layers=0 or rebuild with FASTPAR_BACKEND=cuda or metal");
    }

    // Values llama.cpp would assert on (killing the process) become a ModelLoadError here.
    check_gguf(path);

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = params.n_gpu_layers < 0 ? INT32_MAX : params.n_gpu_layers;
    mp.load_mode = params.use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    // llama.cpp keeps the token-embedding table (the input layer) in host memory, so every
    // decode first looks up its tokens' rows on the CPU. A quantized table is dequantized
    // there row by row while the GPU waits: with every layer on a GPU, such a table goes
    // to the (first) GPU too, where the lookup is one kernel. An unquantized table was
    // slower there, so it stays where llama.cpp puts it (docs/performance.md, "Token
    // embeddings").
    llama_model_tensor_buft_override overrides[2] = {{nullptr, nullptr}, {nullptr, nullptr}};
    if (llama_supports_gpu_offload() && params.n_gpu_layers != 0 &&
        quantized_embeddings_all_offloaded(path, params.n_gpu_layers)) {
        ggml_backend_dev_t gpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
        if (gpu != nullptr) {
            overrides[0] = {"^token_embd\\.weight$", ggml_backend_dev_buffer_type(gpu)};
            mp.tensor_buft_overrides = overrides;
        }
    }
    clear_last_llama_error();
    model_ = llama_model_load_from_file(path.c_str(), mp);
    if (model_ == nullptr) {
        std::string why = last_llama_error();
        throw ModelLoadError("failed to load model '" + path + "': " +
                             (why.empty() ? std::string("not a GGUF model llama.cpp can load") : why));
    }
    vocab_ = llama_model_get_vocab(model_);
    chat_template_ = llama_model_chat_template(model_, nullptr);
    chat_templates_ = std::make_unique<ChatTemplates>(model_);
    output_on_gpu_ =
        llama_supports_gpu_offload() && offloads_every_layer(params.n_gpu_layers, llama_model_n_layer(model_));
    on_gpu_ = llama_supports_gpu_offload() && params.n_gpu_layers != 0;
}

Model::~Model() {
    if (model_ != nullptr) {
        llama_model_free(model_);
    }
}

int32_t Model::n_vocab() const { return llama_vocab_n_tokens(vocab_); }

int32_t Model::n_ctx_train() const { return llama_model_n_ctx_train(model_); }

std::string Model::description() const {
    char buf[256];
    const int32_t n = llama_model_desc(model_, buf, sizeof(buf));
    return n > 0 ? std::string(buf) : std::string();
}

std::vector<llama_token> Model::tokenize(const std::string & text, bool parse_special, bool add_special) const {
    if (text.size() > static_cast<size_t>(INT32_MAX)) {
        throw InvalidArgument("prompt is too long to tokenize (" + std::to_string(text.size()) + " bytes)");
    }
    const auto len = static_cast<int32_t>(text.size());
    // Upper bound: one token per byte, plus BOS/EOS.
    std::vector<llama_token> tokens(text.size() + 2);
    int32_t n = llama_tokenize(vocab_, text.data(), len, tokens.data(), static_cast<int32_t>(tokens.size()),
                               add_special, parse_special);
    if (n == INT32_MIN) {
        throw InvalidArgument("prompt has too many tokens to represent");
    }
    if (n < 0) {  // the bound above was not enough (cannot happen with byte-level vocabularies)
        tokens.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab_, text.data(), len, tokens.data(), static_cast<int32_t>(tokens.size()),
                           add_special, parse_special);
        if (n < 0) {
            throw Error("llama_tokenize failed (" + std::to_string(n) + ")");
        }
    }
    tokens.resize(static_cast<size_t>(n));
    return tokens;
}

std::vector<llama_token> Model::rerank_prompt(const std::string & query, const std::string & document) const {
    if (const char * tmpl = llama_model_chat_template(model_, "rerank")) {
        std::string prompt = tmpl;
        // Every {query}, then every {document} of the result, as llama-server fills them in.
        const auto fill = [&prompt](const std::string & key, const std::string & value) {
            for (size_t at = prompt.find(key); at != std::string::npos; at = prompt.find(key, at + value.size())) {
                prompt.replace(at, key.size(), value);
            }
        };
        fill("{query}", query);
        fill("{document}", document);
        return tokenize(prompt, /*parse_special=*/true, /*add_special=*/false);
    }
    // Without a template, the pair as the vocabulary marks sentences (EOS, else SEP, ends one).
    llama_token eos = llama_vocab_eos(vocab_);
    if (eos == LLAMA_TOKEN_NULL) {
        eos = llama_vocab_sep(vocab_);
    }
    std::vector<llama_token> out;
    if (llama_vocab_get_add_bos(vocab_)) {
        out.push_back(llama_vocab_bos(vocab_));
    }
    const std::vector<llama_token> q = tokenize(query, false, false);
    out.insert(out.end(), q.begin(), q.end());
    if (llama_vocab_get_add_eos(vocab_)) {
        out.push_back(eos);
    }
    if (llama_vocab_get_add_sep(vocab_)) {
        out.push_back(llama_vocab_sep(vocab_));
    }
    const std::vector<llama_token> d = tokenize(document, false, false);
    out.insert(out.end(), d.begin(), d.end());
    if (llama_vocab_get_add_eos(vocab_)) {
        out.push_back(eos);
    }
    return out;
}

bool Model::add_bos() const { return llama_vocab_get_add_bos(vocab_); }
llama_token Model::token_bos() const { return llama_vocab_bos(vocab_); }
llama_token Model::token_eos() const { return llama_vocab_eos(vocab_); }
bool Model::is_eog(llama_token token) const { return llama_vocab_is_eog(vocab_, token); }

std::string Model::token_piece(llama_token token) const {
    char buf[128];
    int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, /*special=*/false);
    if (n >= 0) {
        return std::string(buf, static_cast<size_t>(n));
    }
    if (n == INT32_MIN) {
        return std::string();
    }
    std::string big(static_cast<size_t>(-n), '\0');
    n = llama_token_to_piece(vocab_, token, big.data(), static_cast<int32_t>(big.size()), 0, false);
    big.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return big;
}

std::string Model::apply_chat_template(const std::vector<ChatMessage> & messages) const {
    if (chat_template_ == nullptr) {
        throw InvalidArgument("model '" + path_ + "' has no chat template; pass prompts as plain strings");
    }
    std::vector<llama_chat_message> chat;
    chat.reserve(messages.size());
    size_t total = 0;
    for (const auto & m : messages) {
        chat.push_back({m.role.c_str(), m.content.c_str()});
        total += m.role.size() + m.content.size();
    }
    std::string buf(2 * total + 256, '\0');
    int32_t n = llama_chat_apply_template(chat_template_, chat.data(), chat.size(), /*add_ass=*/true,
                                          buf.data(), static_cast<int32_t>(buf.size()));
    if (n > static_cast<int32_t>(buf.size())) {
        buf.resize(static_cast<size_t>(n));
        n = llama_chat_apply_template(chat_template_, chat.data(), chat.size(), true, buf.data(),
                                      static_cast<int32_t>(buf.size()));
    }
    if (n < 0) {
        throw InvalidArgument("llama.cpp cannot apply the chat template of model '" + path_ +
                              "'; pass prompts as plain strings");
    }
    buf.resize(static_cast<size_t>(n));
    return buf;
}

}  // namespace fastpar
