#include "core/base/text.hpp"

#include <algorithm>

namespace fastpar {
namespace {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), 0 if invalid there, or
// -(bytes present) if it is a valid but truncated start at the end of `s`.
int utf8_seq_len(const std::string & s, size_t i) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (b0 < 0x80) {
        return 1;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
        if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return 0;
    }
    for (int k = 1; k < len; ++k) {
        if (i + k >= s.size()) {
            return -k;
        }
        const auto b = static_cast<unsigned char>(s[i + k]);
        const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            return 0;
        }
    }
    return len;
}

}  // namespace

size_t utf8_complete_prefix(const std::string & s) {
    // An incomplete sequence is at most 3 bytes: look only at the tail.
    const size_t start = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t i = start; i < s.size(); ++i) {
        const auto b = static_cast<unsigned char>(s[i]);
        if ((b & 0xC0) == 0x80) {
            continue;  // continuation byte: belongs to an earlier start
        }
        if (utf8_seq_len(s, i) < 0) {
            return i;
        }
    }
    return s.size();
}

std::string utf8_sanitize(const std::string & s) {
    static const char kReplacement[] = "\xEF\xBF\xBD";
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const int len = utf8_seq_len(s, i);
        if (len > 0) {
            out.append(s, i, static_cast<size_t>(len));
            i += static_cast<size_t>(len);
        } else {
            out += kReplacement;
            // Skip the maximal invalid prefix: one byte, or a truncated start plus its tail.
            i += len < 0 ? static_cast<size_t>(-len) : 1;
        }
    }
    return out;
}

size_t find_stop(const std::string & s, const std::vector<std::string> & stops, size_t from_end) {
    size_t best = std::string::npos;
    for (const auto & stop : stops) {
        if (stop.empty() || stop.size() > s.size()) {
            continue;
        }
        // A new match must end after from_end: it starts at or after from_end - size + 1.
        const size_t begin = from_end >= stop.size() ? from_end - stop.size() + 1 : 0;
        const size_t pos = s.find(stop, begin);
        if (pos != std::string::npos) {
            best = std::min(best, pos);
        }
    }
    return best;
}

size_t stop_prefix_suffix(const std::string & s, const std::vector<std::string> & stops) {
    size_t best = 0;
    for (const auto & stop : stops) {
        if (stop.empty()) {
            continue;
        }
        for (size_t len = std::min(stop.size() - 1, s.size()); len > best; --len) {
            if (s.compare(s.size() - len, len, stop, 0, len) == 0) {
                best = len;
                break;
            }
        }
    }
    return best;
}

}  // namespace fastpar
