#include "grove/tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "grove/error.hpp"
#include "io/json_values.hpp"
#include "text/text_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

namespace {

Error bad_tokenizer(const std::string& file, const std::string& what) { return Error(ErrorKind::input, file + ": " + what); }

// The largest vocabularies in use hold about 262k tokens; a larger id is a damaged file, and would
// make the id-to-token table take the machine's memory.
constexpr int64_t kMaxTokenId = (int64_t(1) << 22) - 1;
int64_t token_id(const json& value, const std::string& where) { return json_integer(value, where, 0, kMaxTokenId); }

json read_json_file(const fs::path& path) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorKind::input, path.string() + ": cannot read");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        throw Error(ErrorKind::input, path.string() + ": invalid JSON: " + e.what());
    }
}

// ---- UTF-8 -----------------------------------------------------------------------------------
size_t utf8_length(unsigned char lead) {
    if (lead < 0x80) return 1;
    if ((lead >> 5) == 0x6) return 2;
    if ((lead >> 4) == 0xe) return 3;
    if ((lead >> 3) == 0x1e) return 4;
    return 1;  // invalid lead byte: treat as one unit
}

std::vector<std::string> utf8_chars(std::string_view s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        size_t n = std::min(utf8_length((unsigned char)s[i]), s.size() - i);
        out.emplace_back(s.substr(i, n));
        i += n;
    }
    return out;
}

std::string utf8_encode(uint32_t cp) {
    std::string out;
    if (cp < 0x80)
        out += char(cp);
    else if (cp < 0x800) {
        out += char(0xc0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += char(0xe0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    } else {
        out += char(0xf0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3f));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    }
    return out;
}

// GPT-2's reversible byte <-> printable-unicode map used by byte-level BPE.
struct ByteMap {
    std::string to_unicode[256];
    std::unordered_map<std::string, unsigned char> to_byte;
    ByteMap() {
        std::vector<int> printable;
        for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
        for (int b = 0xa1; b <= 0xac; ++b) printable.push_back(b);
        for (int b = 0xae; b <= 0xff; ++b) printable.push_back(b);
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            bool is_printable = std::find(printable.begin(), printable.end(), b) != printable.end();
            to_unicode[b] = utf8_encode(is_printable ? uint32_t(b) : uint32_t(256 + extra++));
            to_byte[to_unicode[b]] = (unsigned char)b;
        }
    }
};
const ByteMap& byte_map() {
    static const ByteMap map;
    return map;
}

// ---- PCRE2 -----------------------------------------------------------------------------------
class Regex {
public:
    Regex(const std::string& pattern, const std::string& file) {
        int error = 0;
        PCRE2_SIZE offset = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &error,
                              &offset, nullptr);
        if (!code_) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(error, message, sizeof message);
            throw bad_tokenizer(file, "pre-tokenizer regex does not compile at offset " + std::to_string(offset) + ": " +
                                          reinterpret_cast<char*>(message));
        }
        pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
    }
    ~Regex() { pcre2_code_free(code_); }
    Regex(const Regex&) = delete;
    // [begin, end) byte ranges of every non-empty match
    std::vector<std::pair<size_t, size_t>> matches(std::string_view text) const {
        std::vector<std::pair<size_t, size_t>> out;
        pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
        size_t start = 0;
        while (start <= text.size()) {
            int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, data, nullptr);
            if (rc < 0) break;
            PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
            if (ov[1] > ov[0]) {
                out.emplace_back(ov[0], ov[1]);
                start = ov[1];
            } else {
                start = ov[0] + (ov[0] < text.size() ? utf8_length((unsigned char)text[ov[0]]) : 1);
            }
        }
        pcre2_match_data_free(data);
        return out;
    }

private:
    pcre2_code* code_ = nullptr;
};

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTokenizerStep {
    enum Kind { split, byte_level, digits, metaspace } kind = split;
    std::shared_ptr<Regex> regex;  // split; byte_level with use_regex
    // split: what becomes of the delimiters (the matches, or with `invert` the text between them):
    // kept as pieces, removed, or joined to the piece before or after them
    enum class Behavior { isolated, removed, merged_with_previous, merged_with_next } behavior = Behavior::isolated;
    bool invert = false;
    bool add_prefix_space = false;
    bool individual_digits = false;
    // metaspace: spaces become `replacement`, which is prepended always, to the text's first piece
    // only ("first"), or never; with metaspace_split, each replacement starts a piece
    enum class Prepend { always, first, never } prepend = Prepend::always;
    std::string replacement;
    bool metaspace_split = false;
};

// sentencepiece-style normalizers of tokenizer.json, applied in order to each text between added tokens
struct NormalizerStep {
    enum Kind { nfc, prepend, replace } kind = nfc;
    std::string from, to;  // replace: every `from` by `to`; prepend: `to` before non-empty text
};

// tokenizer.json's decoders other than ByteLevel, applied in order to the list of token strings
// (the `tokenizers` library's decode chain), which is then joined
struct DecoderStep {
    enum Kind { replace, byte_fallback, fuse, strip, metaspace } kind = fuse;
    std::string from, to;         // replace
    std::string content;          // strip: the character removed, up to `start` at the front, `stop` at the back
    int64_t start = 0, stop = 0;  // strip
    std::string replacement;      // metaspace: it becomes a space, dropped in the first token when prepending
    bool drops_first_prefix = false;
};

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
    if (from.empty()) return text;
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
        text.replace(at, from.size(), to);
    return text;
}

