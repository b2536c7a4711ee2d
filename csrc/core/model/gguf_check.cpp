#include "core/model/gguf_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/base/errors.hpp"
#include "ggml.h"
#include "gguf.h"

namespace fastpar {
namespace {

// llama.cpp's limits (src/llama-hparams.h): its per-layer arrays have this many entries.
constexpr uint32_t kMaxLayers = 512;
constexpr uint32_t kMaxExperts = 1024;

struct GgufFree {
    void operator()(gguf_context * g) const { gguf_free(g); }
};

class Checker {
public:
    Checker(const gguf_context * g, const std::string & path) : g_(g), path_(path) {}

    [[noreturn]] void fail(const std::string & what) const {
        throw ModelLoadError("model '" + path_ + "' is malformed: " + what);
    }

    // A UINT32 value as llama.cpp reads it; -1 when absent or of another type (llama.cpp
    // then reports the missing key or the wrong type itself).
    int64_t u32(const std::string & key) const {
        const int64_t id = gguf_find_key(g_, key.c_str());
        if (id < 0 || gguf_get_kv_type(g_, id) != GGUF_TYPE_UINT32) {
            return -1;
        }
        return gguf_get_val_u32(g_, id);
    }

    // A per-layer value, as llama.cpp reads it: one UINT32 for every layer, or a UINT32
    // array of `n` entries; empty when absent or of another shape or type.
    std::vector<int64_t> per_layer(const std::string & key, uint32_t n) const {
        const int64_t id = gguf_find_key(g_, key.c_str());
        if (id >= 0 && gguf_get_kv_type(g_, id) == GGUF_TYPE_ARRAY && gguf_get_arr_type(g_, id) == GGUF_TYPE_UINT32 &&
            gguf_get_arr_n(g_, id) == n) {
            const auto * v = static_cast<const uint32_t *>(gguf_get_arr_data(g_, id));
            return std::vector<int64_t>(v, v + n);
        }
        const int64_t v = u32(key);
        return v < 0 ? std::vector<int64_t>() : std::vector<int64_t>(n, v);
    }

    int64_t u32_max(const std::string & key, uint32_t n) const {
        const std::vector<int64_t> v = per_layer(key, n);
        return v.empty() ? -1 : *std::max_element(v.begin(), v.end());
    }

    // Grouped-query attention shares each K/V head among head_count / head_count_kv query
    // heads; ggml asserts at the first decode that the division is exact.
    void heads(const std::string & p, uint32_t n_layer) const {
        const std::vector<int64_t> q = per_layer(p + "attention.head_count", n_layer);
        std::vector<int64_t> kv = per_layer(p + "attention.head_count_kv", n_layer);
        if (q.empty() || kv.empty()) {
            return;  // head_count_kv defaults to head_count
        }
        for (uint32_t il = 0; il < n_layer; ++il) {
            if (q[il] > 0 && kv[il] > 0 && q[il] % kv[il] != 0) {
                fail(p + "attention.head_count_kv is " + std::to_string(kv[il]) + " (layer " + std::to_string(il) +
                     "), which does not divide " + p + "attention.head_count (" + std::to_string(q[il]) + ")");
            }
        }
    }

