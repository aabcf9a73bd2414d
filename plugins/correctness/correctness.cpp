// Reward "correctness": extracts the answer from the completion and compares it with the reference
// answer in the dataset row's column `reference_column` (default "answer"; a JSON string or number).
//
// Extraction (`extract`):
//   "answer_tag"  the text inside the last complete <answer>...</answer>, trimmed.
//   "boxed"       the content of the last \boxed{...} whose braces balance (nested braces allowed:
//                 \boxed{\frac{1}{2}} gives \frac{1}{2}); an unclosed last one (a truncated
//                 completion) falls back to the one before it. "\boxed {" is accepted too.
//   "last_number" the last number written in the text (see "Numbers in text" below).
//   "auto"        (default) answer_tag, else boxed, else last_number.
//
// Comparison (`compare`):
//   "numeric"  both sides must read as numbers (see "Numbers"); equal when
//              |answer - reference| <= tolerance * max(1, |reference|). Anything else is wrong.
//   "text"     normalised text equality: trimmed, whitespace runs collapsed to one space, ASCII
//              letters lower-cased (other scripts untouched), one trailing '.' dropped, and a whole
//              \text{...} / \textbf{...} / \mathrm{...} wrapper removed.
//   "auto"     (default) numeric when both sides read as numbers, else text.
//
// Numbers (a whole string, e.g. an answer tag or a reference): optional sign ('+', '-' or U+2212
// '−'), optional currency '$' (or LaTeX '\$') before or after the sign, then
//     digits with optional thousands commas in groups of exactly three ("1,234,567"; "1,23" is not
//     a number), optional decimals (".5" and "5." are fine), optional exponent ("1e3", "2.5E-4"),
// then an optional '%' (or '\%'), which is IGNORED: "50%" equals 50, not 0.5 (references in math
// datasets write the percentage number). Also accepted: a fraction "a/b" of two such numbers and
// LaTeX \frac{a}{b} / \dfrac{a}{b} / \tfrac{a}{b} (a and b may carry their own sign), with b != 0.
// Surrounding whitespace is ignored.
// Not numbers: hex, "inf", "nan", words ("five"), units ("12 apples"), expressions ("x = 5").
//
// Numbers in text (last_number): the same shapes found by a regex, without fractions: a sign
// counts only when written right before the digits and not after a letter or digit ("5-3" gives
// 3, "x = -3" and "(-3)" give -3); a number does not start right after a digit or after
// "digit." (so "1.2.3" gives 1.2); "1,234" is one number but "1,2,3" is three.
//
// Score: score_correct / score_wrong. NaN ("not applicable", TRL's None) when the row has no
// reference: the column is missing or null. A completion with nothing extractable scores
// score_wrong. row_json that is not a JSON object fails the batch with
// GROVE_ERROR_INVALID_ARGUMENT naming the row. Truncated rows get no special case: they are scored
// on what they contain. Metric "extracted": 1 when an answer was extracted, else 0.
#include <grove/plugin.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace {
using grove::sdk::config_error;

constexpr std::string_view kMinus = "\xe2\x88\x92";  // U+2212 MINUS SIGN

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

bool consume(std::string_view& s, std::string_view prefix) {
    if (s.substr(0, prefix.size()) != prefix) return false;
    s.remove_prefix(prefix.size());
    return true;
}

// ---- extraction -------------------------------------------------------------------------------
std::optional<std::string> answer_tag(std::string_view text) {
    size_t close = text.rfind("</answer>");
    if (close == std::string_view::npos) return std::nullopt;
    size_t open = text.rfind("<answer>", close);
    if (open == std::string_view::npos) return std::nullopt;
    size_t start = open + 8;
    return std::string(trim(text.substr(start, close - start)));
}

// content of the balanced {...} starting at text[open] == '{'; nullopt when it never closes
std::optional<std::string_view> braced(std::string_view text, size_t open) {
    int depth = 0;
    for (size_t i = open; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '{' || text[i + 1] == '}')) {
            ++i;  // an escaped brace does not nest
            continue;
        }
        if (text[i] == '{') ++depth;
        if (text[i] == '}' && --depth == 0) return text.substr(open + 1, i - open - 1);
    }
    return std::nullopt;
}