bool is_valid_utf8(const std::string& bytes) {
    for (size_t i = 0; i < bytes.size();) {
        const unsigned char lead = (unsigned char)bytes[i];
        const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xe ? 3 : (lead >> 3) == 0x1e ? 4 : 0;
        if (n == 0 || i + n > bytes.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if (((unsigned char)bytes[i + k] >> 6) != 0x2) return false;
        const uint32_t cp = n == 1   ? lead
                            : n == 2 ? ((lead & 0x1fu) << 6) | (bytes[i + 1] & 0x3f)
                            : n == 3 ? ((lead & 0x0fu) << 12) | ((bytes[i + 1] & 0x3fu) << 6) | (bytes[i + 2] & 0x3f)
                                     : ((lead & 0x07u) << 18) | ((bytes[i + 1] & 0x3fu) << 12) | ((bytes[i + 2] & 0x3fu) << 6) |
                                           (bytes[i + 3] & 0x3f);
        const uint32_t shortest[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < shortest[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;  // overlong, surrogate
        i += n;
    }
    return true;
}

// The `tokenizers` library's decoders, one step over the token strings.
std::vector<std::string> apply_decoder(const DecoderStep& step, std::vector<std::string> tokens) {
    switch (step.kind) {
        case DecoderStep::replace:
            for (auto& t : tokens) t = replace_all(t, step.from, step.to);
            return tokens;
        case DecoderStep::byte_fallback: {  // runs of <0xXX> become their bytes; bytes that are not UTF-8, one U+FFFD each
            std::vector<std::string> out;
            std::string bytes;
            size_t byte_tokens = 0;
            auto flush = [&] {
                if (byte_tokens == 0) return;
                if (is_valid_utf8(bytes))
                    out.push_back(bytes);
                else
                    for (size_t i = 0; i < byte_tokens; ++i) out.push_back("\xef\xbf\xbd");
                bytes.clear();
                byte_tokens = 0;
            };
            for (auto& t : tokens) {
                unsigned value = 0;
                if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit((unsigned char)t[3]) &&
                    std::isxdigit((unsigned char)t[4]) && std::sscanf(t.c_str() + 3, "%2x", &value) == 1) {
                    bytes += char(value);
                    ++byte_tokens;
                } else {
                    flush();
                    out.push_back(std::move(t));
                }
            }
            flush();
            return out;
        }
        case DecoderStep::fuse: {
            std::string joined;
            for (const auto& t : tokens) joined += t;
            return {joined};
        }
        case DecoderStep::strip:
            for (auto& t : tokens) {
                std::vector<std::string> chars = utf8_chars(t);
                size_t begin = 0, end = chars.size();
                while (begin < end && begin < size_t(step.start) && chars[begin] == step.content) ++begin;
                while (end > begin && chars.size() - end < size_t(step.stop) && chars[end - 1] == step.content) --end;
                std::string kept;
                for (size_t i = begin; i < end; ++i) kept += chars[i];
                t = kept;
            }
            return tokens;
        case DecoderStep::metaspace:
            for (size_t i = 0; i < tokens.size(); ++i)
                tokens[i] = replace_all(tokens[i], step.replacement, i == 0 && step.drops_first_prefix ? "" : " ");
            return tokens;
    }
    return tokens;
}

// Splits each piece by the step. Byte-level mapping is applied separately (it does not split).
std::vector<std::string> apply_split(const PreTokenizerStep& step, const std::vector<std::string>& pieces) {
    std::vector<std::string> out;
    for (const auto& piece : pieces) {
        if (step.kind == PreTokenizerStep::digits) {
            std::string current;
            bool current_is_digit = false;
            for (const auto& ch : utf8_chars(piece)) {
                bool digit = ch.size() == 1 && ch[0] >= '0' && ch[0] <= '9';
                if (!current.empty() && (digit != current_is_digit || (digit && step.individual_digits))) {
                    out.push_back(current);
                    current.clear();
                }
                current += ch;
                current_is_digit = digit;
            }
            if (!current.empty()) out.push_back(current);
            continue;
        }
        // the piece as consecutive segments [begin, end), each a delimiter or not (as tokenizers' split)
        struct Segment {
            size_t begin, end;
            bool delimiter;
        };
        std::vector<Segment> segments;
        size_t last = 0;
        for (auto [b, e] : step.regex->matches(piece)) {
            if (b > last) segments.push_back({last, b, step.invert});
            segments.push_back({b, e, !step.invert});
            last = e;
        }
        if (last < piece.size()) segments.push_back({last, piece.size(), step.invert});
        using Behavior = PreTokenizerStep::Behavior;
        if (step.behavior == Behavior::merged_with_next) std::reverse(segments.begin(), segments.end());
        std::vector<Segment> kept;
        bool previous_delimiter = false;
        for (const Segment& s : segments) {
            const bool merge = s.delimiter && !previous_delimiter && !kept.empty();
            previous_delimiter = s.delimiter;
            if (step.behavior == Behavior::removed && s.delimiter) continue;
            if (merge && step.behavior == Behavior::merged_with_previous)
                kept.back().end = s.end;
            else if (merge && step.behavior == Behavior::merged_with_next)
                kept.back().begin = s.begin;
            else
                kept.push_back(s);
        }
        if (step.behavior == Behavior::merged_with_next) std::reverse(kept.begin(), kept.end());
        for (const Segment& s : kept) out.emplace_back(piece.substr(s.begin, s.end - s.begin));
    }
    return out;
}

// A pattern that matches `text` literally (tokenizers' Split with a String pattern)
std::string literal_pattern(const std::string& text) {
    std::string out;
    for (char c : text) {
        if ((unsigned char)c < 0x80 && !std::isalnum((unsigned char)c)) out += '\\';
        out += c;
    }
    return out;
}

struct AddedToken {
    std::string content;
    int64_t id;
    bool special;
    bool lstrip, rstrip;
};

// ---- BPE from tokenizer.json: byte-level (GPT-2 style) or sentencepiece-style ("▁" for spaces) -
class BpeTokenizer : public Tokenizer {
public:
    BpeTokenizer(const json& j, const std::string& file) {
        const json& model = j.at("model");
        std::string type = model.value("type", "");
        if (type != "BPE") throw bad_tokenizer(file, "model type \"" + type + "\" is not supported (supported: BPE)");
        for (const auto& [token, id_value] : model.at("vocab").items()) {
            const int64_t id = token_id(id_value, file + ": model.vocab[\"" + token + "\"]");
            vocab_[token] = id;
            if (id >= int64_t(id_to_token_.size())) id_to_token_.resize(size_t(id) + 1);
            id_to_token_[size_t(id)] = token;
        }
        int rank = 0;
        for (const auto& merge : model.at("merges")) {
            std::string a, b;
            if (merge.is_string()) {  // "a b"
                std::string m = merge.get<std::string>();
                auto space = m.find(' ', 1);
                if (space == std::string::npos) throw bad_tokenizer(file, "malformed merge \"" + m + "\"");
                a = m.substr(0, space);
                b = m.substr(space + 1);
            } else if (merge.is_array() && merge.size() == 2) {  // ["a", "b"]
                a = merge[0].get<std::string>();
                b = merge[1].get<std::string>();
            } else {
                throw bad_tokenizer(file, "malformed merge " + merge.dump());
            }
            merge_ranks_.emplace(a + '\x01' + b, rank++);
        }
        byte_fallback_ = model.value("byte_fallback", false);
        ignore_merges_ = model.value("ignore_merges", false);
        if (model.contains("unk_token") && model["unk_token"].is_string()) unk_ = token_to_id(model["unk_token"]);
        if (!model.value("continuing_subword_prefix", json()).is_null() || !model.value("end_of_word_suffix", json()).is_null())
            throw bad_tokenizer(file, "BPE continuing_subword_prefix / end_of_word_suffix are not supported");

        if (j.contains("added_tokens"))
            for (const auto& t : j["added_tokens"]) {
                AddedToken a{t.at("content").get<std::string>(),
                             token_id(t.at("id"), file + ": added_tokens[" + std::to_string(added_.size()) + "].id"),
                             t.value("special", false), t.value("lstrip", false), t.value("rstrip", false)};
                if (a.content.empty())
                    throw bad_tokenizer(file, "added_tokens[" + std::to_string(added_.size()) + "] is empty");
                added_.push_back(a);
                vocab_.emplace(a.content, a.id);
                if (a.id >= int64_t(id_to_token_.size())) id_to_token_.resize(a.id + 1);
                id_to_token_[a.id] = a.content;
                added_by_id_[a.id] = added_.size() - 1;
            }
        // longest first, so "<|im_start|>" wins over a shorter token at the same position
        std::stable_sort(added_.begin(), added_.end(),
                         [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
        added_by_id_.clear();
        for (size_t i = 0; i < added_.size(); ++i) added_by_id_[added_[i].id] = i;

        parse_normalizer(j.value("normalizer", json()), file);
        parse_pre_tokenizer(j.value("pre_tokenizer", json()), file);
        // sentencepiece-style files (Llama 2, Mistral, TinyLlama as transformers converts them): spaces
        // become "▁" in a normalizer or a Metaspace pre-tokenizer, and tokens are text, not mapped bytes
        const bool metaspace = std::any_of(steps_.begin(), steps_.end(),
                                           [](const PreTokenizerStep& p) { return p.kind == PreTokenizerStep::metaspace; }) ||
                               std::any_of(normalizers_.begin(), normalizers_.end(), [](const NormalizerStep& n) {
                                   return n.kind == NormalizerStep::replace && n.from == " ";
                               });
        if (byte_level_ == metaspace)
            throw bad_tokenizer(file, byte_level_ ? "mixes a ByteLevel pre-tokenizer with sentencepiece-style spaces"
                                                  : "only byte-level BPE files (a ByteLevel pre-tokenizer) and "
                                                    "sentencepiece-style ones (spaces as \"▁\": a Metaspace pre-tokenizer "
                                                    "or a Replace normalizer) are supported");
        // tokenizers matches an added token marked "normalized": true on the normalized text (where a
        // Prepend or Replace normalizer changes what it matches); Grove matches on the raw text only
        if (!byte_level_ && !normalizers_.empty())
            for (const auto& t : j.value("added_tokens", json::array()))
                if (t.value("normalized", false))
                    throw bad_tokenizer(file, "added token \"" + t.value("content", std::string()) +
                                                  "\" is matched on normalized text (\"normalized\": true), which "
                                                  "Grove does not do; save the tokenizer again with a current "
                                                  "transformers (AutoTokenizer.from_pretrained, then save_pretrained), "
                                                  "which marks it false");
        const json& post = j.value("post_processor", json());
        parse_post_processor(post, file);
        const json& decoder = j.value("decoder", json());
        if (byte_level_) {
            if (!decoder.is_null() && decoder.value("type", "") != "ByteLevel")
                throw bad_tokenizer(file, "decoder \"" + decoder.value("type", "") +
                                              "\" is not supported with a ByteLevel pre-tokenizer (supported: ByteLevel)");
        } else {
            parse_decoder(decoder, file);
        }
    }

    std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override {
        std::vector<int64_t> ids;
        if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
        // added tokens are matched on the raw text first; the segments between them are tokenized
        size_t pos = 0;
        while (pos <= text.size()) {
            size_t best = std::string::npos;
            const AddedToken* found = nullptr;
            for (const auto& a : added_) {
                size_t at = text.find(a.content, pos);
                if (at != std::string::npos && (best == std::string::npos || at < best)) {
                    best = at;
                    found = &a;
                }
            }
            size_t end = found ? best : text.size();
            std::string_view segment = text.substr(pos, end - pos);
            if (found && found->lstrip)
                while (!segment.empty() && std::isspace((unsigned char)segment.back())) segment.remove_suffix(1);
            encode_segment(segment, pos == 0, ids);
            if (!found) break;
            ids.push_back(found->id);
            pos = best + found->content.size();
            if (found->rstrip)
                while (pos < text.size() && std::isspace((unsigned char)text[pos])) ++pos;
        }
        if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
        return ids;
    }

    std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
        if (!byte_level_) return decode_with_steps(ids, skip_special_tokens);
        std::string out, pending;
        auto flush = [&] {
            for (const auto& ch : utf8_chars(pending)) {
                auto it = byte_map().to_byte.find(ch);
                if (it != byte_map().to_byte.end())
                    out += char(it->second);
                else
                    out += ch;
            }
            pending.clear();
        };
        for (int64_t id : ids) {
            if (id < 0 || id >= int64_t(id_to_token_.size())) continue;
            auto added = added_by_id_.find(id);
            if (added != added_by_id_.end()) {
                if (skip_special_tokens && added_[added->second].special) continue;
                flush();
                out += added_[added->second].content;
                continue;
            }
            pending += id_to_token_[id];
        }
        flush();
        return out;
    }

    int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
    std::optional<int64_t> token_to_id(const std::string& token) const override {
        auto it = vocab_.find(token);
        return it == vocab_.end() ? std::nullopt : std::optional<int64_t>(it->second);
    }
    bool is_special(int64_t id) const override {
        auto it = added_by_id_.find(id);
        return it != added_by_id_.end() && added_[it->second].special;
    }

private:
    // every token through the decoder steps, added tokens too, as the `tokenizers` library decodes
    std::string decode_with_steps(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
        std::vector<std::string> tokens;
        for (int64_t id : ids) {
            if (id < 0 || id >= int64_t(id_to_token_.size()) || id_to_token_[size_t(id)].empty()) continue;  // no token
            if (skip_special_tokens && is_special(id)) continue;
            tokens.push_back(id_to_token_[size_t(id)]);
        }
        for (const auto& step : decoders_) tokens = apply_decoder(step, std::move(tokens));
        std::string out;
        for (size_t i = 0; i < tokens.size(); ++i)  // without a decoder, tokenizers joins the tokens with spaces
            out += (i > 0 && decoders_.empty() ? " " : "") + tokens[i];
        return out;
    }

    static std::string string_pattern(const json& step, const std::string& file, const char* what) {
        const json& pattern = step.at("pattern");
        if (!pattern.contains("String"))
            throw bad_tokenizer(file, std::string(what) + " with a Regex pattern is not supported (a String pattern is)");
        return pattern["String"].get<std::string>();
    }

    void parse_normalizer(const json& n, const std::string& file) {
        if (n.is_null()) return;
        std::string type = n.value("type", "");
        if (type == "Sequence") {
            for (const auto& step : n.at("normalizers")) parse_normalizer(step, file);
        } else if (type == "NFC") {
            normalizers_.push_back({NormalizerStep::nfc, "", ""});
        } else if (type == "Prepend") {
            normalizers_.push_back({NormalizerStep::prepend, "", n.at("prepend").get<std::string>()});
        } else if (type == "Replace") {
            normalizers_.push_back(
                {NormalizerStep::replace, string_pattern(n, file, "Replace normalizer"), n.at("content").get<std::string>()});
        } else {
            throw bad_tokenizer(file,
                                "normalizer \"" + type + "\" is not supported (supported: NFC, Prepend, Replace, Sequence)");
        }
    }

    void parse_decoder(const json& d, const std::string& file) {
        if (d.is_null()) return;  // the tokens joined
        const std::string type = d.value("type", "");
        DecoderStep step;
        if (type == "Sequence") {
            for (const auto& inner : d.at("decoders")) parse_decoder(inner, file);
            return;
        } else if (type == "Replace") {
            step = {DecoderStep::replace, string_pattern(d, file, "Replace decoder"), d.at("content").get<std::string>()};
        } else if (type == "ByteFallback") {
            step.kind = DecoderStep::byte_fallback;
        } else if (type == "Fuse") {
            step.kind = DecoderStep::fuse;
        } else if (type == "Strip") {
            step.kind = DecoderStep::strip;
            step.content = d.at("content").get<std::string>();
            step.start = d.value("start", int64_t(0));
            step.stop = d.value("stop", int64_t(0));
        } else if (type == "Metaspace") {
            step.kind = DecoderStep::metaspace;
            step.replacement = d.value("replacement", std::string("\xe2\x96\x81"));
            step.drops_first_prefix = metaspace_prepend(d, file) != PreTokenizerStep::Prepend::never;
        } else {
            throw bad_tokenizer(file, "decoder \"" + type +
                                          "\" is not supported (supported: ByteLevel; or Replace, ByteFallback, Fuse, "
                                          "Strip, Metaspace and Sequence for sentencepiece-style files)");
        }
        decoders_.push_back(step);
    }

    // Metaspace's prepend_scheme, or the older add_prefix_space (true: always)
    static PreTokenizerStep::Prepend metaspace_prepend(const json& m, const std::string& file) {
        if (!m.contains("prepend_scheme"))
            return m.value("add_prefix_space", true) ? PreTokenizerStep::Prepend::always : PreTokenizerStep::Prepend::never;
        const std::string scheme = m["prepend_scheme"].get<std::string>();
        if (scheme == "always") return PreTokenizerStep::Prepend::always;
        if (scheme == "first") return PreTokenizerStep::Prepend::first;
        if (scheme == "never") return PreTokenizerStep::Prepend::never;
        throw bad_tokenizer(file, "Metaspace prepend_scheme \"" + scheme + "\" is not one of always, first, never");
    }

    void parse_pre_tokenizer(const json& p, const std::string& file) {
        if (p.is_null()) return;
        std::string type = p.value("type", "");
        if (type == "Sequence") {
            for (const auto& step : p.at("pretokenizers")) parse_pre_tokenizer(step, file);
        } else if (type == "Split") {
            PreTokenizerStep s;
            s.kind = PreTokenizerStep::split;
            const json& pattern = p.at("pattern");
            if (pattern.contains("Regex"))
                s.regex = std::make_shared<Regex>(pattern["Regex"].get<std::string>(), file);
            else if (pattern.contains("String"))  // Gemma's: the literal " "
                s.regex = std::make_shared<Regex>(literal_pattern(pattern["String"].get<std::string>()), file);
            else
                throw bad_tokenizer(file, "Split pre-tokenizer pattern " + pattern.dump() + " is neither Regex nor String");
            using Behavior = PreTokenizerStep::Behavior;
            const std::map<std::string, Behavior> behaviors = {{"Isolated", Behavior::isolated},
                                                               {"Removed", Behavior::removed},
                                                               {"MergedWithPrevious", Behavior::merged_with_previous},
                                                               {"MergedWithNext", Behavior::merged_with_next}};
            const std::string behavior = p.value("behavior", "Isolated");
            if (!behaviors.count(behavior))
                throw bad_tokenizer(file, "Split behavior \"" + behavior +
                                              "\" is not supported (supported: Isolated, Removed, MergedWithPrevious, "
                                              "MergedWithNext)");
            s.behavior = behaviors.at(behavior);
            s.invert = p.value("invert", false);
            steps_.push_back(s);
        } else if (type == "ByteLevel") {
            PreTokenizerStep s;
            s.kind = PreTokenizerStep::byte_level;
            s.add_prefix_space = p.value("add_prefix_space", false);
            if (p.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern, file);
            steps_.push_back(s);
            byte_level_ = true;
        } else if (type == "Digits") {
            PreTokenizerStep s;
            s.kind = PreTokenizerStep::digits;
            s.individual_digits = p.value("individual_digits", false);
            steps_.push_back(s);
        } else if (type == "Metaspace") {
            PreTokenizerStep s;
            s.kind = PreTokenizerStep::metaspace;
            s.replacement = p.value("replacement", std::string("\xe2\x96\x81"));
            s.prepend = metaspace_prepend(p, file);
            s.metaspace_split = p.value("split", true);
            steps_.push_back(s);
        } else {
            throw bad_tokenizer(file, "pre-tokenizer \"" + type +
                                          "\" is not supported (supported: ByteLevel, Split, Digits, Metaspace, Sequence)");
        }
    }

    void parse_post_processor(const json& p, const std::string& file) {
        if (p.is_null()) return;
        std::string type = p.value("type", "");
        if (type == "Sequence") {
            for (const auto& step : p.at("processors")) parse_post_processor(step, file);
        } else if (type == "ByteLevel") {
            return;  // only trims offsets
        } else if (type == "TemplateProcessing") {
            bool after = false;
            for (const auto& piece : p.at("single")) {
                if (piece.contains("Sequence")) {
                    after = true;
                } else if (piece.contains("SpecialToken")) {
                    std::string name = piece["SpecialToken"].at("id").get<std::string>();
                    const json& special = p.at("special_tokens").at(name);
                    for (const auto& id : special.at("ids"))
                        (after ? suffix_ids_ : prefix_ids_)
                            .push_back(token_id(id, file + ": post_processor.special_tokens." + name));
                }
            }
        } else {
            throw bad_tokenizer(file,
                                "post-processor \"" + type + "\" is not supported (supported: TemplateProcessing, ByteLevel)");
        }
    }

    static std::string nfc(const std::string& text) {
        UErrorCode status = U_ZERO_ERROR;
        const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
        icu::UnicodeString normalized = normalizer->normalize(icu::UnicodeString::fromUTF8(text), status);
        if (!U_SUCCESS(status)) return text;
        std::string out;
        normalized.toUTF8String(out);
        return out;
    }

    // Metaspace: spaces as the replacement, prepended as the scheme says (`first`: only to the text
    // that starts the input, not to one after an added token), split before each replacement
    static std::vector<std::string> metaspace(const PreTokenizerStep& step, std::vector<std::string> pieces,
                                              bool starts_input) {
        std::vector<std::string> out;
        for (size_t i = 0; i < pieces.size(); ++i) {
            std::string piece = replace_all(pieces[i], " ", step.replacement);
            const bool prepend = step.prepend == PreTokenizerStep::Prepend::always ||
                                 (step.prepend == PreTokenizerStep::Prepend::first && starts_input && i == 0);
            if (prepend && piece.compare(0, step.replacement.size(), step.replacement) != 0) piece.insert(0, step.replacement);
            if (!step.metaspace_split) {
                out.push_back(piece);
                continue;
            }
            size_t begin = 0;
            for (size_t at = piece.find(step.replacement, 1); at != std::string::npos;
                 at = piece.find(step.replacement, at + 1)) {
                out.push_back(piece.substr(begin, at - begin));
                begin = at;
            }
            out.push_back(piece.substr(begin));
        }
        return out;
    }

    void encode_segment(std::string_view segment, bool starts_input, std::vector<int64_t>& ids) const {
        if (segment.empty()) return;
        std::string text(segment);
        for (const auto& n : normalizers_) {
            if (n.kind == NormalizerStep::nfc) text = nfc(text);
            if (n.kind == NormalizerStep::prepend && !text.empty()) text.insert(0, n.to);
            if (n.kind == NormalizerStep::replace) text = replace_all(text, n.from, n.to);
        }
        std::vector<std::string> pieces{text};
        for (const auto& step : steps_) {
            if (step.kind == PreTokenizerStep::byte_level) {
                if (step.add_prefix_space && !pieces.empty() && !pieces.front().empty() && pieces.front()[0] != ' ')
                    pieces.front().insert(0, " ");
                if (step.regex) pieces = apply_split(step, pieces);
            } else if (step.kind == PreTokenizerStep::metaspace) {
                pieces = metaspace(step, std::move(pieces), starts_input);
            } else {
                pieces = apply_split(step, pieces);
            }
        }
        for (const auto& piece : pieces) {
            if (!byte_level_) {
                bpe(piece, ids);
                continue;
            }
            std::string mapped;
            for (unsigned char c : piece) mapped += byte_map().to_unicode[c];
            bpe(mapped, ids);
        }
    }

    void bpe(const std::string& word, std::vector<int64_t>& ids) const {
        if (word.empty()) return;
        if (ignore_merges_) {
            if (auto id = token_to_id(word)) {
                ids.push_back(*id);
                return;
            }
        }
        std::vector<std::string> symbols = utf8_chars(word);
        while (symbols.size() > 1) {
            int best_rank = INT32_MAX;
            size_t best = 0;
            for (size_t i = 0; i + 1 < symbols.size(); ++i) {
                auto it = merge_ranks_.find(symbols[i] + '\x01' + symbols[i + 1]);
                if (it != merge_ranks_.end() && it->second < best_rank) {
                    best_rank = it->second;
                    best = i;
                }
            }
            if (best_rank == INT32_MAX) break;
            // merge every non-overlapping occurrence of the best pair, left to right
            std::string a = symbols[best], b = symbols[best + 1];
            std::vector<std::string> merged;
            for (size_t i = 0; i < symbols.size();) {
                if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
                    merged.push_back(a + b);
                    i += 2;
                } else {
                    merged.push_back(symbols[i++]);
                }
            }
            symbols.swap(merged);
        }
        for (const auto& s : symbols) {
            if (auto id = token_to_id(s)) {
                ids.push_back(*id);
            } else if (byte_fallback_) {
                for (unsigned char c : s) {
                    char name[8];
                    std::snprintf(name, sizeof name, "<0x%02X>", c);
                    if (auto byte_id = token_to_id(name))
                        ids.push_back(*byte_id);
                    else if (unk_)
                        ids.push_back(*unk_);
                }
            } else if (unk_) {
                ids.push_back(*unk_);
            }
            // a symbol with no id, no fallback and no unk token is dropped, as tokenizers does
        }
    }

    std::unordered_map<std::string, int64_t> vocab_;
    std::vector<std::string> id_to_token_;
    std::unordered_map<std::string, int> merge_ranks_;
    std::vector<AddedToken> added_;
    std::unordered_map<int64_t, size_t> added_by_id_;
    std::vector<NormalizerStep> normalizers_;
    std::vector<PreTokenizerStep> steps_;
    std::vector<DecoderStep> decoders_;  // sentencepiece-style files; byte-level ones decode by the byte map
    std::vector<int64_t> prefix_ids_, suffix_ids_;
    std::optional<int64_t> unk_;
    bool byte_fallback_ = false, ignore_merges_ = false, byte_level_ = false;
};

// ---- sentencepiece -----------------------------------------------------------------------------
class SentencePieceTokenizer : public Tokenizer {
public:
    explicit SentencePieceTokenizer(const std::string& file) {
        auto status = processor_.Load(file);
        if (!status.ok()) throw bad_tokenizer(file, "cannot load the sentencepiece model: " + status.ToString());
    }
    std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override {
        std::vector<int> pieces;
        processor_.Encode(text, &pieces);
        std::vector<int64_t> ids;
        if (add_special_tokens && config_.add_bos_token && config_.bos_id) ids.push_back(*config_.bos_id);
        ids.insert(ids.end(), pieces.begin(), pieces.end());
        if (add_special_tokens && config_.add_eos_token && config_.eos_id) ids.push_back(*config_.eos_id);
        return ids;
    }
    std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
        std::vector<int> pieces;
        for (int64_t id : ids)
            if (id >= 0 && id < processor_.GetPieceSize() && !(skip_special_tokens && is_special(id)))
                pieces.push_back(int(id));
        std::string out;
        processor_.Decode(pieces, &out);
        return out;
    }
    int64_t vocab_size() const override { return processor_.GetPieceSize(); }
    std::optional<int64_t> token_to_id(const std::string& token) const override {
        int id = processor_.PieceToId(token);
        if (id == processor_.unk_id() && token != processor_.IdToPiece(id)) return std::nullopt;
        return id;
    }
    bool is_special(int64_t id) const override { return processor_.IsControl(int(id)) || processor_.IsUnknown(int(id)); }
    void set_config(TokenizerConfig c) { config_ = std::move(c); }

private:
    sentencepiece::SentencePieceProcessor processor_;
};

std::optional<std::string> token_text(const json& j, const char* key) {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (j[key].is_string()) return j[key].get<std::string>();
    if (j[key].is_object() && j[key].contains("content")) return j[key]["content"].get<std::string>();
    return std::nullopt;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& folder) {
    fs::path json_file = fs::path(folder) / "tokenizer.json";
    fs::path sp_file = fs::path(folder) / "tokenizer.model";
    fs::path config_file = fs::path(folder) / "tokenizer_config.json";
    json config = fs::exists(config_file) ? read_json_file(config_file) : json::object();
    std::unique_ptr<Tokenizer> tokenizer;
    bool sentencepiece = false;
    if (fs::exists(json_file)) {
        json j = read_json_file(json_file);
        try {
            tokenizer = std::make_unique<BpeTokenizer>(j, json_file.string());
        } catch (const json::exception& e) {
            throw bad_tokenizer(json_file.string(), std::string("unexpected structure: ") + e.what());
        }
    } else if (fs::exists(sp_file)) {
        tokenizer = std::make_unique<SentencePieceTokenizer>(sp_file.string());
        sentencepiece = true;
    } else {
        throw Error(ErrorKind::input, folder + ": no tokenizer.json or tokenizer.model");
    }
    TokenizerConfig c;
    try {
        if (!config.is_object()) throw bad_tokenizer(config_file.string(), "not a JSON object");
        c.bos_token = token_text(config, "bos_token");
        c.eos_token = token_text(config, "eos_token");
        c.pad_token = token_text(config, "pad_token");
        c.unk_token = token_text(config, "unk_token");
        // sentencepiece Llama tokenizers add BOS by default (LlamaTokenizer's add_bos_token=True)
        c.add_bos_token = config.value("add_bos_token", sentencepiece);
        c.add_eos_token = config.value("add_eos_token", false);
        if (config.contains("chat_template")) {
            const json& t = config["chat_template"];
            if (t.is_string())
                c.chat_template = t.get<std::string>();
            else if (t.is_array())
                for (const auto& entry : t)
                    if (entry.value("name", "") == "default") c.chat_template = entry.value("template", "");
        }
    } catch (const json::exception& e) {
        throw bad_tokenizer(config_file.string(), std::string("unexpected structure: ") + e.what());
    }
    // newer transformers versions save the template in a file of its own, which takes priority over
    // tokenizer_config.json's when transformers loads the folder
    if (const fs::path template_file = fs::path(folder) / "chat_template.jinja"; fs::exists(template_file)) {
        std::ifstream in(template_file, std::ios::binary);
        if (!in) throw bad_tokenizer(template_file.string(), "cannot be read");
        c.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    auto resolve = [&](const std::optional<std::string>& token, const char* key) -> std::optional<int64_t> {
        if (!token) return std::nullopt;
        auto id = tokenizer->token_to_id(*token);
        if (!id) throw bad_tokenizer(config_file.string(), std::string(key) + " \"" + *token + "\" is not in the vocabulary");
        return id;
    };
    c.bos_id = resolve(c.bos_token, "bos_token");
    c.eos_id = resolve(c.eos_token, "eos_token");
    c.pad_id = resolve(c.pad_token, "pad_token");
    if (sentencepiece) static_cast<SentencePieceTokenizer*>(tokenizer.get())->set_config(c);
    tokenizer->config_ = c;
    return tokenizer;
}

void check_tokenizer_files(const std::string& folder) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
        const fs::path file = fs::path(folder) / name;
        if (fs::exists(file) && !read_json_file(file).is_object()) throw bad_tokenizer(file.string(), "not a JSON object");
    }
}

void copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir) {
    // the processor's files too (multimodal checkpoints: Gemma 3 4B), so AutoProcessor loads a checkpoint
    for (const char* f :
         {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
          "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "processor_config.json"}) {
        fs::path from = fs::path(from_dir) / f;
        if (fs::exists(from)) fs::copy_file(from, fs::path(to_dir) / f, fs::copy_options::overwrite_existing);
    }
}

// ---- training (sentencepiece) ------------------------------------------------------------------
void train_sentencepiece(const std::vector<std::string>& corpus, const std::string& out_dir, const TokenizerTrainOptions& o) {
    if (corpus.empty()) throw Error(ErrorKind::input, "tokenizer training: the corpus is empty");
    if (o.model_type != "bpe" && o.model_type != "unigram")
        throw Error(ErrorKind::usage, "tokenizer training: model type must be bpe or unigram, not " + o.model_type);
    fs::create_directories(out_dir);
    fs::path text = fs::path(out_dir) / ".corpus.txt";
    {
        std::ofstream out(text);
        for (const auto& line : corpus) {
            std::string flat = line;
            std::replace(flat.begin(), flat.end(), '\n', ' ');  // sentencepiece reads one sentence per line
            out << flat << "\n";
        }
    }
    std::string symbols;
    for (const auto& s : o.symbols) symbols += (symbols.empty() ? "" : ",") + s;
    std::string args = "--input=" + text.string() + " --model_prefix=" + (fs::path(out_dir) / "tokenizer").string() +
                       " --vocab_size=" + std::to_string(o.vocab_size) + " --model_type=" + o.model_type +
                       " --character_coverage=1.0 --byte_fallback=true --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=3"
                       " --minloglevel=2 --hard_vocab_limit=false"
                       // as Llama's own model: no NFKC, whitespace kept (a newline is a byte piece), so
                       // transformers' tokenizer.json conversion gives the same ids as libsentencepiece
                       " --normalization_rule_name=identity --remove_extra_whitespaces=false" +
                       (o.split_digits ? " --split_digits=true" : "") +
                       (symbols.empty() ? "" : " --user_defined_symbols=" + symbols);
    auto status = sentencepiece::SentencePieceTrainer::Train(args);
    fs::remove(text);
    if (!status.ok()) throw Error(ErrorKind::runtime, "tokenizer training failed: " + status.ToString());
    // add_bos_token false: Grove (like TRL) tokenizes prompts without special tokens, so a model trained
    // here never sees BOS; transformers' tokenizer(prompt) must then give the same ids as training did.
    json config = {{"tokenizer_class", "LlamaTokenizer"},
                   {"bos_token", "<s>"},
                   {"eos_token", "</s>"},
                   {"unk_token", "<unk>"},
                   {"pad_token", "<pad>"},
                   {"add_bos_token", false},
                   {"add_eos_token", false},
                   {"legacy", false}};  // no extra "▁" after special tokens, as libsentencepiece
    if (!o.chat_template.empty()) config["chat_template"] = o.chat_template;
    std::ofstream(fs::path(out_dir) / "tokenizer_config.json") << config.dump(2) << "\n";
}

// ---- chat templates ----------------------------------------------------------------------------
namespace {
// Python's str.isspace() code points: what Jinja's `trim` (str.strip()) removes
bool python_space(char32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The UTF-8 code point starting at s[i] and its length (a stray byte counts as itself, length 1).
std::pair<char32_t, size_t> code_point_at(const std::string& s, size_t i) {
    const auto byte = [&](size_t k) { return char32_t(static_cast<unsigned char>(s[k])); };
    const char32_t lead = byte(i);
    const size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xe ? 3 : (lead >> 3) == 0x1e ? 4 : 1;
    if (i + length > s.size()) return {lead, 1};
    char32_t c = length == 1 ? lead : lead & (0x3f >> (length - 1));
    for (size_t k = 1; k < length; ++k) c = (c << 6) | (byte(i + k) & 0x3f);
    return {c, length};
}

// Jinja's `trim`: Python's str.strip(), every Unicode space at both ends (`front` false: rstrip())
std::string trim(const std::string& s, bool front = true) {
    size_t begin = 0;
    while (front && begin < s.size()) {
        const auto [c, length] = code_point_at(s, begin);
        if (!python_space(c)) break;
        begin += length;
    }
    size_t end = s.size();
    while (end > begin) {
        size_t start = end - 1;  // back to the code point's first byte
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
        const auto [c, length] = code_point_at(s, start);
        if (start + length != end || !python_space(c)) break;
        end = start;
    }
    return s.substr(begin, end - begin);
}

// A float as Python writes it (repr): the shortest digits that read back, as nlohmann gives them,
// but in fixed notation up to 16 digits before the point, where nlohmann switches to an exponent
// after 15 (1e15 is "1000000000000000.0" in Python, "1e+15" in nlohmann).
std::string python_float(double x) {
    std::string text = nlohmann::json(x).dump();
    const size_t e = text.find("e+15");
    if (e == std::string::npos) return text;
    const bool negative = text[0] == '-';
    std::string digits;
    for (size_t i = negative; i < e; ++i)
        if (text[i] != '.') digits += text[i];
    std::string whole = digits.substr(0, std::min<size_t>(16, digits.size())),
                fraction = digits.size() > 16 ? digits.substr(16) : "0";
    whole.resize(16, '0');
    return (negative ? "-" : "") + whole + "." + fraction;
}

// JSON as the chat templates' `tojson` writes it (Python's json.dumps): ", " and ": " between
// items, keys in their given order, non-ASCII kept.
std::string python_json(const nlohmann::ordered_json& value) {
    std::string out;
    if (value.is_object()) {
        for (auto it = value.begin(); it != value.end(); ++it)
            out += (out.empty() ? "" : ", ") + nlohmann::json(it.key()).dump() + ": " + python_json(it.value());
        return "{" + out + "}";
    }
    if (value.is_array()) {
        for (const auto& item : value) out += (out.empty() ? "" : ", ") + python_json(item);
        return "[" + out + "]";
    }
    if (value.is_number_float()) return python_float(value.get<double>());
    return value.dump();
}

// JSON as `tojson(indent=4)` writes it (Python's json.dumps with an indent): one item per line, ","
// at line ends, ": " after keys; empty lists and objects stay "[]" and "{}".
std::string python_json_indented(const nlohmann::ordered_json& value, int indent, int depth = 0) {
    if ((!value.is_object() && !value.is_array()) || value.empty()) return python_json(value);
    const std::string inner = "\n" + std::string(size_t(indent * (depth + 1)), ' ');
    std::string out;
    for (auto it = value.begin(); it != value.end(); ++it) {
        out += out.empty() ? inner : "," + inner;
        if (value.is_object()) out += nlohmann::json(it.key()).dump() + ": ";
        out += python_json_indented(*it, indent, depth + 1);
    }
    return (value.is_object() ? "{" : "[") + out + "\n" + std::string(size_t(indent * depth), ' ') +
           (value.is_object() ? "}" : "]");
}

// The system turn of a ChatML conversation with tools, as Qwen2.5's and Qwen3's templates write it
// (the Hermes tool format): the system prompt, then every tool's schema, then the call format. With
// no system message, Qwen2.5 writes its default prompt (`default_system`); Qwen3 writes none.
std::string chatml_tools_turn(const std::vector<ChatMessage>& messages, const std::string& tools_json,
                              const std::optional<std::string>& default_system) {
    const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(tools_json, nullptr, false);
    if (tools.is_discarded() || !tools.is_array())
        throw Error(ErrorKind::input, "the environment's tools are not a JSON array of function schemas");
    std::string out = "<|im_start|>system\n";
    if (!messages.empty() && messages[0].role == "system")
        out += messages[0].content + "\n\n";
    else if (default_system)
        out += *default_system + "\n\n";
    out +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
        "function signatures within <tools></tools> XML tags:\n<tools>";
    for (const auto& tool : tools) out += "\n" + python_json(tool);
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n";
    return out;
}

// The character a Jinja string literal's backslash escape stands for: \n, \t, \\, \', \"
char jinja_unescaped(char escaped) { return escaped == 'n' ? '\n' : escaped == 't' ? '\t' : escaped; }

// The system prompt a ChatML checkpoint's template writes when a conversation opens without one
// (Qwen2.5's "You are Qwen, ...", Qwen2.5-Math's "Please reason step by step, ...", SmolLM2's "You
// are a helpful AI assistant named SmolLM, ..."): the text '<|im_start|>system\n...<|im_end|>' of a
// string literal in the template (Jinja's escapes undone) or of its plain text, or none. Text that
// an expression or a tag interrupts ('...' + x, {{ x }}) is not a default.
std::optional<std::string> chatml_default_system(const std::string& template_text) {
    for (const std::string opening : {"<|im_start|>system\\n", "<|im_start|>system\n"})
        for (size_t at = template_text.find(opening); at != std::string::npos; at = template_text.find(opening, at + 1)) {
            const bool in_literal = opening.back() != '\n';  // the escaped newline is inside a quoted string
            std::string text;
            for (size_t i = at + opening.size(); i < template_text.size();) {
                if (template_text.compare(i, 10, "<|im_end|>") == 0) {
                    if (!text.empty()) return text;
                    break;
                }
                const char c = template_text[i];
                if (in_literal ? (c == '\'' || c == '"')
                               : (template_text.compare(i, 2, "{{") == 0 || template_text.compare(i, 2, "{%") == 0 ||
                                  template_text.compare(i, 2, "{#") == 0))
                    break;  // an expression follows, not a default
                if (in_literal && c == '\\' && i + 1 < template_text.size()) {
                    text += jinja_unescaped(template_text[i + 1]);
                    i += 2;
                } else {
                    text += c;
                    ++i;
                }
            }
        }
    return std::nullopt;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string strip_newlines(std::string s, bool front, bool back) {
    if (back) s.erase(s.find_last_not_of('\n') + 1);
    if (front) s.erase(0, std::min(s.size(), s.find_first_not_of('\n')));
    return s;
}

// An assistant turn of Qwen3's template: the message's reasoning_content, or else content with a
// <think> block split into the reasoning and the answer; turns after the last user query keep their
// reasoning (the last turn always gets a block, empty or not), earlier turns lose it.
std::string qwen3_assistant_turn(const ChatMessage& message, bool after_last_query, bool last) {
    std::string content = message.content, reasoning = message.reasoning_content.value_or("");
    const size_t close = message.reasoning_content ? std::string::npos : content.find("</think>");
    if (close != std::string::npos) {
        const std::string before = strip_newlines(content.substr(0, close), false, true);
        const size_t open = before.rfind("<think>");
        reasoning = strip_newlines(open == std::string::npos ? before : before.substr(open + 7), true, false);
        content = strip_newlines(content.substr(content.rfind("</think>") + 8), true, false);
    }
    if (after_last_query && (last || !reasoning.empty()))
        return "<|im_start|>assistant\n<think>\n" + strip_newlines(reasoning, true, true) + "\n</think>\n\n" +
               strip_newlines(content, true, false);
    return "<|im_start|>assistant\n" + content;
}

// The date a template writes with transformers' strftime_now(format), local time: Llama 3.2's
// "%d %b %Y", SmolLM3's "%d %B %Y"
std::string today(const char* format) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char text[64];
    std::strftime(text, sizeof text, format, &local);
    return text;
}

// The date a Llama 3.1 template writes when given none: its `set date_string = "..."` (Meta's is
// "26 Jul 2024"; templates re-saved by other tools may spell it otherwise)
std::string llama3_default_date(const std::string& template_text) {
    const std::string key = "set date_string = \"";
    const size_t at = template_text.find(key);
    if (at == std::string::npos) return "26 Jul 2024";
    const size_t start = at + key.size(), end = template_text.find('"', start);
    return end == std::string::npos ? "26 Jul 2024" : template_text.substr(start, end - start);
}

// Llama 3.1's and 3.2's tool turn: what the model is told about the call format, then every tool's
// schema, indented.
std::string llama3_tools_text(const std::string& tools_json) {
    const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(tools_json, nullptr, false);
    if (tools.is_discarded() || !tools.is_array())
        throw Error(ErrorKind::input, "the conversation's tools are not a JSON array of function schemas");
    std::string out =
        "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
        "best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary "
        "of argument name and its value}.Do not use variables.\n\n";
    for (const auto& tool : tools) out += python_json_indented(tool, 4) + "\n\n";
    return out;
}

// An assistant's tool call as Llama 3.1's and 3.2's templates write it: the whole turn is one JSON
// object whose arguments are "parameters" (through tojson, so text arguments are quoted). The
// templates raise on more than one call and write no content beside it: Grove refuses both.
std::string llama3_tool_call(const ChatMessage& m, const std::string& family) {
    if (m.tool_calls.size() != 1)
        throw Error(ErrorKind::input, family + " chat template: an assistant message has " +
                                          std::to_string(m.tool_calls.size()) +
                                          " tool calls, and the template writes one call per turn (it raises \"This "
                                          "model only supports single tool-calls at once!\"): split the calls into turns "
                                          "of one call each");
    if (!trim(m.content).empty())
        throw Error(ErrorKind::input, family +
                                          " chat template: an assistant message has both \"content\" and "
                                          "\"tool_calls\", and the template writes only the call, so its content "
                                          "would be lost: move the content into an assistant message of its own, or "
                                          "leave it out");
    return "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"" + m.tool_calls[0].name +
           "\", \"parameters\": " + python_json(nlohmann::ordered_json::parse(m.tool_calls[0].arguments_json)) + "}<|eot_id|>";
}

// Llama 3.1 / 3.2 Instruct's templates: a system turn that always opens with the knowledge cut-off
// and a date (3.1: its fixed default; 3.2: today's), then the system message; Llama 3's turns; tool
// results (role tool or ipython) as ipython turns holding their JSON text. With tools (even an empty
// list: the templates test `tools is not none`), the system turn first says "Environment: ipython",
// and the tools go into the first message after it, written as a user turn whatever its role (the
// templates' default tools_in_user_message).
std::string render_llama3_dated(const std::string& family, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                const std::string& bos, const std::string& date, const std::string& tools_json) {
    const bool leading_system = !messages.empty() && messages[0].role == "system", tools = !tools_json.empty();
    std::string out = bos + "<|start_header_id|>system<|end_header_id|>\n\n" + (tools ? "Environment: ipython\n" : "") +
                      "Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n" +
                      (leading_system ? trim(messages[0].content) : "") + "<|eot_id|>";
    size_t first = leading_system;
    if (tools) {
        if (first == messages.size())
            throw Error(ErrorKind::input, family +
                                              " chat template: the conversation has tools but no message after the "
                                              "system prompt, and the template writes the tools into the first user "
                                              "message (it raises \"Cannot put tools in the first user message when "
                                              "there's no first user message!\"): add one");
        if (messages[first].role != "user" || !messages[first].tool_calls.empty())
            throw Error(ErrorKind::input, family +
                                              " chat template: the conversation has tools, which the template writes "
                                              "into the first message after the system prompt as a user turn, but "
                                              "that message is the " +
                                              messages[first].role +
                                              "'s (its role and any tool calls would be lost): open the conversation "
                                              "with a user message");
        out += "<|start_header_id|>user<|end_header_id|>\n\n" + llama3_tools_text(tools_json) + trim(messages[first].content) +
               "<|eot_id|>";
        ++first;
    }
    for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "tool" || m.role == "ipython")  // Jinja's `is iterable` holds for text: it is written as JSON
            out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + nlohmann::json(m.content).dump() + "<|eot_id|>";
        else if (!m.tool_calls.empty())
            out += llama3_tool_call(m, family);
        else
            out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

// A tool message of Qwen2.5's and Qwen3's templates: consecutive tool messages share one user turn,
// each response inside <tool_response> tags.
std::string qwen_tool_response(const std::vector<ChatMessage>& messages, size_t i) {
    std::string out;
    if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
    out += "\n<tool_response>\n" + messages[i].content + "\n</tool_response>";
    if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    return out;
}

// An assistant's tool calls as Qwen's templates write them after its content: Qwen2.5's each after a
// newline, the arguments through tojson (text quoted); Qwen3's with no newline before a first call
// that follows no content, text arguments as they are.
std::string qwen_tool_calls(const std::vector<ToolCall>& calls, bool after_content, bool qwen2_5) {
    std::string out;
    for (size_t k = 0; k < calls.size(); ++k) {
        const auto arguments = nlohmann::ordered_json::parse(calls[k].arguments_json);
        if (qwen2_5 || k > 0 || after_content) out += "\n";
        out += "<tool_call>\n{\"name\": \"" + calls[k].name + "\", \"arguments\": " +
               (!qwen2_5 && arguments.is_string() ? arguments.get<std::string>() : python_json(arguments)) + "}\n</tool_call>";
    }
    return out;
}

// Qwen3's template, whose variants differ in the generation prompt (enable_thinking's empty <think>
// block, Qwen3-Thinking-2507's open one); without `reasoning`, Qwen3-Instruct-2507's, which writes
// assistant turns as they are. `every_turn_reasons`: TRL's training version, in which every
// assistant turn gets its reasoning block.
std::string render_qwen3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         const std::string& generation_prompt, bool reasoning, const std::string& tools_json,
                         bool every_turn_reasons = false) {
    std::string out;
    const bool leading_system = !messages.empty() && messages[0].role == "system";
    if (!tools_json.empty())
        out = chatml_tools_turn(messages, tools_json, std::nullopt);
    else if (leading_system)
        out = "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
    // the last user message that is not a tool response wrapped as a user turn
    size_t last_query = messages.empty() ? 0 : messages.size() - 1;
    for (size_t i = messages.size(); i-- > 0;)
        if (messages[i].role == "user" &&
            !(starts_with(messages[i].content, "<tool_response>") && ends_with(messages[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        const bool last = i + 1 == messages.size();
        if (m.role == "user" || (m.role == "system" && i > 0)) {
            out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        } else if (m.role == "assistant") {
            // the template's `content`: the answer after a reasoning block, if the message has one
            const size_t close = reasoning && !m.reasoning_content ? m.content.rfind("</think>") : std::string::npos;
            const bool has_content = close == std::string::npos
                                         ? !m.content.empty()
                                         : !strip_newlines(m.content.substr(close + 8), true, false).empty();
            out += (reasoning ? qwen3_assistant_turn(m, every_turn_reasons || i > last_query, every_turn_reasons || last)
                              : "<|im_start|>assistant\n" + m.content) +
                   qwen_tool_calls(m.tool_calls, has_content, false) + "<|im_end|>\n";
        } else if (m.role == "tool") {
            out += qwen_tool_response(messages, i);
        } else if (m.role != "system") {
            throw Error(ErrorKind::input,
                        "qwen3 chat template: role \"" + m.role + "\" is not one it renders (system, user, assistant, tool)");
        }
    }
    if (add_generation_prompt) out += generation_prompt;
    return out;
}
}  // namespace

namespace {
bool contains(const std::string& text, const char* piece) { return text.find(piece) != std::string::npos; }

// Which ChatML template a checkpoint's Jinja text is: Qwen3's has the enable_thinking switch;
// Qwen3-Instruct-2507's renders tool responses but has neither <think> handling nor a default
// system prompt (Qwen2.5's and Qwen2.5-Math's have one); one that opens a <think> block in its generation prompt (Qwen3's
// Thinking-2507 models) is not rendered natively; the rest are ChatML (Qwen2 / Qwen2.5, SmolLM2).
// The template's text without its literal system turns ("<|im_start|>system" ... "<|im_end|>"), where
// a default system prompt may mention <think> without the template handling reasoning blocks.
std::string outside_system_turns(std::string t) {
    for (size_t at = t.find("<|im_start|>system"); at != std::string::npos; at = t.find("<|im_start|>system", at)) {
        const size_t end = t.find("<|im_end|>", at);
        t.erase(at, end == std::string::npos ? std::string::npos : end + 10 - at);
    }
    return t;
}

// ChatML templates with constructs none of these renderers reproduces (macros: Nemotron 3's, Qwen3.5's,
// LFM2's; the BOS token: LFM2's; roles rewritten: SmolVLM's capitalize), and Qwen3-shaped ones that
// drop a system message after the first (Qwen3-VL's), are not rendered.
ChatTemplate chatml_family(const std::string& t) {
    if (contains(t, "<|im_sep|>")) return contains(t, "<think>") ? ChatTemplate::phi_not_rendered : ChatTemplate::phi4;
    if (contains(t, "Knowledge Cutoff Date") && contains(t, "Reasoning Mode")) return ChatTemplate::smollm3;
    // (plain substrings: a comment naming one refuses a template too, which errs on the safe side)
    if (contains(t, "macro") || contains(t, "bos_token") || contains(t, "capitalize")) return ChatTemplate::not_rendered;
    const bool renders_late_system = contains(t, "message.role == \"system\" and not loop.first");
    // a generation prompt that opens <think>, its newline escaped or written out
    if (contains(t, "assistant\\n<think>") || contains(t, "assistant\n<think>") || contains(t, "'<think>\\n' }}"))
        return renders_late_system && contains(t, "reasoning_content") && contains(t, "<tool_response>") &&
                       contains(t, "{{- '<|im_start|>assistant\\n<think>\\n' }}") && !contains(t, "enable_thinking")
                   ? ChatTemplate::qwen3_thinking
                   : ChatTemplate::opens_thinking;
    if (contains(t, "enable_thinking")) return renders_late_system ? ChatTemplate::qwen3 : ChatTemplate::not_rendered;
    if (contains(t, "<tool_response>") && !contains(t, "<think>") && !chatml_default_system(t))
        return renders_late_system ? ChatTemplate::qwen3_instruct : ChatTemplate::not_rendered;
    // plain ChatML writes every message as '<|im_start|>' + its role (OLMo 3's, which spells each role
    // out and ends the last assistant turn with the EOS token, is another shape) and handles no
    // reasoning blocks (a template that does and is none of the above would be rendered wrongly)
    if (contains(outside_system_turns(t), "think>")) return ChatTemplate::not_rendered;  // <think> or </think>
    for (const char* turn : {"'<|im_start|>' + message['role'] + '", "'<|im_start|>' + message.role + '",
                             "\"<|im_start|>\" + message['role'] + \"", "\"<|im_start|>\" + message[\"role\"] + \"",
                             "\"<|im_start|>\" + message.role + \""})
        if (contains(t, turn)) return ChatTemplate::chatml;
    return ChatTemplate::not_rendered;
}

// Phi-3's and Phi-4's templates drop any role but these without a word; Grove refuses it rather
// than lose a tool's output.
void refuse_other_roles(const char* family, const ChatMessage& m) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
        throw Error(ErrorKind::input, std::string(family) + " chat template: role \"" + m.role +
                                          "\" is not supported (the template drops it silently; its roles are system, "
                                          "user and assistant)");
}

// Phi-3 / Phi-3.5 Instruct: "<|role|>\n" + content + "<|end|>\n" per turn, then the generation
// prompt or the EOS token. Phi-3.5's template skips an empty system message, Phi-3's writes it.
std::string render_phi3(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string& eos,
                        const std::string& checkpoint_template) {
    const bool skips_empty_system = contains(checkpoint_template, "'system' and message['content']");
    std::string out;
    for (const auto& m : messages) {
        refuse_other_roles("phi3", m);
        if (m.role == "system" && m.content.empty() && skips_empty_system) continue;
        out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
    }
    return out + (add_generation_prompt ? "<|assistant|>\n" : eos);
}

// OLMo 2 Instruct's and Tulu 3's (Ai2's): "<|role|>\n" + content + "\n" per turn, except that an
// assistant turn ends with the EOS token (and the newline only when another message follows); the
// generation prompt after the last message; the BOS token first where the template writes it.
std::string render_tulu(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string& bos,
                        const std::string& eos, const std::string& checkpoint_template) {
    std::string out = contains(checkpoint_template, "bos_token") ? bos : "";
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        refuse_other_roles("tulu", m);
        if (m.role == "assistant")
            out += "<|assistant|>\n" + m.content + eos + (i + 1 < messages.size() ? "\n" : "");
        else
            out += "<|" + m.role + "|>\n" + m.content + "\n";
    }
    if (add_generation_prompt && !messages.empty()) out += "<|assistant|>\n";
    return out;
}

// Mistral-7B-Instruct v0.1 / v0.2's: the BOS token once, "[INST] " + content + " [/INST]" per user
// turn, content + the EOS token per assistant turn (and a space, where v0.1's template writes one);
// the [/INST] is the generation prompt. The template raises unless roles alternate user/assistant
// from the first message; Grove refuses such a conversation in its words.
std::string render_mistral(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& eos,
                           const std::string& checkpoint_template) {
    const std::string after_answer = contains(checkpoint_template, "eos_token + ' '") ? eos + " " : eos;
    std::string out = bos;
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if ((m.role == "user") != (i % 2 == 0) || (m.role != "user" && m.role != "assistant"))
            throw Error(ErrorKind::input,
                        "mistral chat template: conversation roles must alternate user/assistant/user/assistant/..., "
                        "and only user and assistant roles are supported (the template raises this; message " +
                            std::to_string(i + 1) + " is \"" + m.role +
                            "\"); put a system prompt's instructions in the first user message");
        out += m.role == "user" ? "[INST] " + m.content + " [/INST]" : m.content + after_answer;
    }
    return out;
}

// The DeepSeek-R1-Distill template, which every distilled Qwen and Llama checkpoint ships byte for
// byte: the BOS token and the last system message first; "<｜User｜>" + content per user turn; an
// assistant turn as "<｜Assistant｜>" + the text after its last </think> + "<｜end▁of▁sentence｜>", or,
// right after tool outputs, its whole content closing them instead; tool outputs in one block, which the template never
// reopens (a later block's outputs start with a newline); the generation prompt "<｜Assistant｜><think>\n",
// which tool outputs at the end replace with the block's close.
std::string render_deepseek_r1(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string& bos) {
    const std::string end_of_sentence = "<\uff5cend\u2581of\u2581sentence\uff5c>", assistant = "<\uff5cAssistant\uff5c>";
    const std::string outputs_end = "<\uff5ctool\u2581outputs\u2581end\uff5c>",
                      output_end = "<\uff5ctool\u2581output\u2581end\uff5c>";
    std::string system;
    for (const auto& m : messages)
        if (m.role == "system") system = m.content;
    std::string out = bos + system;
    bool in_tool_outputs = false, first_output = true;
    for (const auto& m : messages) {
        if (m.role == "user") {
            in_tool_outputs = false;
            out += "<\uff5cUser\uff5c>" + m.content;
        } else if (m.role == "assistant" && in_tool_outputs) {
            out += outputs_end + m.content + end_of_sentence;
            in_tool_outputs = false;
        } else if (m.role == "assistant") {
            const size_t close = m.content.rfind("</think>");
            out += assistant + (close == std::string::npos ? m.content : m.content.substr(close + 8)) + end_of_sentence;
        } else if (m.role == "tool") {
            out += (first_output ? "<\uff5ctool\u2581outputs\u2581begin\uff5c><\uff5ctool\u2581output\u2581begin\uff5c>"
                                 : "\n<\uff5ctool\u2581output\u2581begin\uff5c>") +
                   m.content + output_end;
            first_output = false;
            in_tool_outputs = true;
        } else if (m.role != "system") {
            throw Error(ErrorKind::input, "deepseek_r1 chat template: role \"" + m.role +
                                              "\" is not supported (the template drops it silently; its roles are "
                                              "system, user, assistant and tool)");
        }
    }
    if (in_tool_outputs) out += outputs_end;
    if (add_generation_prompt && !in_tool_outputs) out += assistant + "<think>\n";
    return out;
}

// Gemma 2 / 3 Instruct: "<start_of_turn>" + role ("model" for the assistant) + "\n" + the trimmed
// content + "<end_of_turn>\n". Gemma 3's template writes a leading system message, untrimmed, and a
// blank line before the first turn's content; Gemma 2's refuses one. Both require user turns at even
// positions and anything else at odd ones (other roles rendered under their own name), and raise
// otherwise; Grove raises there too, with the template's words.
std::string render_gemma(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string& bos,
                         const std::string& checkpoint_template) {
    size_t first = 0;
    std::string first_turn_prefix;
    if (!messages.empty() && messages[0].role == "system") {
        if (contains(checkpoint_template, "System role not supported"))
            throw Error(ErrorKind::input,
                        "gemma chat template: this checkpoint's template (Gemma 2's) raises \"System role "
                        "not supported\"; put the instructions in the first user message");
        first_turn_prefix = messages[0].content + "\n\n";
        first = 1;
    }
    std::string out = bos;
    for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if ((m.role == "user") != ((i - first) % 2 == 0))
            throw Error(ErrorKind::input,
                        "gemma chat template: conversation roles must alternate "
                        "user/assistant/user/assistant/... (the template raises this; message " +
                            std::to_string(i + 1) + " is \"" + m.role + "\")");
        out += "<start_of_turn>" + (m.role == "assistant" ? std::string("model") : m.role) + "\n" +
               (i == first ? first_turn_prefix : "") + trim(m.content) + "<end_of_turn>\n";
    }
    if (add_generation_prompt) out += "<start_of_turn>model\n";
    return out;
}

// The Jinja string literal opening at t[quote] (' or "), its escapes undone, and the offset of its
// closing quote.
std::optional<std::pair<std::string, size_t>> jinja_literal(const std::string& t, size_t quote) {
    if (quote >= t.size() || (t[quote] != '"' && t[quote] != '\'')) return std::nullopt;
    std::string text;
    for (size_t i = quote + 1; i < t.size(); ++i) {
        if (t[i] == t[quote]) return std::pair{text, i};
        if (t[i] == '\\' && i + 1 < t.size()) {
            text += jinja_unescaped(t[++i]);
        } else {
            text += t[i];
        }
    }
    return std::nullopt;
}

// The custom instructions a SmolLM3 template writes without a system message, in think and no-think
// mode: the literals of `{{- "..." -}}` after its `elif reasoning_mode == "/think"` and the `else`
// that follows (read from the checkpoint, so a fine-tune's own default is kept).
std::optional<std::pair<std::string, std::string>> smollm3_default_instructions(const std::string& t) {
    const size_t branch = t.find("elif reasoning_mode == \"/think\"");
    if (branch == std::string::npos) return std::nullopt;
    auto literal_after = [&](size_t from) -> std::optional<std::pair<std::string, size_t>> {
        const size_t open = t.find("{{", from);
        if (open == std::string::npos) return std::nullopt;
        return jinja_literal(t, t.find_first_not_of("{- ", open));
    };
    const auto thinking = literal_after(branch);
    if (!thinking) return std::nullopt;
    const size_t otherwise = t.find("else", thinking->second);
    const auto plain = otherwise == std::string::npos ? std::nullopt : literal_after(otherwise);
    if (!plain) return std::nullopt;
    return std::pair{thinking->first, plain->first};
}

// SmolLM3's template (without tools), `thinking` the conversation's mode (conversation_family): a
// system turn of metadata (today's date, the reasoning mode) and custom instructions, the system
// message's or a default, left unclosed as the template leaves it, unless the system message asks
// for /system_override. In no-think mode every assistant turn and the generation prompt
// open with an empty <think> block. Tool messages become user turns; the template drops any other
// role, and a system message after the first, without a word, so Grove refuses them.
std::string render_smollm3(const std::vector<ChatMessage>& messages, bool add_generation_prompt, bool thinking,
                           const std::string& date, const std::string& checkpoint_template) {
    const std::string mode = thinking ? "/think" : "/no_think";
    std::string out = "<|im_start|>system\n", custom;
    const bool has_system = !messages.empty() && messages[0].role == "system";
    if (has_system) custom = trim(replace_all(replace_all(messages[0].content, "/no_think", ""), "/think", ""), false);
    if (has_system && contains(messages[0].content, "/system_override")) {
        out += trim(replace_all(custom, "/system_override", ""), false) + "<|im_end|>\n";
    } else {
        out += "## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: " + date + "\nReasoning Mode: " + mode +
               "\n\n## Custom Instructions\n\n";
        const auto defaults = custom.empty() ? smollm3_default_instructions(checkpoint_template) : std::nullopt;
        if (!custom.empty())
            out += custom + "\n\n";
        else if (!defaults)
            throw Error(ErrorKind::input,
                        "smollm3 chat template: the checkpoint's chat template has no SmolLM3 default instructions "
                        "(the literals after `elif reasoning_mode == \"/think\"` and its `else`) to write for a "
                        "conversation without a system message; give the dataset's conversations a system message, "
                        "or use the template this checkpoint was trained with");
        else
            out += mode == "/think" ? defaults->first : defaults->second;
    }
    const std::string empty_thinking = mode == "/think" ? "" : "<think>\n\n</think>\n";
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user" || m.role == "tool") {
            out += "<|im_start|>user\n" + m.content + "<|im_end|>\n";
        } else if (m.role == "assistant") {
            out += "<|im_start|>assistant\n" + empty_thinking + strip_newlines(m.content, true, false) + "<|im_end|>\n";
        } else if (m.role != "system" || i > 0) {
            throw Error(ErrorKind::input,
                        "smollm3 chat template: " +
                            std::string(m.role == "system" ? "a system message after the first" : "role \"" + m.role + "\"") +
                            " is not supported (the template drops it silently; it renders one "
                            "leading system message, then user, assistant and tool turns)");
        }
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n" + empty_thinking;
    return out;
}

