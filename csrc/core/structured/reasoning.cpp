#include "core/structured/reasoning.hpp"

#include <cstring>

namespace fastpar {
namespace {

const char * const kBlanks = " \t\r\n";

}  // namespace

bool opens_thought(const std::string & prompt) {
    const size_t end = prompt.find_last_not_of(kBlanks);
    const size_t n = std::strlen(kThoughtOpen);
    return end != std::string::npos && end + 1 >= n && prompt.compare(end + 1 - n, n, kThoughtOpen) == 0;
}

std::string close_thought(const std::string & prompt) {
    return prompt + (opens_thought(prompt) ? "\n\n" : std::string(kThoughtOpen) + "\n\n") + kThoughtClose + "\n\n";
}

std::string reasoning_grammar(const std::string & answer, bool opened) {
    // The thought: text in which </think> does not occur, as the states of matching it
    // (fastpar-thought-k: its first k characters just read; '<' restarts the match, a
    // character that breaks it returns to the start). It may end in any state.
    const std::string close = kThoughtClose;
    std::string g = answer;
    if (!g.empty() && g.back() != '\n') {
        g += '\n';
    }
    const auto state = [](size_t k) { return "fastpar-thought-" + std::to_string(k); };
    for (size_t k = 0; k < close.size(); ++k) {
        const char c = close[k];
        g += state(k) + " ::= (";
        if (k == 0) {
            g += " [^<] " + state(0) + " | \"<\" " + state(1);
        } else {
            g += " [^<" + std::string(1, c) + "] " + state(0) + " | \"<\" " + state(1);
            if (k + 1 < close.size()) {
                g += " | \"" + std::string(1, c) + "\" " + state(k + 1);
            }
        }
        g += " )?\n";
    }
    const std::string thought = state(0) + " \"" + close + "\" [ \\t\\r\\n]{0,8}";
    g += std::string(kReasonedRoot) + " ::= " +
         (opened ? thought : "( \"" + std::string(kThoughtOpen) + "\" " + thought + " )?") + " root\n";
    return g;
}

std::string split_thought(std::string & text, bool opened) {
    size_t start = 0;
    if (!opened) {
        start = text.find_first_not_of(kBlanks);
        if (start == std::string::npos || text.compare(start, std::strlen(kThoughtOpen), kThoughtOpen) != 0) {
            return "";
        }
        start += std::strlen(kThoughtOpen);
    }
    const size_t end = text.find(kThoughtClose, start);
    std::string thought = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (end == std::string::npos) {
        text.clear();
    } else {
        const size_t answer = text.find_first_not_of(kBlanks, end + std::strlen(kThoughtClose));
        text = answer == std::string::npos ? "" : text.substr(answer);
    }
    const size_t a = thought.find_first_not_of(kBlanks);
    return a == std::string::npos ? "" : thought.substr(a, thought.find_last_not_of(kBlanks) - a + 1);
}

}  // namespace fastpar
