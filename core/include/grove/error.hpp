// Errors that reach the user. Each carries a ready-to-print message (what, where, how to fix) and
// the kind that decides the process exit code; no stack traces for user mistakes.
#pragma once

#include <stdexcept>
#include <string>

namespace grove {

// Exit codes of the `grove` program (documented in docs/cli.md).
enum class ErrorKind : int {
    runtime = 1,   // a run failed (I/O, numerical, ...)
    usage = 2,     // bad command line
    manifest = 3,  // the manifest or an override is invalid
    plugin = 4,    // a plugin could not be loaded, configured or created, or failed a call
    input = 5,     // a model, tokenizer or data file is missing or invalid
};

class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
    ErrorKind kind() const noexcept { return kind_; }
    int exit_code() const noexcept { return static_cast<int>(kind_); }

private:
    ErrorKind kind_;
};

}  // namespace grove