std::optional<std::string> boxed(std::string_view text) {
    size_t from = std::string_view::npos, at;
    while ((at = text.rfind("\\boxed", from)) != std::string_view::npos) {
        size_t open = at + 6;
        while (open < text.size() && text[open] == ' ') ++open;
        if (open < text.size() && text[open] == '{')
            if (auto content = braced(text, open)) return std::string(trim(*content));
        if (at == 0) break;
        from = at - 1;  // an unclosed (or brace-less) last one: try the one before
    }
    return std::nullopt;
}

// ---- numbers ----------------------------------------------------------------------------------
// digits with grouping commas (groups of exactly three), decimals and exponent; no sign
std::optional<double> plain_number(std::string_view s) {
    std::string digits;
    size_t i = 0, run = 0;
    bool grouped = false, any = false;
    while (i < s.size() && (is_digit(s[i]) || s[i] == ',')) {
        if (s[i] == ',') {
            // a grouping comma: 1-3 digits before the first one, exactly 3 between and after
            if (run == 0 || (grouped ? run != 3 : run > 3)) return std::nullopt;
            grouped = true;
            run = 0;
        } else {
            digits += s[i];
            ++run;
            any = true;
        }
        ++i;
    }
    if (grouped && run != 3) return std::nullopt;
    if (i < s.size() && s[i] == '.') {
        digits += s[i++];
        while (i < s.size() && is_digit(s[i])) {
            digits += s[i++];
            any = true;
        }
    }
    if (!any) return std::nullopt;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        digits += s[i++];
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) digits += s[i++];
        size_t exponent_start = i;
        while (i < s.size() && is_digit(s[i])) digits += s[i++];
        if (i == exponent_start) return std::nullopt;
    }
    if (i != s.size()) return std::nullopt;
    double value = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);  // locale-free
    if (ec != std::errc() || end != digits.data() + digits.size() || !std::isfinite(value)) return std::nullopt;
    return value;
}

// consumes a leading '+', '-' or U+2212; true when there was one
bool consume_sign(std::string_view& s, bool& negative) {
    if (consume(s, "-") || consume(s, kMinus)) {
        negative = true;
        return true;
    }
    return consume(s, "+");
}

// a plain number with an optional sign (a fraction's numerator or denominator)
std::optional<double> signed_number(std::string_view s) {
    s = trim(s);
    bool negative = false;
    consume_sign(s, negative);
    auto value = plain_number(s);
    if (!value) return std::nullopt;
    return negative ? -*value : *value;
}

// A whole string as one number (see the header); nullopt when it is anything else.
std::optional<double> parse_number(std::string_view s) {
    s = trim(s);
    bool negative = false;
    bool has_sign = consume_sign(s, negative);
    if ((consume(s, "\\$") || consume(s, "$")) && !has_sign) consume_sign(s, negative);  // "-$5" or "$-5"
    // a trailing percent sign is ignored, see the header
    if (s.size() >= 2 && s.substr(s.size() - 2) == "\\%")
        s.remove_suffix(2);
    else if (!s.empty() && s.back() == '%')
        s.remove_suffix(1);
    s = trim(s);
    std::optional<double> value;
    if (consume(s, "\\frac") || consume(s, "\\dfrac") || consume(s, "\\tfrac")) {
        if (s.empty() || s.front() != '{') return std::nullopt;
        auto a = braced(s, 0);
        if (!a) return std::nullopt;
        std::string_view rest = s.substr(a->size() + 2);
        if (rest.empty() || rest.front() != '{') return std::nullopt;
        auto b = braced(rest, 0);
        if (!b || b->size() + 2 != rest.size()) return std::nullopt;
        auto x = signed_number(*a), y = signed_number(*b);
        if (!x || !y || *y == 0) return std::nullopt;
        value = *x / *y;
    } else if (size_t slash = s.find('/'); slash != std::string_view::npos) {
        auto x = plain_number(trim(s.substr(0, slash))), y = signed_number(s.substr(slash + 1));
        if (!x || !y || *y == 0) return std::nullopt;
        value = *x / *y;
    } else {
        value = plain_number(s);
    }
    if (!value) return std::nullopt;
    return negative ? -*value : *value;
}

