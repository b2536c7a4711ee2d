// A GGUF file's metadata checked for the values llama.cpp does not report as an error but
// asserts on (GGML_ASSERT / GGML_ABORT), which kills the whole process: while loading, or
// at the first decode. Everything llama.cpp reports itself is left to it.
#pragma once

#include <string>

namespace fastpar {

// Throws ModelLoadError naming the key (or tensor) and its value when the model at `path`
// has one of the defects below. A file gguf cannot parse passes: llama.cpp then says what
// is wrong with it.
//  - <arch>.block_count 0 or above llama.cpp's 512 layers; nextn_predict_layers, posnet or
//    convnext block counts above block_count;
//  - expert counts that contradict each other (experts used but none present, more used
//    than present, groups that do not divide the experts, ...);
//  - a normalisation epsilon that is negative, NaN or infinite;
//  - an unknown rope.scaling.type;
//  - a vector (1-D tensor: a norm or a bias) that is not F32, or a matrix of a type ggml's
//    CPU backend has no dot product for (integer types, F64, Q8_1, Q8_K);
//  - no tokenizer (tokenizer.ggml.model "none" / "no_vocab"), or a vocabulary that lists
//    one token text twice;
//  - a value type or a tensor type outside its enum (gguf reads it into the enum before
//    checking the range: undefined behaviour).
void check_gguf(const std::string & path);

// Whether the model at `path` holds a classification head (llama.cpp's "cls" or "cls.output"
// tensor), which rank pooling scores with. Without one llama.cpp's rank graph returns a hidden
// state's first value as every score, silently. Read at a rank context's creation only: a
// header read costs ~14 ms on the default model.
bool has_classification_head(const std::string & path);

}  // namespace fastpar
