// Reward "format": score_match (1.0) when the completion matches a regular expression, else
// score_miss (0.0). Metric "matched" (1/0) per row.
//
// Regex engine: PCRE2 with PCRE2_UTF | PCRE2_UCP | PCRE2_DOTALL ('.' matches newlines; \w, \d, \s
// and \b are Unicode-aware) and PCRE2_MATCH_INVALID_UTF (a completion cut mid-character never
// matches across the broken bytes, but its valid parts can still match). The pattern is compiled,
// and JIT-compiled where the platform supports it, once per instance.
//
//   preset "think_answer" (default):   ^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$
//       TRL's documented format reward ^<think>.*?</think><answer>.*?</answer>$, made tolerant of
//       whitespace (spaces, tabs, newlines; any amount, including none) before <think>, between
//       </think> and <answer>, and after </answer>: small models put newlines there. Text inside
//       the blocks is free. Nothing else may come before, between or after the blocks.
//   preset "think":                     ^<think>(?!.*<think>)(.*?)</think>.*$
//       TRL's think_format_reward exactly (re.match with DOTALL|MULTILINE): the completion starts
//       with <think>, has no second <think>, and closes it; anything may follow.
//   pattern: any PCRE2 regex; overrides preset (the preset is still checked for typos).
//   full_match (default true): the whole completion must match (the pattern is compiled with
//       PCRE2_ANCHORED | PCRE2_ENDANCHORED, so JIT stays in use); false: a match anywhere counts.
//
// Truncated completions get no special case: they usually lack the closing tags and miss.
// A completion on which PCRE2 gives up (match, depth or JIT stack limit: a pathological pattern)
// fails the batch with GROVE_ERROR_UNSUPPORTED naming the row, rather than scoring it silently.
#include <grove/plugin.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cmath>
#include <memory>
#include <string>

namespace {
using grove::sdk::config_error;

constexpr const char* kThinkAnswer = R"(^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$)";
constexpr const char* kThink = R"(^<think>(?!.*<think>)(.*?)</think>.*$)";

std::string pcre2_message(int code) {
    PCRE2_UCHAR buffer[256];
    if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0) return "PCRE2 error " + std::to_string(code);
    return reinterpret_cast<const char*>(buffer);
}

double finite_float(const grove::sdk::Config& config, const char* key, double fallback) {
    double value = config.get_float(key, fallback);
    if (!std::isfinite(value))
        throw config_error(key, "must be a finite number (NaN would mean \"not applicable\" for every row)");
    return value;
}

struct Format {
    explicit Format(const grove::sdk::Config& config)
            : full_match_(config.get_bool("full_match", true)),
              score_match_(finite_float(config, "score_match", 1.0)),
              score_miss_(finite_float(config, "score_miss", 0.0)) {
        std::string preset = config.get_string("preset", "think_answer");
        std::string pattern;
        if (preset == "think_answer")
            pattern = kThinkAnswer;
        else if (preset == "think")
            pattern = kThink;
        else
            throw config_error(
                "preset", "unknown preset '" + preset + "'; valid presets are \"think_answer\" and \"think\" (or set pattern)");
        std::string key = "preset";
        if (config.has("pattern")) {
            pattern = config.get_string("pattern", "");
            key = "pattern";
        }

        uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_DOTALL | PCRE2_MATCH_INVALID_UTF;
        // anchoring at compile time (not at match time) keeps the JIT code usable
        if (full_match_) options |= PCRE2_ANCHORED | PCRE2_ENDANCHORED;
        int error = 0;
        PCRE2_SIZE offset = 0;
        pcre2_code* code =
            pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
        if (!code)
            throw config_error(key, "the regex does not compile at offset " + std::to_string(offset) + ": " +
                                        pcre2_message(error) + "; give a PCRE2 regular expression");
        code_.reset(code);
        jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  // not available everywhere: fine
    }

    void score(const grove_reward_batch& batch, grove_reward_output& out) const {
        // per call, so that concurrent calls share nothing mutable (the plugin is THREAD_SAFE)
        std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
            pcre2_match_data_create_from_pattern(code_.get(), nullptr), &pcre2_match_data_free);
        std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context(pcre2_match_context_create(nullptr),
                                                                                          &pcre2_match_context_free);
        std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> stack(nullptr, &pcre2_jit_stack_free);
        if (!data || !context) throw std::bad_alloc();
        if (jit_) {
            // the default 32 KiB JIT stack is too small for long completions with repeated groups
            stack.reset(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr));
            if (!stack) throw std::bad_alloc();
            pcre2_jit_stack_assign(context.get(), nullptr, stack.get());
        }
        for (uint32_t i = 0; i < batch.count; ++i) {
            const grove_text& text = batch.completions[i];
            static const char empty[] = "";
            int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data ? text.data : empty), text.size, 0, 0,
                                 data.get(), context.get());
            if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
                throw grove::sdk::Error(GROVE_ERROR_UNSUPPORTED, "row " + std::to_string(i) +
                                                                     ": PCRE2 could not finish matching (" + pcre2_message(rc) +
                                                                     "); simplify the pattern");
            bool matched = rc >= 0;
            out.scores[i] = float(matched ? score_match_ : score_miss_);
            if (out.metrics && out.metric_count >= 1) out.metrics[i] = matched ? 1.0f : 0.0f;
        }
    }

    struct CodeFree {
        void operator()(pcre2_code* c) const { pcre2_code_free(c); }
    };
    std::unique_ptr<pcre2_code, CodeFree> code_;
    bool full_match_;
    double score_match_, score_miss_;
    bool jit_ = false;
};

const grove_config_key kKeys[] = {
    grove::sdk::key("preset", GROVE_VALUE_STRING, "\"think_answer\"",
                    "think_answer (<think>..</think><answer>..</answer>) or think (TRL's think_format_reward)"),
    grove::sdk::key("pattern", GROVE_VALUE_STRING, "(the preset's)",
                    "a PCRE2 regex (UTF, '.' matches newlines); overrides preset"),
    grove::sdk::key("full_match", GROVE_VALUE_BOOL, "true", "the whole completion must match (false: a match anywhere)"),
    grove::sdk::key("score_match", GROVE_VALUE_FLOAT, "1.0", "score of a matching completion"),
    grove::sdk::key("score_miss", GROVE_VALUE_FLOAT, "0.0", "score of any other completion"),
};
const char* const kMetrics[] = {"matched"};
constexpr auto kFormat = grove::sdk::reward_descriptor<Format>(
    "format", "1.0.0", "1.0 when the completion matches a format regex (<think>...</think><answer>...</answer>)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC | GROVE_PLUGIN_REPORTS_FORMAT_RATE, kKeys, kMetrics);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kFormat)