// the last number written in prose (see the header)
constexpr const char* kNumberPattern = R"((?<!\d)(?<!\d\.))"                     // not inside a digit run or a decimal
                                       R"((?:(?<![\p{L}\p{N}_])[-+\x{2212}])?)"  // a sign, not after a letter or digit
                                       R"((?:\\?\$)?)"                           // currency
                                       R"((?:\d{1,3}(?:,\d{3})+(?!\d)|\d+))"     // 1,234,567 or 1234567
                                       R"((?:\.\d+)?(?:[eE][-+]?\d+)?)"          // decimals, exponent
                                       R"((?:\\?%)?)";                           // percent

// ---- text -------------------------------------------------------------------------------------
std::string normalise_text(std::string_view text) {
    text = trim(text);
    for (std::string_view wrapper : {"\\text{", "\\textbf{", "\\mathrm{"}) {
        if (text.substr(0, wrapper.size()) == wrapper) {
            auto inner = braced(text, wrapper.size() - 1);
            if (inner && inner->size() + wrapper.size() + 1 == text.size()) text = trim(*inner);
            break;
        }
    }
    std::string out;
    bool space = false;
    for (char c : text) {
        if (is_space(c)) {
            space = true;
            continue;
        }
        if (space && !out.empty()) out += ' ';
        space = false;
        out += (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
    }
    if (!out.empty() && out.back() == '.') out.pop_back();
    if (!out.empty() && out.back() == ' ') out.pop_back();  // "paris ." -> "paris"
    return out;
}

double finite_float(const grove::sdk::Config& config, const char* key, double fallback) {
    double value = config.get_float(key, fallback);
    if (!std::isfinite(value))
        throw config_error(key, "must be a finite number (NaN would mean \"not applicable\" for every row)");
    return value;
}

struct Correctness {
    explicit Correctness(const grove::sdk::Config& config)
            : extract_(config.get_string("extract", "auto")),
              compare_(config.get_string("compare", "auto")),
              column_(config.get_string("reference_column", "answer")),
              tolerance_(config.get_float("tolerance", 1e-6)),
              score_correct_(finite_float(config, "score_correct", 1.0)),
              score_wrong_(finite_float(config, "score_wrong", 0.0)) {
        if (extract_ != "auto" && extract_ != "answer_tag" && extract_ != "boxed" && extract_ != "last_number")
            throw config_error("extract", "'" + extract_ + "' is not valid; use auto, answer_tag, boxed or last_number");
        if (compare_ != "auto" && compare_ != "numeric" && compare_ != "text")
            throw config_error("compare", "'" + compare_ + "' is not valid; use auto, numeric or text");
        if (!(tolerance_ >= 0) || !std::isfinite(tolerance_))
            throw config_error("tolerance", "must be >= 0 and finite (a relative+absolute tolerance, e.g. 1e-6)");
        if (column_.empty()) throw config_error("reference_column", "must name a dataset column, e.g. \"answer\"");
        int error = 0;
        PCRE2_SIZE offset = 0;
        number_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kNumberPattern), PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr));
        if (!number_) throw grove::sdk::Error(GROVE_ERROR_INTERNAL, "the number regex does not compile");
        pcre2_jit_compile(number_.get(), PCRE2_JIT_COMPLETE);
    }

    std::optional<std::string> last_number(std::string_view text) const {
        std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
            pcre2_match_data_create_from_pattern(number_.get(), nullptr), &pcre2_match_data_free);
        if (!data) throw std::bad_alloc();
        static const char empty[] = "";
        auto subject = reinterpret_cast<PCRE2_SPTR>(text.data() ? text.data() : empty);
        std::optional<std::string> last;
        size_t start = 0;
        while (start <= text.size()) {
            int rc = pcre2_match(number_.get(), subject, text.size(), start, 0, data.get(), nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0)
                throw grove::sdk::Error(GROVE_ERROR_INTERNAL, "number search failed (PCRE2 error " + std::to_string(rc) + ")");
            PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.get());
            last = std::string(text.substr(ov[0], ov[1] - ov[0]));
            start = ov[1] > ov[0] ? ov[1] : ov[0] + 1;  // the pattern never matches empty; belt and braces
        }
        return last;
    }

    std::optional<std::string> extract(std::string_view text) const {
        if (extract_ == "answer_tag") return answer_tag(text);
        if (extract_ == "boxed") return boxed(text);
        if (extract_ == "last_number") return last_number(text);
        if (auto a = answer_tag(text)) return a;
        if (auto b = boxed(text)) return b;
        return last_number(text);
    }

    bool equal(const std::string& answer, const std::string& reference) const {
        if (compare_ != "text") {
            auto a = parse_number(answer), r = parse_number(reference);
            if (a && r) return std::abs(*a - *r) <= tolerance_ * std::max(1.0, std::abs(*r));
            if (compare_ == "numeric") return false;
        }
        return normalise_text(answer) == normalise_text(reference);
    }

    void score(const grove_reward_batch& batch, grove_reward_output& out) const {
        for (uint32_t i = 0; i < batch.count; ++i) {
            auto answer = extract(grove::sdk::view(batch.completions[i]));
            if (out.metrics && out.metric_count >= 1) out.metrics[i] = answer ? 1.0f : 0.0f;
            if (!batch.row_json) continue;  // the host has no dataset columns at all: not applicable
            nlohmann::json row;
            try {
                row = nlohmann::json::parse(grove::sdk::view(batch.row_json[i]));
            } catch (const nlohmann::json::exception& e) {
                throw grove::sdk::Error(GROVE_ERROR_INVALID_ARGUMENT,
                                        "row " + std::to_string(i) + ": the dataset row is not valid JSON: " + e.what());
            }
            if (!row.is_object())
                throw grove::sdk::Error(GROVE_ERROR_INVALID_ARGUMENT,
                                        "row " + std::to_string(i) + ": the dataset row is not a JSON object");
            auto it = row.find(column_);
            if (it == row.end() || it->is_null()) continue;  // NaN: no reference
            std::string reference = it->is_string() ? it->get<std::string>() : it->dump();
            out.scores[i] = float(answer && equal(*answer, reference) ? score_correct_ : score_wrong_);
        }
    }

    struct CodeFree {
        void operator()(pcre2_code* c) const { pcre2_code_free(c); }
    };
    std::string extract_, compare_, column_;
    double tolerance_, score_correct_, score_wrong_;
    std::unique_ptr<pcre2_code, CodeFree> number_;
};

