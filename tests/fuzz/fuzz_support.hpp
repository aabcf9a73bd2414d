// What every fuzz target shares: the input as a file (the parsers read paths, as Grove does), and
// the rule that decides a finding. A grove::Error is the expected answer to a bad file; any other
// exception would reach the user as "internal error" with no file named, so it aborts as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace grove_fuzz {

// A folder of this process in tmpfs, made once and emptied by the caller's writes.
const std::string& work_dir();
// Writes `size` bytes to work_dir()/name and returns the path.
std::string write_input(const std::string& name, const uint8_t* data, size_t size);
// Runs `parse`; returns normally for success or grove::Error, aborts on any other exception.
void expect_clean_outcome(const char* target, const std::function<void()>& parse);

}  // namespace grove_fuzz
