// The text of one generation: the bytes of its tokens, the stop strings that end it, and
// the pieces streamed as it grows (valid UTF-8, never the start of a possible stop
// string), which add up to the final text exactly (tests/test_text_stream.py).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fastpar {

class TextStream {
public:
    // Starts a new text; `streaming`: its pieces are taken (next_piece), and the final
    // text is what they add up to.
    void reset(bool streaming);

    // Appends one token's bytes. When that completes one of `stops`, the text is cut
    // before the earliest stop string and true is returned: the generation ends.
    bool append(const std::string & piece, const std::vector<std::string> & stops);

    // The text not yet streamed that can be shown now, sanitised: all of it when `final`,
    // else without an incomplete UTF-8 character at the end or a suffix that may begin one
    // of `stops`. Empty when there is nothing new.
    std::string next_piece(const std::vector<std::string> & stops, bool final);

    // The final text (the streamed pieces joined, or the whole text sanitised), once.
    std::string take_text();

    const std::string & bytes() const { return bytes_; }

private:
    std::string bytes_;     // generated text so far, raw bytes
    size_t n_emitted_ = 0;  // bytes of bytes_ already streamed
    std::string emitted_;   // the text streamed so far (sanitised)
    bool streaming_ = false;
};

}  // namespace fastpar
