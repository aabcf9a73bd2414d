// Every TOML text Grove parses (manifests, --set values, plugin configurations) goes through here.
// Debian's toml++ 3.3 reaches undefined behaviour (an "unreachable" branch in its Unicode
// whitespace test) wherever it tests a non-ASCII character for whitespace: outside strings and
// comments, where TOML allows none anyway, and in two places of multi-line basic strings (the
// character after a backslash, and the first one after a line-ending backslash; fixed upstream
// only in 2026). Such a character is refused first, with its line and column and the fix, and the
// parser never sees it; any other UTF-8 in strings and comments is kept.
#pragma once

#include <string>
#include <string_view>
#include <toml++/toml.h>

namespace grove {

// toml::parse, after the check above; both throw toml::parse_error with the position.
toml::table parse_toml(std::string_view text, std::string_view source_name);

}  // namespace grove
