// UTF-8 and stop-string helpers: pure functions over bytes, no llama.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fastpar {

// Length of the longest prefix of `s` that does not end inside an incomplete (but so far
// valid) multibyte sequence: what can be shown now while more bytes may still come.
size_t utf8_complete_prefix(const std::string & s);

// `s` with every invalid or incomplete UTF-8 sequence replaced by U+FFFD.
std::string utf8_sanitize(const std::string & s);

// Position of the earliest match of any of `stops` in `s` that ends at or after
// `from_end` (earlier matches were already checked), or std::string::npos.
size_t find_stop(const std::string & s, const std::vector<std::string> & stops, size_t from_end);

// Length of the longest suffix of `s` that is a proper prefix of one of `stops`: bytes
// a stream must hold back because a stop string may be completing.
size_t stop_prefix_suffix(const std::string & s, const std::vector<std::string> & stops);

}  // namespace fastpar
