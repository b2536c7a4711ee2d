// The helpers of llama.cpp's common.h (and its logger, log.h) that its JSON-schema
// converter and chat library call. They live in common.cpp and log.cpp, which would bring
// the rest of llama.cpp's common library (sampling, downloads, argument parsing) and a
// logging thread into libfastpar with them. The chat library's warnings and errors go to
// stderr under FASTPAR_VERBOSE, as llama.cpp's own log lines do.
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include <cstdlib>
#include "llama.h"
#include "log.h"

std::string string_join(const std::vector<std::string> & values, const std::string & separator) {
    std::string out;
    for (size_t i = 0; i < values.size(); ++i) {
        if (i > 0) {
            out += separator;
        }
        out += values[i];
    }
    return out;
}

std::vector<std::string> string_split(const std::string & str, const std::string & delimiter) {
    std::vector<std::string> parts;
    if (delimiter.empty()) {
        return {str};
    }
    size_t start = 0;
    for (size_t at = str.find(delimiter); at != std::string::npos; at = str.find(delimiter, start)) {
        parts.push_back(str.substr(start, at - start));
        start = at + delimiter.size();
    }
    parts.push_back(str.substr(start));
    return parts;
}

std::string string_repeat(const std::string & str, size_t n) {
    std::string out;
    out.reserve(str.size() * n);
    for (size_t i = 0; i < n; ++i) {
        out += str;
    }
    return out;
}

void string_replace_all(std::string & s, const std::string & search, const std::string & replace) {
    if (search.empty()) {
        return;
    }
    std::string out;
    size_t pos = 0;
    for (size_t at = s.find(search); at != std::string::npos; at = s.find(search, pos)) {
        out.append(s, pos, at - pos);
        out += replace;
        pos = at + search.size();
    }
    out.append(s, pos, std::string::npos);
    s = std::move(out);
}

std::vector<llama_token> common_tokenize(const llama_vocab * vocab, const std::string & text, bool add_special,
                                         bool parse_special) {
    std::vector<llama_token> tokens(text.size() + 2);
    int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                               static_cast<int32_t>(tokens.size()), add_special, parse_special);
    if (n < 0 && n != INT32_MIN) {
        tokens.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                           static_cast<int32_t>(tokens.size()), add_special, parse_special);
    }
    tokens.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return tokens;
}

std::string common_token_to_piece(const llama_vocab * vocab, llama_token token, bool special) {
    std::string piece(64, '\0');
    int32_t n = llama_token_to_piece(vocab, token, piece.data(), static_cast<int32_t>(piece.size()), 0, special);
    if (n < 0 && n != INT32_MIN) {
        piece.resize(static_cast<size_t>(-n));
        n = llama_token_to_piece(vocab, token, piece.data(), static_cast<int32_t>(piece.size()), 0, special);
    }
    piece.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return piece;
}

struct common_log {};

common_log * common_log_main() {
    static common_log log;
    return &log;
}

// Debug lines (LOG_DBG) check this first: none are formatted.
int common_log_get_verbosity_thold() { return -1; }

void common_log_add(common_log *, ggml_log_level level, const char * fmt, ...) {
    const char * verbose = std::getenv("FASTPAR_VERBOSE");
    if ((level != GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_ERROR) || verbose == nullptr || verbose[0] == '\0' ||
        verbose[0] == '0') {
        return;
    }
    va_list args;
    va_start(args, fmt);
    std::vfprintf(stderr, fmt, args);
    va_end(args);
}
