// The three string helpers of llama.cpp's common.h that its JSON-schema converter calls.
// They live in common.cpp, which would bring the rest of llama.cpp's common library
// (chat templates, downloads, argument parsing) into libfastpar with it.
#include <string>
#include <vector>

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
