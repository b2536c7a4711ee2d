// What the C++ bench tools (reducer_ops.cpp, decode_steps.cpp) share: a comma-separated
// list argument, a clock and a median.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace fastpar_bench {

// "1,8,32" -> {1, 8, 32}.
inline std::vector<int64_t> int_list(const std::string & spec) {
    std::vector<int64_t> out;
    for (size_t pos = 0; pos <= spec.size();) {
        const size_t end = std::min(spec.find(',', pos), spec.size());
        out.push_back(std::atoll(spec.substr(pos, end - pos).c_str()));
        pos = end + 1;
    }
    return out;
}

inline double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The middle value (the upper one of an even count); 0 for none.
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace fastpar_bench