// Each family's name in a manifest or on the command line, in the order errors list them
// (qwen3_thinking_off has none: it is qwen3 with enable_thinking = false)
constexpr std::pair<const char*, ChatTemplate> kFamilyNames[] = {{"chatml", ChatTemplate::chatml},
                                                                 {"qwen3", ChatTemplate::qwen3},
                                                                 {"qwen3_instruct", ChatTemplate::qwen3_instruct},
                                                                 {"qwen3_thinking", ChatTemplate::qwen3_thinking},
                                                                 {"llama3", ChatTemplate::llama3},
                                                                 {"llama3_1", ChatTemplate::llama3_1},
                                                                 {"llama3_2", ChatTemplate::llama3_2},
                                                                 {"llama2", ChatTemplate::llama2},
                                                                 {"phi3", ChatTemplate::phi3},
                                                                 {"phi4", ChatTemplate::phi4},
                                                                 {"phi4_mini", ChatTemplate::phi4_mini},
                                                                 {"smollm3", ChatTemplate::smollm3},
                                                                 {"gemma", ChatTemplate::gemma},
                                                                 {"tulu", ChatTemplate::tulu},
                                                                 {"mistral", ChatTemplate::mistral},
                                                                 {"deepseek_r1", ChatTemplate::deepseek_r1},
                                                                 {"plain", ChatTemplate::plain}};

