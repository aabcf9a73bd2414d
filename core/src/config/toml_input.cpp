#include "config/toml_input.hpp"

#include <memory>
#include <vector>

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

[[noreturn]] void refuse(std::string_view text, size_t offset, std::string_view source_name, const char* why) {
    const toml::source_position at = position_of(text, offset);
    throw toml::parse_error(why, toml::source_region{at, at, std::make_shared<const std::string>(source_name)});
}

bool is_ascii(char c) { return static_cast<unsigned char>(c) < 0x80; }
bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }  // a line break is not blank here

// Where a quote opens a string. A quote elsewhere is part of a malformed token that toml++ reads
// character by character (`x = 1'2é` is one value token), so what follows it is not in a string.
// Exact for valid TOML; on invalid TOML toml++ stops at the first error, before it could disagree.
class StringStarts {
public:
    bool opens_string() const { return expect_ != Expect::other; }
    void after_string() { expect_ = Expect::other; }

    // A character outside strings and comments that is not blank.
    void see(char c) {
        const bool top_level = open_.empty();
        switch (c) {
            case '\n':  // inside an array or an inline table a line break changes nothing
                if (top_level) expect_ = Expect::key, in_key_ = true;
                break;
            case '=':
                expect_ = in_key_ ? Expect::value : Expect::other, in_key_ = false;
                break;
            case '.':  // a dotted key's next part; in a value, a float's point
                expect_ = in_key_ ? Expect::key : Expect::other;
                break;
            case '[':
                if (expect_ == Expect::value)
                    open_.push_back(Container::array);
                else if (!(expect_ == Expect::key && top_level))  // else a table header: a key follows
                    expect_ = Expect::other;
                break;
            case '{':
                if (expect_ == Expect::value)
                    open_.push_back(Container::inline_table), expect_ = Expect::key, in_key_ = true;
                else
                    expect_ = Expect::other;
                break;
            case ',':
                if (top_level)
                    expect_ = Expect::other;
                else if (open_.back() == Container::array)
                    expect_ = Expect::value;
                else
                    expect_ = Expect::key, in_key_ = true;
                break;
            case ']':
            case '}':
                if (!top_level && open_.back() == (c == ']' ? Container::array : Container::inline_table)) open_.pop_back();
                expect_ = Expect::other;
                break;
            default:
                expect_ = Expect::other;
        }
    }

private:
    enum class Expect { key, value, other };  // what may begin here: a key's part, a value, neither
    enum class Container { array, inline_table };
    Expect expect_ = Expect::key;
    bool in_key_ = true;  // between a key's start and its '='
    std::vector<Container> open_;
};

// In a multi-line basic string, at the backslash at `i`: returns the last byte the escape covers.
// toml++ 3.3 tests the escaped character, and the first one after a line-ending backslash, with
// the whitespace function that has the bug, so a non-ASCII character there is refused too.
size_t end_of_multiline_escape(std::string_view text, size_t i, std::string_view source_name) {
    auto is_space = [&](size_t k) { return is_blank(text[k]) || text[k] == '\n'; };
    size_t next = i + 1;
    if (next >= text.size()) return i;
    if (is_space(next)) {  // a line-ending backslash: the whitespace after it is trimmed
        while (next < text.size() && is_space(next)) ++next;
        if (next < text.size() && !is_ascii(text[next]))
            refuse(text, next, source_name,
                   "a non-ASCII character right after a line-ending backslash, which the TOML library Grove uses "
                   "cannot read safely; write it as an escape (\\u00e9) or put an ASCII character before it");
        return next - 1;
    }
    if (!is_ascii(text[next]))
        refuse(text, next, source_name, "a backslash before a non-ASCII character is not a TOML escape (write \\\\)");
    return next;
}

// Throws at the first byte >= 0x80 that is neither in a string nor in a comment.
void require_ascii_outside_strings(std::string_view text, std::string_view source_name) {
    enum class In { code, comment, basic, literal, multiline_basic, multiline_literal } in = In::code;
    StringStarts starts;
    auto opens = [&](size_t i, const char* token) { return text.substr(i, 3) == token; };
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        switch (in) {
            case In::code:
                if (c == '#') {
                    in = In::comment;
                } else if ((c == '"' || c == '\'') && starts.opens_string()) {
                    if (c == '"')
                        in = opens(i, "\"\"\"") ? (i += 2, In::multiline_basic) : In::basic;
                    else
                        in = opens(i, "'''") ? (i += 2, In::multiline_literal) : In::literal;
                } else if (!is_ascii(c)) {
                    refuse(text, i, source_name,
                           "a non-ASCII character outside a string; TOML keys and values other than strings are ASCII "
                           "(quote the key: \"name\" = ...)");
                } else if (!is_blank(c)) {
                    starts.see(c);
                }
                break;
            case In::comment:
                if (c == '\n') in = In::code, starts.see(c);
                break;
            case In::basic:
                if (c == '\\')
                    ++i;
                else if (c == '"' || c == '\n')  // an unterminated string is the parser's error to report
                    in = In::code, starts.after_string();
                break;
            case In::literal:
                if (c == '\'' || c == '\n') in = In::code, starts.after_string();
                break;
            case In::multiline_basic:
                if (c == '\\')
                    i = end_of_multiline_escape(text, i, source_name);
                else if (opens(i, "\"\"\""))
                    i += 2, in = In::code, starts.after_string();
                break;
            case In::multiline_literal:
                if (opens(i, "'''")) i += 2, in = In::code, starts.after_string();
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