    void hyperparameters(const std::string & arch) {
        const std::string p = arch + ".";
        const int64_t n_layer = u32(p + "block_count");
        if (n_layer == 0 || n_layer > kMaxLayers) {
            fail(p + "block_count is " + std::to_string(n_layer) + "; llama.cpp supports 1 to " +
                 std::to_string(kMaxLayers) + " layers");
        }
        if (n_layer < 0) {
            return;  // llama.cpp reports the missing or mistyped key
        }
        for (const char * key : {"nextn_predict_layers", "posnet.block_count", "convnext.block_count"}) {
            const int64_t v = u32(p + key);
            if (v > n_layer) {
                fail(p + key + " is " + std::to_string(v) + ", more than " + p + "block_count (" +
                     std::to_string(n_layer) + ")");
            }
        }
        experts(p, static_cast<uint32_t>(n_layer), arch);
        heads(p, static_cast<uint32_t>(n_layer));
        const int64_t rs = gguf_find_key(g_, (p + "rope.scaling.type").c_str());
        if (rs >= 0 && gguf_get_kv_type(g_, rs) == GGUF_TYPE_STRING) {
            const std::string v = gguf_get_val_str(g_, rs);
            if (v != "none" && v != "linear" && v != "yarn" && v != "longrope") {
                fail(p + "rope.scaling.type is '" + v + "'; llama.cpp knows none, linear, yarn and longrope");
            }
        }
        // Every epsilon of a normalisation (layer_norm_epsilon, layer_norm_rms_epsilon,
        // group_norm_epsilon, ...): ggml asserts eps >= 0 when it normalises.
        for (int64_t id = 0; id < gguf_get_n_kv(g_); ++id) {
            const std::string key = gguf_get_key(g_, id);
            if (key.compare(0, p.size(), p) != 0) {
                continue;
            }
            if (key.find("epsilon") == std::string::npos) {
                continue;
            }
            const gguf_type t = gguf_get_kv_type(g_, id);
            if (t == GGUF_TYPE_FLOAT32) {
                epsilon(key, gguf_get_val_f32(g_, id));
            } else if (t == GGUF_TYPE_ARRAY && gguf_get_arr_type(g_, id) == GGUF_TYPE_FLOAT32) {
                const auto * v = static_cast<const float *>(gguf_get_arr_data(g_, id));
                for (size_t i = 0; i < gguf_get_arr_n(g_, id); ++i) {
                    epsilon(key + "[" + std::to_string(i) + "]", v[i]);
                }
            }
        }
    }

    void epsilon(const std::string & key, float v) const {
        if (!std::isfinite(v) || v < 0.0f) {
            fail(key + " is " + std::to_string(v) + "; an epsilon must be a finite number >= 0");
        }
    }

    // The expert counts llama.cpp asserts on (llama_model::load_hparams).
    void experts(const std::string & p, uint32_t n_layer, const std::string & arch) const {
        int64_t n_expert = std::max<int64_t>(u32(p + "expert_count"), 0);
        int64_t n_used = std::max<int64_t>(u32_max(p + "expert_used_count", n_layer), 0);
        const int64_t n_groups = std::max<int64_t>(u32(p + "expert_group_count"), 0);
        const int64_t n_group_used = std::max<int64_t>(u32(p + "expert_group_used_count"), 0);
        if ((arch == "hunyuan-dense" || arch == "hunyuan_vl") && n_expert <= 1) {
            n_expert = n_used = 0;  // llama.cpp ignores one expert in these
        }
        const std::string counts = " (" + p + "expert_count " + std::to_string(n_expert) + ", expert_used_count " +
                                   std::to_string(n_used) + ", expert_group_count " + std::to_string(n_groups) +
                                   ", expert_group_used_count " + std::to_string(n_group_used) + ")";
        if (n_expert > kMaxExperts) {
            fail(p + "expert_count is above llama.cpp's " + std::to_string(kMaxExperts) + counts);
        }
        if (n_used > n_expert) {
            fail("more experts used per token than the model has" + counts);
        }
        if (n_expert > 0) {
            if (n_used == 0) {
                fail("the model has experts but uses none per token" + counts);
            }
            if (n_groups >= n_expert) {
                fail("as many expert groups as experts, or more" + counts);
            }
            if (n_groups > 1 && (n_expert % n_groups != 0 || n_group_used == 0 || n_group_used >= n_groups)) {
                fail("expert groups that do not divide the experts, or that are all or none used" + counts);
            }
        } else if (n_groups != 0) {
            fail("expert groups without experts" + counts);
        }
    }