std::string family_name(ChatTemplate family) {
    if (family == ChatTemplate::qwen3_thinking_off) return "qwen3 (enable_thinking false)";
    if (family == ChatTemplate::smollm3_thinking_off) return "smollm3 (enable_thinking false)";
    if (family == ChatTemplate::opens_thinking) return "a template that opens <think> in its generation prompt";
    if (family == ChatTemplate::phi_not_rendered) return "a Phi template of another shape";
    if (family == ChatTemplate::gemma_not_rendered) return "a Gemma template of another shape";
    if (family == ChatTemplate::not_rendered) return "a template of no family Grove renders";
    for (const auto& [name, value] : kFamilyNames)
        if (value == family) return name;
    return "?";
}

ChatTemplate chat_template_family(const std::string& name, const TokenizerConfig& config) {
    for (const auto& [known, family] : kFamilyNames)
        if (name == known) return family;
    if (name == "none") return ChatTemplate::plain;
    if (name == "auto") {
        const std::string& t = config.chat_template;
        if (t.find("<|im_start|>") != std::string::npos) return chatml_family(t);
        if (contains(t, "<|start_header_id|>")) {  // Llama 3; 3.1 and 3.2 date their system turn
            if (!contains(t, "Cutting Knowledge Date")) return ChatTemplate::llama3;
            return contains(t, "strftime_now") ? ChatTemplate::llama3_2 : ChatTemplate::llama3_1;
        }
        // [INST] turns: Llama 2's (its <<SYS>> block), Mistral-7B-Instruct v0.1 / v0.2's (BOS once, no
        // system role); other shapes (later Mistral versions', LLaVA-NeXT's content parts) are not rendered
        if (contains(t, "[INST]")) {
            if (contains(t, "<<SYS>>") && !contains(t, "['content'][0]")) return ChatTemplate::llama2;
            if (contains(t, "{{ bos_token }}") && contains(t, "'[INST] ' + message['content'] + ' [/INST]'") &&
                contains(t, "Only user and assistant roles are supported") && contains(t, "message['content'] + eos_token"))
                return ChatTemplate::mistral;
            return ChatTemplate::not_rendered;
        }
        // the DeepSeek-R1-Distill checkpoints'; DeepSeek-R1's and V3's own (system messages joined, tool
        // calls) and R1-0528's (the prompt after each user turn) are other shapes
        if (contains(t, "<\uff5cUser\uff5c>"))
            return contains(t, "{{'<\uff5cUser\uff5c>' + message['content']}}") &&
                           contains(t, "content.split('</think>')[-1]") &&
                           contains(t, "{{'<\uff5cAssistant\uff5c><think>\\n'}}") && !contains(t, "is_first_sp") &&
                           !contains(t, "is_last_user")
                       ? ChatTemplate::deepseek_r1
                       : ChatTemplate::not_rendered;
        // Gemma 3's (a system prefix) or Gemma 2's (no system role), each trimming the contents;
        // fine-tunes with turns of their own are recognised and not rendered by guesswork
        if (contains(t, "<start_of_turn>"))
            return (contains(t, "first_user_prefix") || contains(t, "System role not supported")) && contains(t, "| trim")
                       ? ChatTemplate::gemma
                       : ChatTemplate::gemma_not_rendered;
        // Phi-3 / 3.5: "<|assistant|>\n" (the newline literal or escaped); Phi-4-mini: "<|" + role + "|>";
        // other <|end|> templates (Phi-3-medium's) render otherwise
        if (contains(t, "<|assistant|>") && contains(t, "<|end|>")) {
            if (contains(t, "<|assistant|>\n") || contains(t, "<|assistant|>\\n")) return ChatTemplate::phi3;
            if (contains(t, "'<|' + message['role'] + '|>'")) return ChatTemplate::phi4_mini;
            return ChatTemplate::phi_not_rendered;
        }
        // OLMo 2 Instruct / Tulu 3: "<|user|>\n" turns whose assistant turns end with the EOS token, and a
        // newline only before another message (Zephyr's, with the EOS after every turn, is not this);
        // derivatives that open <think> in the generation prompt or write the BOS token only under
        // add_bos_token are other shapes
        if (contains(t, "<|user|>") && contains(t, "<|assistant|>") && contains(t, "not loop.last") &&
            contains(t, "eos_token") && !contains(t, "<think>") && !contains(t, "add_bos_token"))
            return ChatTemplate::tulu;
        // a template of none of these shapes is not rendered as plain text, which would differ from
        // what apply_chat_template gives; a folder without a template renders conversations plainly
        return t.empty() ? ChatTemplate::plain : ChatTemplate::not_rendered;
    }
    std::vector<std::string> names{"auto"};
    for (const auto& [known, family] : kFamilyNames) names.push_back(known);
    const std::string listed = join(names, ", ") + " or none";
    names.push_back("none");
    throw Error(ErrorKind::usage, "unknown chat template \"" + name + "\"" + did_you_mean(name, names) + "; use " + listed);
}
}  // namespace