const grove_config_key kKeys[] = {
    grove::sdk::key("reference_column", GROVE_VALUE_STRING, "\"answer\"",
                    "dataset column holding the reference answer (JSON string or number)"),
    grove::sdk::key("extract", GROVE_VALUE_STRING, "\"auto\"",
                    "auto (answer tag, else \\boxed{}, else last number), answer_tag, boxed or last_number"),
    grove::sdk::key("compare", GROVE_VALUE_STRING, "\"auto\"", "auto (numeric when both are numbers), numeric or text"),
    grove::sdk::key("tolerance", GROVE_VALUE_FLOAT, "1e-6", "numeric equality: |x - ref| <= tolerance * max(1, |ref|)"),
    grove::sdk::key("score_correct", GROVE_VALUE_FLOAT, "1.0", "score of a correct answer"),
    grove::sdk::key("score_wrong", GROVE_VALUE_FLOAT, "0.0", "score of a wrong or missing answer"),
};
const char* const kMetrics[] = {"extracted"};
constexpr auto kCorrectness = grove::sdk::reward_descriptor<Correctness>(
    "correctness", "1.0.0", "1.0 when the extracted answer equals the row's reference (numeric or text)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC | GROVE_PLUGIN_REPORTS_ACCURACY, kKeys, kMetrics);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kCorrectness)