    // Tensor types ggml cannot compute with where llama.cpp puts them. A norm or a bias is
    // an operand of an element-wise op beside F32 activations: ggml's CPU backend aborts
    // unless it is F32 (llama.cpp's converters always write these as F32). Integer types
    // and F64 have no dot product in ggml's CPU backend (a matrix product with one
    // segfaults); llama.cpp uses them only for lookup tables (*tid2eid*). Q8_1 and Q8_K
    // are ggml's scratch formats, without a dot product of their own.
    void tensors() const {
        for (int64_t i = 0; i < gguf_get_n_tensors(g_); ++i) {
            const std::string name = gguf_get_tensor_name(g_, i);
            const ggml_type type = gguf_get_tensor_type(g_, i);
            const int64_t * ne = gguf_get_tensor_ne(g_, i);
            const bool vector = ne[1] == 1 && ne[2] == 1 && ne[3] == 1;
            const bool elementwise = name.size() >= 5 && (name.compare(name.size() - 5, 5, ".bias") == 0 ||
                                                         (name.size() >= 11 &&
                                                          name.compare(name.size() - 11, 11, "norm.weight") == 0));
            if (vector && elementwise && type != GGML_TYPE_F32) {
                fail("tensor '" + name + "' has type " + ggml_type_name(type) +
                     "; a norm or bias vector must be f32");
            }
            const bool integer = type == GGML_TYPE_I8 || type == GGML_TYPE_I16 || type == GGML_TYPE_I32 ||
                                 type == GGML_TYPE_I64 || type == GGML_TYPE_F64;
            if ((integer && name.find("tid2eid") == std::string::npos) || type == GGML_TYPE_Q8_1 ||
                type == GGML_TYPE_Q8_K) {
                fail("tensor '" + name + "' has type " + ggml_type_name(type) +
                     ", which ggml cannot multiply with activations");
            }
        }
    }

    void vocabulary() const {
        const int64_t m = gguf_find_key(g_, "tokenizer.ggml.model");
        if (m >= 0 && gguf_get_kv_type(g_, m) == GGUF_TYPE_STRING) {
            const std::string model = gguf_get_val_str(g_, m);
            if (model == "none" || model == "no_vocab") {
                fail("tokenizer.ggml.model is '" + model + "': the model has no tokenizer to read prompts with");
            }
        }
        // llama.cpp maps each token text to its id and asserts that no text repeats (an
        // empty text becomes "[EMPTY_<id>]" first).
        const int64_t t = gguf_find_key(g_, "tokenizer.ggml.tokens");
        if (t < 0 || gguf_get_kv_type(g_, t) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g_, t) != GGUF_TYPE_STRING) {
            return;
        }
        const size_t n = gguf_get_arr_n(g_, t);
        std::unordered_set<std::string> seen;
        seen.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            std::string text = gguf_get_arr_str(g_, t, i);
            if (text.empty()) {
                text = "[EMPTY_" + std::to_string(i) + "]";
            }
            if (!seen.insert(std::move(text)).second) {
                std::string shown = gguf_get_arr_str(g_, t, i);
                if (shown.size() > 40) {
                    shown = shown.substr(0, 40) + "...";
                }
                fail("tokenizer.ggml.tokens lists the text '" + shown + "' twice (again as token " +
                     std::to_string(i) + ")");
            }
        }
    }

private:
    const gguf_context * g_;
    const std::string & path_;
};

// Walks the file's header up to its tensor infos, checking each type field against its
// enum's range. gguf reads these fields straight into `enum gguf_type` / `enum ggml_type`
// and checks the range afterwards; a value outside the enum's range is undefined
// behaviour in C++ before that check runs (UBSan reports it), so such files stop here.
// Anything else this walk does not understand ends it quietly: gguf reports it.
class TypeScan {
public:
    explicit TypeScan(const std::string & path) : path_(path), f_(std::fopen(path.c_str(), "rb")) {}
    ~TypeScan() {
        if (f_ != nullptr) {
            std::fclose(f_);
        }
    }
    TypeScan(const TypeScan &) = delete;
    TypeScan & operator=(const TypeScan &) = delete;