ChatTemplate chat_template_from_name(const std::string& name, const TokenizerConfig& config, bool enable_thinking) {
    const ChatTemplate family = chat_template_family(name, config);
    if (enable_thinking) return family;
    if (family == ChatTemplate::qwen3) return ChatTemplate::qwen3_thinking_off;
    if (family == ChatTemplate::smollm3) return ChatTemplate::smollm3_thinking_off;
    const std::string which = name == "auto"
                                  ? std::string("the checkpoint's chat template (recognised as ") + family_name(family) + ")"
                                  : "the chat template \"" + name + "\"";
    throw Error(ErrorKind::usage, "enable_thinking = false (model.enable_thinking, grove generate --no-thinking): " + which +
                                      " has no thinking switch; only qwen3 and smollm3 have one, and transformers would "
                                      "ignore the setting. Drop the setting, or use the qwen3 template for a Qwen3 model" +
                                      (family == ChatTemplate::qwen3_thinking
                                           ? std::string(" (Qwen3-Thinking-2507 always reasons first; a Qwen3-Instruct-2507 "
                                                         "checkpoint answers without reasoning)")
                                           : std::string()));
}

std::string chat_template_name(ChatTemplate family) { return family_name(family); }

namespace {
bool is_qwen3_family(ChatTemplate family) {
    return family == ChatTemplate::qwen3 || family == ChatTemplate::qwen3_thinking_off ||
           family == ChatTemplate::qwen3_instruct || family == ChatTemplate::qwen3_thinking;
}

bool is_llama3_dated(ChatTemplate family) { return family == ChatTemplate::llama3_1 || family == ChatTemplate::llama3_2; }

// The tools the family's template writes: none for an empty list (Jinja's `if tools` is false), except
// in Llama 3.1's and 3.2's (`tools is not none`: their tool-use turn); Qwen's Hermes format for the Qwen
// families and chatml (Qwen2.5's; grove sft refuses a row's tools where the checkpoint's ChatML template
// has no tools section); Llama 3.1's and 3.2's JSON format. Other templates drop tools or write their
// own form: refused.
std::string written_tools(ChatTemplate family, const std::string& tools_json) {
    if (tools_json.empty() || is_llama3_dated(family)) return tools_json;
    const auto tools = nlohmann::ordered_json::parse(tools_json, nullptr, false);
    if (tools.is_array() && tools.empty()) return "";
    if (is_qwen3_family(family) || family == ChatTemplate::chatml) return tools_json;
    throw Error(ErrorKind::input,
                "the conversation has tools (an environment's, or the row's \"tools\" column), which Grove writes only "
                "as Qwen's templates write them (the Hermes format: chatml, qwen3, qwen3_instruct, qwen3_thinking) and as "
                "Llama 3.1's and 3.2's do (llama3_1, llama3_2), not with the " +
                    family_name(family) + " chat template" +
                    (family == ChatTemplate::smollm3 || family == ChatTemplate::smollm3_thinking_off
                         ? " (SmolLM3's template reads xml_tools, not tools: transformers would leave the tools out "
                           "without a word)"
                         : "") +
                    "; leave the tools out or describe them in the system prompt, or use a Qwen or Llama 3.1 checkpoint");
}

// Templates that write no tool calls (or reasoning_content) drop them without a word (ChatML's
// without Qwen's tool format, Qwen3-Instruct-2507's), or write them in a form of their own that
// Grove does not reproduce: refused, not lost.
void refuse_unwritten_fields(ChatTemplate family, const std::vector<ChatMessage>& messages, const TokenizerConfig& config) {
    const bool writes_reasoning = is_qwen3_family(family) && family != ChatTemplate::qwen3_instruct;
    for (const ChatMessage& m : messages)
        if (m.reasoning_content && !writes_reasoning)
            throw Error(ErrorKind::input,
                        "a message has \"reasoning_content\", which Grove writes only as Qwen3's "
                        "reasoning templates write it, not with the " +
                            family_name(family) +
                            " chat template; write it into \"content\" as the model should see it "
                            "(<think>...</think> before the answer), or leave it out");
    const bool writes_calls = is_qwen3_family(family) || is_llama3_dated(family) ||
                              (family == ChatTemplate::chatml && contains(config.chat_template, "tool_call"));
    for (const ChatMessage& m : messages)
        if (!m.tool_calls.empty() && !writes_calls)
            throw Error(ErrorKind::input,
                        "a message has \"tool_calls\", which Grove writes only as Qwen2.5's and Qwen3's chat templates "
                        "write them (<tool_call> blocks) and as Llama 3.1's and 3.2's do (a JSON turn), not with the " +
                            family_name(family) + " chat template" +
                            (family == ChatTemplate::chatml ? " (this checkpoint's template writes no tool calls)" : "") +
                            "; write the calls into the message's \"content\" as the model should see them");
}
}  // namespace

