// Exceptions the engine throws. The bindings map each to the error a user expects:
// InvalidArgument -> ValueError / FASTPAR_ERR_INVALID_ARGUMENT,
// FileNotFound -> FileNotFoundError / FASTPAR_ERR_NOT_FOUND,
// ModelLoadError -> fastpar.ModelLoadError / FASTPAR_ERR_MODEL_LOAD,
// Error (anything else the engine cannot do) -> fastpar.FastparError / FASTPAR_ERR_RUNTIME,
// Interrupted (the caller's interrupt check fired) -> the caller's own error.
#pragma once

#include <stdexcept>
#include <string>

namespace fastpar {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct ModelLoadError : Error {
    using Error::Error;
};

struct FileNotFound : Error {
    using Error::Error;
};

struct InvalidArgument : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

struct Interrupted : Error {
    Interrupted() : Error("generation interrupted") {}
};

}  // namespace fastpar
