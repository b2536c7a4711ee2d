#include "core/loop/text_stream.hpp"

#include <algorithm>
#include <utility>

#include "core/base/text.hpp"

namespace fastpar {

void TextStream::reset(bool streaming) {
    bytes_.clear();
    n_emitted_ = 0;
    emitted_.clear();
    streaming_ = streaming;
}

bool TextStream::append(const std::string & piece, const std::vector<std::string> & stops) {
    const size_t before = bytes_.size();
    bytes_ += piece;
    if (stops.empty()) {
        return false;
    }
    const size_t at = find_stop(bytes_, stops, before);
    if (at == std::string::npos) {
        return false;
    }
    bytes_.resize(at);
    return true;
}

std::string TextStream::next_piece(const std::vector<std::string> & stops, bool final) {
    size_t upto = bytes_.size();
    if (!final) {
        upto = utf8_complete_prefix(bytes_);
        upto = std::min(upto, bytes_.size() - stop_prefix_suffix(bytes_, stops));
    }
    if (upto <= n_emitted_) {
        return std::string();
    }
    std::string piece = utf8_sanitize(bytes_.substr(n_emitted_, upto - n_emitted_));
    n_emitted_ = upto;
    emitted_ += piece;
    return piece;
}

std::string TextStream::take_text() {
    std::string text = streaming_ ? std::move(emitted_) : utf8_sanitize(bytes_);
    reset(false);
    return text;
}

}  // namespace fastpar