ChatTemplate conversation_family(ChatTemplate family, const std::vector<ChatMessage>& messages) {
    if (family != ChatTemplate::smollm3 && family != ChatTemplate::smollm3_thinking_off) return family;
    if (messages.empty() || messages[0].role != "system") return family;
    if (contains(messages[0].content, "/no_think")) return ChatTemplate::smollm3_thinking_off;
    if (contains(messages[0].content, "/think")) return ChatTemplate::smollm3;
    return family;
}

std::string continue_assistant_turn(ChatTemplate family, const std::string& observation) {
    if (family == ChatTemplate::deepseek_r1 && ends_with(observation, "<\uff5cAssistant\uff5c>"))
        return observation + "<think>\n";  // the generation prompt opens the reasoning
    const std::string opening = "<|im_start|>assistant\n";
    if (!ends_with(observation, opening)) return observation;
    if (family == ChatTemplate::qwen3_thinking_off) return observation + "<think>\n\n</think>\n\n";
    if (family == ChatTemplate::qwen3_thinking) return observation + "<think>\n";
    if (family == ChatTemplate::smollm3_thinking_off) return observation + "<think>\n\n</think>\n";
    return observation;
}

std::string render_chat_for_training(ChatTemplate family, const std::vector<ChatMessage>& messages,
                                     const TokenizerConfig& config, const std::string& tools_json) {
    // enable_thinking only changes the generation prompt, so both Qwen3 families train alike
    if (family == ChatTemplate::qwen3 || family == ChatTemplate::qwen3_thinking_off)
        return render_qwen3(messages, false, "", true, tools_json, true);
    return render_chat(family, messages, false, config, tools_json);
}

