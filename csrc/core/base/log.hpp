// llama.cpp's log, routed through fastpar: quiet unless FASTPAR_VERBOSE is set, and the
// last error line of the calling thread kept so that failures can say what went wrong.
#pragma once

#include <string>

namespace fastpar {

// Initialises llama.cpp's backends and installs the log hook; safe to call many times
// from many threads (the work happens once).
void backend_init();

// The errors llama.cpp logged on this thread since clear_last_llama_error(), joined by "; ".
std::string last_llama_error();
void clear_last_llama_error();

}  // namespace fastpar
