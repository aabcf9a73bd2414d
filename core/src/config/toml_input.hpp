// Every TOML text Grove parses (manifests, --set values, plugin configurations) goes through here.
// Debian's toml++ 3.3 reaches undefined behaviour (an "unreachable" branch in its Unicode
// whitespace test) on a non-ASCII character outside strings and comments, where TOML allows none
// anyway; such a character is refused first, with its line and column, and the parser never sees it.
#pragma once

#include <string>
#include <string_view>
#include <toml++/toml.h>

namespace grove {

// toml::parse, after the check above; both throw toml::parse_error with the position.
toml::table parse_toml(std::string_view text, std::string_view source_name);

}  // namespace grove