std::string render_chat(ChatTemplate family, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        const TokenizerConfig& config, const std::string& tools_given) {
    std::string out;
    std::string bos = config.bos_token.value_or(""), eos = config.eos_token.value_or("");
    refuse_unwritten_fields(family, messages, config);
    const std::string tools_json = written_tools(family, tools_given);
    switch (family) {
        case ChatTemplate::qwen3:
        case ChatTemplate::qwen3_instruct:
            return render_qwen3(messages, add_generation_prompt, "<|im_start|>assistant\n", family == ChatTemplate::qwen3,
                                tools_json);
        case ChatTemplate::qwen3_thinking_off:
            return render_qwen3(messages, add_generation_prompt, "<|im_start|>assistant\n<think>\n\n</think>\n\n", true,
                                tools_json);
        case ChatTemplate::qwen3_thinking:
            return render_qwen3(messages, add_generation_prompt, "<|im_start|>assistant\n<think>\n", true, tools_json);
        case ChatTemplate::smollm3:
        case ChatTemplate::smollm3_thinking_off:
            return render_smollm3(messages, add_generation_prompt,
                                  conversation_family(family, messages) == ChatTemplate::smollm3, today("%d %B %Y"),
                                  config.chat_template);
        case ChatTemplate::llama3_1:
            return render_llama3_dated("llama3_1", messages, add_generation_prompt, bos,
                                       llama3_default_date(config.chat_template), tools_json);
        case ChatTemplate::llama3_2:
            return render_llama3_dated("llama3_2", messages, add_generation_prompt, bos, today("%d %b %Y"), tools_json);
        case ChatTemplate::chatml: {
            // Qwen2 / 2.5's templates (tool responses in a user turn) render four roles and drop the rest
            const bool qwen2_5_roles = contains(config.chat_template, "<tool_response>");
            if (const auto system = chatml_default_system(config.chat_template); !tools_json.empty())
                // Qwen2.5's tools turn opens with the template's default (Qwen2.5-Math's is its own)
                out =
                    chatml_tools_turn(messages, tools_json,
                                      system.value_or("You are Qwen, created by Alibaba Cloud. You are a helpful assistant."));
            else if (system && !messages.empty() && messages[0].role != "system")
                out = "<|im_start|>system\n" + *system + "<|im_end|>\n";
            for (size_t i = !tools_json.empty() && !messages.empty() && messages[0].role == "system"; i < messages.size();
                 ++i) {
                const ChatMessage& m = messages[i];
                if (qwen2_5_roles && m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
                    throw Error(ErrorKind::input, "chatml chat template: role \"" + m.role +
                                                      "\" is not supported (this checkpoint's template, Qwen2.5's, drops "
                                                      "it silently; its roles are system, user, assistant, tool)");
                if (m.role == "tool" && qwen2_5_roles)
                    out += qwen_tool_response(messages, i);  // Qwen2 / 2.5's templates group tool messages
                else if (!m.tool_calls.empty())
                    out += "<|im_start|>assistant" + (m.content.empty() ? "" : "\n" + m.content) +
                           qwen_tool_calls(m.tool_calls, !m.content.empty(), true) + "<|im_end|>\n";
                else
                    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
            }
            if (add_generation_prompt) out += "<|im_start|>assistant\n";
            return out;
        }
        case ChatTemplate::llama3:
            out = bos;
            for (const auto& m : messages)
                out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
            if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
            return out;
        case ChatTemplate::llama2: {
            // Llama-2-chat: the system prompt goes inside the first [INST] block
            size_t first = 0;
            std::string system;
            if (!messages.empty() && messages[0].role == "system") {
                system = messages[0].content;
                first = 1;
            }
            for (size_t i = first; i < messages.size(); ++i) {
                const auto& m = messages[i];
                if ((m.role == "user") != ((i - first) % 2 == 0))
                    throw Error(ErrorKind::input,
                                "llama2 chat template: conversation roles must alternate user/assistant/user/assistant/... "
                                "after an optional system message (the template raises this; message " +
                                    std::to_string(i + 1) + " is \"" + m.role + "\")");
                if (m.role == "user") {
                    std::string content = m.content;
                    // an empty system message still writes the block: Jinja's "" != false holds
                    if (i == first && first == 1) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
                    out += bos + "[INST] " + trim(content) + " [/INST]";
                } else if (m.role == "assistant") {
                    out += " " + trim(m.content) + " " + eos;
                } else {
                    throw Error(ErrorKind::input, "llama2 chat template: role \"" + m.role +
                                                      "\" is not supported (the template drops it silently; its roles "
                                                      "are system, user and assistant)");
                }
            }
            return out;
        }
        case ChatTemplate::phi3:
            return render_phi3(messages, add_generation_prompt, eos, config.chat_template);
        case ChatTemplate::gemma:
            return render_gemma(messages, add_generation_prompt, bos, config.chat_template);
        case ChatTemplate::tulu:
            return render_tulu(messages, add_generation_prompt, bos, eos, config.chat_template);
        case ChatTemplate::mistral:
            return render_mistral(messages, bos, eos, config.chat_template);
        case ChatTemplate::deepseek_r1:
            return render_deepseek_r1(messages, add_generation_prompt, bos);
        case ChatTemplate::not_rendered:
            throw Error(ErrorKind::usage,
                        "the checkpoint's chat template is of none of the families Grove renders natively (chatml, "
                        "qwen3, qwen3_thinking, llama3, llama2, mistral, phi3, phi4, smollm3, gemma, tulu, deepseek_r1), so "
                        "conversations "
                        "rendered here would "
                        "differ from apply_chat_template's: use text prompts rendered with apply_chat_template, name "
                        "a family (model.chat_template, grove generate --chat-template) after comparing it with "
                        "apply_chat_template, or set model.chat_template = \"none\" to join the messages as plain text "
                        "(what Grove did before 2026-11-27)");
        case ChatTemplate::plain:
            for (size_t i = 0; i < messages.size(); ++i) out += (i ? "\n" : "") + messages[i].content;
            if (add_generation_prompt && !messages.empty()) out += "\n";
            return out;
        case ChatTemplate::phi4:  // Phi-4: no newlines, other roles dropped as phi3's are
            for (const auto& m : messages) {
                refuse_other_roles("phi4", m);
                out += "<|im_start|>" + m.role + "<|im_sep|>" + m.content + "<|im_end|>";
            }
            return add_generation_prompt ? out + "<|im_start|>assistant<|im_sep|>" : out;
        case ChatTemplate::phi4_mini:  // every role as "<|role|>", the template's own rule
            for (const auto& m : messages) out += "<|" + m.role + "|>" + m.content + "<|end|>";
            return out + (add_generation_prompt ? "<|assistant|>" : eos);
        case ChatTemplate::phi_not_rendered:
            throw Error(ErrorKind::usage,
                        "the checkpoint's chat template is a Phi template of a shape Grove does not render natively "
                        "(Phi-4-reasoning's <|im_sep|> turns with <think> handling, or Phi-3-medium's assistant prompt "
                        "after every user turn): use text prompts rendered with apply_chat_template, or name a template "
                        "(model.chat_template) after comparing it with apply_chat_template");
        case ChatTemplate::gemma_not_rendered:
            throw Error(ErrorKind::usage,
                        "the checkpoint's chat template has Gemma's <start_of_turn> markers but is neither Gemma 2's nor "
                        "Gemma 3's (a system prefix, or no system role, with trimmed contents), which Grove renders "
                        "natively: use text prompts rendered with apply_chat_template, or name the gemma template "
                        "(model.chat_template) after comparing it with apply_chat_template");
        case ChatTemplate::opens_thinking:
            throw Error(ErrorKind::usage,
                        "the checkpoint's chat template opens a <think> block in its generation prompt (as QwQ's "
                        "does) but is not Qwen3-Thinking-2507's, which Grove does not render natively: name the template "
                        "(model.chat_template, grove generate --chat-template) after comparing it with "
                        "apply_chat_template, or use text prompts");
    }
    return out;
}

}  // namespace grove
