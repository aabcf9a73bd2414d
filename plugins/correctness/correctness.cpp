// Reward "correctness": extracts the answer from the completion and compares it with the dataset
// row's reference column.
//   extract "auto" (default): the last <answer>...</answer>, else the last \boxed{...} (balanced
//       braces), else the last number in the text. Or force one: "answer_tag", "boxed", "last_number".
//   compare "auto" (default): numerically when both sides read as numbers, else as normalised text;
//       or force "numeric" / "text".
//   Numbers: optional sign, digits with optional thousands commas ("1,234"), decimals, exponent;
//       a leading "$" and a trailing "%" are ignored; "a/b" is a fraction. Equal when
//       |x - ref| <= tolerance * max(1, |ref|).
//   Text: trimmed, whitespace runs collapsed, ASCII letters lower-cased, one trailing '.' dropped.
// Score: score_correct / score_wrong; NaN ("not applicable") when the row has no reference (the
// column is missing or null). No extractable answer scores as wrong. Metric "extracted" (1/0).
#include <grove/plugin.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

namespace {
using grove::sdk::config_error;

std::string trim(std::string_view s) {
    size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? "" : std::string(s.substr(b, e - b + 1));
}

std::optional<std::string> answer_tag(std::string_view text) {
    size_t open = text.rfind("<answer>");
    if (open == std::string::npos) return std::nullopt;
    size_t start = open + 8, close = text.find("</answer>", start);
    if (close == std::string::npos) return std::nullopt;
    return trim(text.substr(start, close - start));
}

std::optional<std::string> boxed(std::string_view text) {
    size_t open = text.rfind("\\boxed{");
    if (open == std::string::npos) return std::nullopt;
    size_t start = open + 7;
    int depth = 1;
    for (size_t i = start; i < text.size(); ++i) {
        if (text[i] == '{') ++depth;
        if (text[i] == '}' && --depth == 0) return trim(text.substr(start, i - start));
    }
    return std::nullopt;  // unbalanced
}

// A number as written in prose; nullopt when the text is not exactly one number.
std::optional<double> parse_number(std::string text) {
    text = trim(text);
    if (!text.empty() && text[0] == '$') text = trim(text.substr(1));
    if (!text.empty() && text.back() == '%') text = trim(text.substr(0, text.size() - 1));
    if (auto slash = text.find('/'); slash != std::string::npos) {
        auto a = parse_number(text.substr(0, slash)), b = parse_number(text.substr(slash + 1));
        if (a && b && *b != 0) return *a / *b;
        return std::nullopt;
    }
    std::string plain;
    for (size_t i = 0; i < text.size(); ++i) {
        bool grouping = text[i] == ',' && i > 0 && i + 1 < text.size() && std::isdigit((unsigned char)text[i - 1]) &&
                        std::isdigit((unsigned char)text[i + 1]);
        if (!grouping) plain += text[i];
    }
    if (plain.empty()) return std::nullopt;
    char* end = nullptr;
    double value = std::strtod(plain.c_str(), &end);
    if (end != plain.c_str() + plain.size() || !std::isfinite(value)) return std::nullopt;
    if (plain.find_first_of("xXpP") != std::string::npos) return std::nullopt;  // no hex floats, inf, nan
    if (plain.find_first_of("0123456789") == std::string::npos) return std::nullopt;
    return value;
}

std::string normalise_text(std::string_view text) {
    std::string out;
    bool space = false;
    for (char c : trim(text)) {
        if (std::isspace((unsigned char)c)) {
            space = true;
            continue;
        }
        if (space && !out.empty()) out += ' ';
        space = false;
        out += (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
    }
    if (!out.empty() && out.back() == '.') out.pop_back();
    return out;
}

struct Correctness {
    explicit Correctness(const grove::sdk::Config& config)
        : extract_(config.get_string("extract", "auto")),
          compare_(config.get_string("compare", "auto")),
          column_(config.get_string("reference_column", "answer")),
          tolerance_(config.get_float("tolerance", 1e-6)),
          score_correct_(config.get_float("score_correct", 1.0)),
          score_wrong_(config.get_float("score_wrong", 0.0)) {
        if (extract_ != "auto" && extract_ != "answer_tag" && extract_ != "boxed" && extract_ != "last_number")
            throw config_error("extract", "'" + extract_ + "' is not valid; use auto, answer_tag, boxed or last_number");
        if (compare_ != "auto" && compare_ != "numeric" && compare_ != "text")
            throw config_error("compare", "'" + compare_ + "' is not valid; use auto, numeric or text");
        if (!(tolerance_ >= 0)) throw config_error("tolerance", "must be >= 0");
        if (column_.empty()) throw config_error("reference_column", "must name a dataset column");
        int error = 0;
        PCRE2_SIZE offset = 0;
        const char* pattern = R"([-+]?\$?\d(?:[\d,]*\d)?(?:\.\d+)?(?:[eE][-+]?\d+)?%?)";
        number_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &error,
                                    &offset, nullptr));
        if (!number_) throw grove::sdk::Error(GROVE_ERROR_INTERNAL, "number regex does not compile");
    }

    std::optional<std::string> last_number(std::string_view text) const {
        std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
            pcre2_match_data_create_from_pattern(number_.get(), nullptr), &pcre2_match_data_free);
        std::optional<std::string> last;
        size_t start = 0;
        while (start < text.size()) {
            int rc = pcre2_match(number_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0,
                                 data.get(), nullptr);
            if (rc < 0) break;
            PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.get());
            last = std::string(text.substr(ov[0], ov[1] - ov[0]));
            start = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
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
            nlohmann::json row;
            try {
                row = nlohmann::json::parse(std::string_view(batch.row_json[i].data, batch.row_json[i].size));
            } catch (const nlohmann::json::exception& e) {
                throw grove::sdk::Error(GROVE_ERROR_INVALID_ARGUMENT,
                                        "row " + std::to_string(i) + ": the dataset row is not valid JSON: " + e.what());
            }
            auto answer = extract(grove::sdk::view(batch.completions[i]));
            out.metrics[i] = answer ? 1.0f : 0.0f;
            if (!row.is_object() || !row.contains(column_) || row[column_].is_null()) continue;  // NaN: no reference
            const auto& value = row[column_];
            std::string reference = value.is_string() ? value.get<std::string>() : value.dump();
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
    grove::sdk::key("reference_column", GROVE_VALUE_STRING, "\"answer\"", "dataset column holding the reference answer"),
    grove::sdk::key("extract", GROVE_VALUE_STRING, "\"auto\"", "auto, answer_tag, boxed or last_number"),
    grove::sdk::key("compare", GROVE_VALUE_STRING, "\"auto\"", "auto (numeric when both are numbers), numeric or text"),
    grove::sdk::key("tolerance", GROVE_VALUE_FLOAT, "1e-6", "numeric equality: |x - ref| <= tolerance * max(1, |ref|)"),
    grove::sdk::key("score_correct", GROVE_VALUE_FLOAT, "1.0", "score of a correct answer"),
    grove::sdk::key("score_wrong", GROVE_VALUE_FLOAT, "0.0", "score of a wrong or missing answer"),
};
const char* const kMetrics[] = {"extracted"};
constexpr auto kCorrectness = grove::sdk::reward_descriptor<Correctness>(
    "correctness", "1.0.0", "1.0 when the extracted answer equals the row's reference (numeric or text)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC, kKeys, kMetrics);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kCorrectness)
