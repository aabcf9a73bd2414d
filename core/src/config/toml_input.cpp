#include "config/toml_input.hpp"

#include <memory>

namespace grove {

namespace {
// Line and column (in characters, from 1) of byte `offset`.
toml::source_position position_of(std::string_view text, size_t offset) {
    toml::source_position at{1, 1};
    for (size_t k = 0; k < offset; ++k) {
        if (text[k] == '\n')
            at.line++, at.column = 1;
        else if ((static_cast<unsigned char>(text[k]) & 0xC0) != 0x80)  // not a UTF-8 continuation byte
            at.column++;
    }
    return at;
}

// Throws at the first byte >= 0x80 that is neither in a string nor in a comment.
void require_ascii_outside_strings(std::string_view text, std::string_view source_name) {
    enum class In { code, comment, basic, literal, multiline_basic, multiline_literal } in = In::code;
    auto starts = [&](size_t i, const char* token) { return text.substr(i, 3) == token; };
    for (size_t i = 0; i < text.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        switch (in) {
            case In::code:
                if (c == '#') {
                    in = In::comment;
                } else if (c == '"') {
                    in = starts(i, "\"\"\"") ? (i += 2, In::multiline_basic) : In::basic;
                } else if (c == '\'') {
                    in = starts(i, "'''") ? (i += 2, In::multiline_literal) : In::literal;
                } else if (c >= 0x80) {
                    const toml::source_position at = position_of(text, i);
                    throw toml::parse_error(
                        "a non-ASCII character outside a string; TOML keys and values other than strings are ASCII "
                        "(quote the key: \"name\" = ...)",
                        toml::source_region{at, at, std::make_shared<const std::string>(source_name)});
                }
                break;
            case In::comment:
                if (c == '\n') in = In::code;
                break;
            case In::basic:
                if (c == '\\')
                    ++i;
                else if (c == '"' || c == '\n')  // an unterminated string is the parser's error to report
                    in = In::code;
                break;
            case In::literal:
                if (c == '\'' || c == '\n') in = In::code;
                break;
            case In::multiline_basic:
                if (c == '\\')
                    ++i;
                else if (starts(i, "\"\"\""))
                    i += 2, in = In::code;
                break;
            case In::multiline_literal:
                if (starts(i, "'''")) i += 2, in = In::code;
                break;
        }
    }
}
}  // namespace

toml::table parse_toml(std::string_view text, std::string_view source_name) {
    require_ascii_outside_strings(text, source_name);
    return toml::parse(text, source_name);
}

}  // namespace grove
