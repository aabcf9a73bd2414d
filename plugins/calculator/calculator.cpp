// Environment "calculator": the model writes an arithmetic expression between tags,
//     <calc>123 * 456</calc>
// the turn ends at the closing tag (a stop string), and the observation answers between result tags:
//     <result>56088</result>
// Expressions: numbers, + - * /, unary minus, parentheses, spaces; evaluated by a recursive-descent
// parser in double precision (no eval, no library). A malformed expression, a division by zero or a
// result that is not finite gets "<result>error: ...</result>", which the model can learn from, and
// counts as a failed tool call. A turn with no call, or whose call is never closed, ends the episode
// (the second counts as a failed call).
#include <grove/plugin.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <stdexcept>
#include <string>

namespace {
using grove::sdk::config_error;

// Thrown for a bad expression; its message goes back to the model.
struct ExpressionError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The character at text[at] as a whole UTF-8 sequence, so an error message stays valid UTF-8.
std::string character_at(std::string_view text, size_t at) {
    const unsigned char lead = static_cast<unsigned char>(text[at]);
    const size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    bool valid = length > 0 && at + length <= text.size();
    for (size_t i = 1; valid && i < length; ++i) valid = (static_cast<unsigned char>(text[at + i]) & 0xC0) == 0x80;
    return valid ? std::string(text.substr(at, length)) : "byte " + std::to_string(lead);
}

class Parser {
public:
    explicit Parser(std::string_view text) : text_(text) {}

    double evaluate() {
        double value = sum();
        skip_spaces();
        if (at_ < text_.size()) throw ExpressionError("unexpected '" + character_at(text_, at_) + "'");
        if (!std::isfinite(value)) throw ExpressionError("the result is not a finite number");
        return value;
    }

private:
    static constexpr int kMaxDepth = 32;

    void skip_spaces() {
        while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n')) ++at_;
    }
    bool take(char c) {
        skip_spaces();
        if (at_ < text_.size() && text_[at_] == c) {
            ++at_;
            return true;
        }
        return false;
    }
    double sum() {
        double value = product();
        for (;;) {
            if (take('+'))
                value += product();
            else if (take('-'))
                value -= product();
            else
                return value;
        }
    }
    double product() {
        double value = factor();
        for (;;) {
            if (take('*')) {
                value *= factor();
            } else if (take('/')) {
                double divisor = factor();
                if (divisor == 0) throw ExpressionError("division by zero");
                value /= divisor;
            } else {
                return value;
            }
        }
    }
    double factor() {
        if (++depth_ > kMaxDepth) throw ExpressionError("too deeply nested");
        double value;
        if (take('-')) {
            value = -factor();
        } else if (take('+')) {
            value = factor();
        } else if (take('(')) {
            value = sum();
            if (!take(')')) throw ExpressionError("missing ')'");
        } else {
            value = number();
        }
        --depth_;
        return value;
    }
    double number() {
        skip_spaces();
        const size_t start = at_;
        while (at_ < text_.size() && ((text_[at_] >= '0' && text_[at_] <= '9') || text_[at_] == '.')) ++at_;
        if (at_ == start)
            throw ExpressionError(at_ < text_.size() ? "unexpected '" + character_at(text_, at_) + "'" : "missing a number");
        const std::string digits(text_.substr(start, at_ - start));
        if (digits == "." || digits.find('.') != digits.rfind('.')) throw ExpressionError("malformed number '" + digits + "'");
        return std::strtod(digits.c_str(), nullptr);  // very long numbers give inf, refused in evaluate()
    }

    std::string_view text_;
    size_t at_ = 0;
    int depth_ = 0;
};

// Integers print as integers; anything else with up to 10 significant digits.
std::string format_number(double value) {
    char buffer[64];
    if (value == 0) value = 0;  // no "-0"
    if (std::fabs(value) < 1e15 && value == std::floor(value))
        std::snprintf(buffer, sizeof buffer, "%.0f", value);
    else
        std::snprintf(buffer, sizeof buffer, "%.10g", value);
    return buffer;
}

struct Calculator {
    explicit Calculator(const grove::sdk::Config& config)
            : open_(config.get_string("open_tag", "<calc>")),
              close_(config.get_string("close_tag", "</calc>")),
              result_open_(config.get_string("result_open_tag", "<result>")),
              result_close_(config.get_string("result_close_tag", "</result>")),
              max_expression_bytes_(config.get_int("max_expression_bytes", 200)) {
        if (open_.empty() || close_.empty()) throw config_error(open_.empty() ? "open_tag" : "close_tag", "must not be empty");
        if (max_expression_bytes_ < 1) throw config_error("max_expression_bytes", "must be >= 1");
        stops_[0] = close_.c_str();
    }

    const char* const* stop_strings() const { return stops_; }

    void step(const grove_environment_batch& batch, grove_environment_output& out) {
        grove::sdk::answer_tool_calls(batch, out, open_, close_, [&](std::string_view expression, bool& failed) {
            return result_open_ + answer(expression, failed) + result_close_;
        });
    }

private:
    std::string answer(std::string_view expression, bool& failed) const {
        try {
            if (int64_t(expression.size()) > max_expression_bytes_) throw ExpressionError("expression too long");
            return format_number(Parser(expression).evaluate());
        } catch (const ExpressionError& e) {
            failed = true;
            return std::string("error: ") + e.what();
        }
    }

    std::string open_, close_, result_open_, result_close_;
    int64_t max_expression_bytes_;
    const char* stops_[2] = {nullptr, nullptr};
};

const grove_config_key kKeys[] = {
    grove::sdk::key("open_tag", GROVE_VALUE_STRING, "\"<calc>\"", "text that opens a call"),
    grove::sdk::key("close_tag", GROVE_VALUE_STRING, "\"</calc>\"", "text that closes a call; it ends the model's turn"),
    grove::sdk::key("result_open_tag", GROVE_VALUE_STRING, "\"<result>\"", "text before the answer"),
    grove::sdk::key("result_close_tag", GROVE_VALUE_STRING, "\"</result>\"", "text after the answer"),
    grove::sdk::key("max_expression_bytes", GROVE_VALUE_INT, "200", "longer expressions get an error answer"),
};
constexpr auto kCalculator = grove::sdk::environment_descriptor<Calculator>(
    "calculator", "1.0.0", "answers <calc>expression</calc> with <result>value</result> (+ - * / and parentheses)",
    GROVE_PLUGIN_DETERMINISTIC, kKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kCalculator)
