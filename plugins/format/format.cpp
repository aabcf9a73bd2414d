// Reward "format": 1.0 when the completion matches a regular expression (PCRE2, UTF-8 aware,
// '.' matches newlines), else 0.0.
//   preset "think_answer" (default): ^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$
//       TRL's documented format reward ^<think>.*?</think><answer>.*?</answer>$, tolerant of
//       whitespace between and around the two blocks (small models put newlines there).
//   preset "think": TRL's think_format_reward, ^<think>(?!.*<think>)(.*?)</think>.*$
//   pattern: any regex; overrides the preset.
//   full_match (default true): the whole completion must match; false: a match anywhere counts.
// Metric "matched" (1/0) per row.
#include <grove/plugin.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

namespace {
using grove::sdk::config_error;

const char* kThinkAnswer = R"(^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$)";
const char* kThink = R"(^<think>(?!.*<think>)(.*?)</think>.*$)";

struct Format {
    explicit Format(const grove::sdk::Config& config)
        : full_match_(config.get_bool("full_match", true)),
          score_match_(config.get_float("score_match", 1.0)),
          score_miss_(config.get_float("score_miss", 0.0)) {
        std::string pattern = config.get_string("pattern", "");
        std::string key = "pattern";
        if (pattern.empty()) {
            std::string preset = config.get_string("preset", "think_answer");
            key = "preset";
            if (preset == "think_answer") pattern = kThinkAnswer;
            else if (preset == "think") pattern = kThink;
            else throw config_error("preset", "unknown preset '" + preset + "'; use \"think_answer\" or \"think\", or give a pattern");
        }
        int error = 0;
        PCRE2_SIZE offset = 0;
        // MATCH_INVALID_UTF: a completion cut mid-character still matches in its valid parts
        uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_DOTALL | PCRE2_MATCH_INVALID_UTF;
        pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), options, &error,
                                         &offset, nullptr);
        if (!code) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(error, message, sizeof message);
            throw config_error(key, "the regex does not compile at offset " + std::to_string(offset) + ": " +
                                        reinterpret_cast<char*>(message));
        }
        code_.reset(code);
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    }

    void score(const grove_reward_batch& batch, grove_reward_output& out) const {
        std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
            pcre2_match_data_create_from_pattern(code_.get(), nullptr), &pcre2_match_data_free);
        uint32_t options = full_match_ ? (PCRE2_ANCHORED | PCRE2_ENDANCHORED) : 0;
        for (uint32_t i = 0; i < batch.count; ++i) {
            const grove_text& text = batch.completions[i];
            int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data ? text.data : ""), text.size, 0,
                                 options, data.get(), nullptr);
            // invalid UTF-8 (a completion cut mid-character) is a miss, not an error
            bool bad_utf8 = rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21;
            if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && !bad_utf8)
                throw grove::sdk::Error(GROVE_ERROR_INTERNAL, "regex matching failed on row " + std::to_string(i) +
                                                                  " (PCRE2 error " + std::to_string(rc) + ")");
            bool matched = rc >= 0;
            out.scores[i] = float(matched ? score_match_ : score_miss_);
            out.metrics[i] = matched ? 1.0f : 0.0f;
        }
    }

    struct CodeFree {
        void operator()(pcre2_code* c) const { pcre2_code_free(c); }
    };
    std::unique_ptr<pcre2_code, CodeFree> code_;
    bool full_match_;
    double score_match_, score_miss_;
};

const grove_config_key kKeys[] = {
    grove::sdk::key("preset", GROVE_VALUE_STRING, "\"think_answer\"", "think_answer or think (TRL's think_format_reward)"),
    grove::sdk::key("pattern", GROVE_VALUE_STRING, "(preset)", "a PCRE2 regex; '.' matches newlines; overrides preset"),
    grove::sdk::key("full_match", GROVE_VALUE_BOOL, "true", "the whole completion must match (false: anywhere)"),
    grove::sdk::key("score_match", GROVE_VALUE_FLOAT, "1.0", "score of a matching completion"),
    grove::sdk::key("score_miss", GROVE_VALUE_FLOAT, "0.0", "score of any other completion"),
};
const char* const kMetrics[] = {"matched"};
constexpr auto kFormat = grove::sdk::reward_descriptor<Format>(
    "format", "1.0.0", "1.0 when the completion matches a format regex (<think>...</think><answer>...</answer>)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC, kKeys, kMetrics);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kFormat)