    void run() {
        char magic[4];
        uint32_t version = 0;
        uint64_t n_tensors = 0;
        uint64_t n_kv = 0;
        if (f_ == nullptr || std::fread(magic, 1, 4, f_) != 4 || std::string(magic, 4) != "GGUF" || !get(version) ||
            (version != 2 && version != 3) || !get(n_tensors) || !get(n_kv)) {
            return;
        }
        for (uint64_t i = 0; i < n_kv; ++i) {
            std::string key;
            uint32_t type = 0;
            if (!string(&key) || !get(type)) {
                return;
            }
            uint64_t n = 1;
            if (type == GGUF_TYPE_ARRAY) {
                if (!get(type) || !get(n)) {
                    return;
                }
            }
            if (type >= GGUF_TYPE_COUNT || type == GGUF_TYPE_ARRAY) {
                fail("key '" + key + "' has invalid value type " + std::to_string(type));
            }
            if (!skip_values(type, n)) {
                return;
            }
        }
        for (uint64_t i = 0; i < n_tensors; ++i) {
            std::string name;
            uint32_t n_dims = 0;
            uint32_t type = 0;
            if (!string(&name) || !get(n_dims) || n_dims > GGML_MAX_DIMS ||
                std::fseek(f_, static_cast<long>(8 * n_dims), SEEK_CUR) != 0 || !get(type)) {
                return;
            }
            if (type >= GGML_TYPE_COUNT) {
                fail("tensor '" + name + "' has invalid ggml type " + std::to_string(type));
            }
            uint64_t offset = 0;
            if (!get(offset)) {
                return;
            }
        }
    }

private:
    [[noreturn]] void fail(const std::string & what) const {
        throw ModelLoadError("model '" + path_ + "' is malformed: " + what);
    }
    template <typename T> bool get(T & v) { return std::fread(&v, sizeof v, 1, f_) == 1; }
    // A gguf string: its length, then its bytes (kept only when `out` is given).
    bool string(std::string * out) {
        uint64_t len = 0;
        if (!get(len) || len > (uint64_t{1} << 30)) {
            return false;
        }
        if (out == nullptr) {
            return std::fseek(f_, static_cast<long>(len), SEEK_CUR) == 0;
        }
        out->resize(len);
        return len == 0 || std::fread(&(*out)[0], 1, len, f_) == len;
    }
    bool skip_values(uint32_t type, uint64_t n) {
        if (type == GGUF_TYPE_STRING) {
            for (uint64_t j = 0; j < n; ++j) {
                if (!string(nullptr)) {
                    return false;
                }
            }
            return true;
        }
        uint64_t size = 0;
        switch (type) {
            case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: size = 1; break;
            case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: size = 2; break;
            case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: size = 4; break;
            case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: size = 8; break;
            default: return false;
        }
        return size > 0 && n <= (uint64_t{1} << 40) / size &&
               std::fseek(f_, static_cast<long>(n * size), SEEK_CUR) == 0;
    }

    const std::string & path_;
    FILE * f_;
};

}  // namespace

void check_gguf(const std::string & path) {
    TypeScan(path).run();
    gguf_init_params gp{};
    gp.no_alloc = true;
    std::unique_ptr<gguf_context, GgufFree> g(gguf_init_from_file(path.c_str(), gp));
    if (!g) {
        return;  // llama.cpp says what is wrong with the file
    }
    Checker check(g.get(), path);
    const int64_t a = gguf_find_key(g.get(), "general.architecture");
    if (a >= 0 && gguf_get_kv_type(g.get(), a) == GGUF_TYPE_STRING) {
        check.hyperparameters(gguf_get_val_str(g.get(), a));
    }
    check.tensors();
    check.vocabulary();
}

bool has_classification_head(const std::string & path) {
    gguf_init_params gp{};
    gp.no_alloc = true;
    std::unique_ptr<gguf_context, GgufFree> g(gguf_init_from_file(path.c_str(), gp));
    if (!g) {
        return true;  // the file has loaded, so its header is given the benefit of the doubt
    }
    return gguf_find_tensor(g.get(), "cls.weight") >= 0 || gguf_find_tensor(g.get(), "cls.output.weight") >= 0;
}

}  // namespace fastpar
