// Small text helpers shared by the manifest and the plugin host.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace grove {

// The candidate closest to `word` by edit distance, if it is close enough to be a plausible typo;
// empty otherwise. Used for "did you mean" hints.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

// ", did you mean 'x'?" or "" — appended to unknown-name messages.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& items, const std::string& separator);

// A tensor's shape as errors print it: "[32, 64]".
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace grove
