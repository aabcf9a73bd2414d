// `grove sft`: supervised fine-tuning as TRL 1.16's SFTTrainer does it: next-token cross-entropy on
// the rows of TRL's dataset formats, prepared as its SFTTrainer prepares them (core/src/train/
// sft_data.cpp); full fine-tuning or an adapter (LoRA), AdamW, evaluation on held-out rows. A
// reference episode given as turns trains the model's turns only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace grove {

class Manifest;
class Tokenizer;
enum class ChatTemplate;

// One supervised example: its token ids, and which of them the loss trains (TRL's labels != -100).
// A packed example holds several sequences end to end, each attending to itself only and starting
// at position 0: their lengths, in order (empty: one sequence).
struct SftExample {
    std::vector<int64_t> ids;
    std::vector<uint8_t> trained;
    std::vector<int64_t> sequence_lengths;
    // its sequences' lengths, in order (one, unpacked)
    std::vector<int64_t> sequences() const {
        return sequence_lengths.empty() ? std::vector<int64_t>{int64_t(ids.size())} : sequence_lengths;
    }
};

// How rows become examples: TRL's SFTConfig options of the same names (the [sft] section, and
// data.*_column).
struct SftDataOptions {
    std::string prompt_column = "prompt", completion_column = "completion";
    std::string text_column = "text";  // TRL's dataset_text_field
    bool completion_only_loss = true;  // prompt-completion rows: train the completion only
    // TRL's assistant_only_loss: conversation rows ("messages") train only their assistant turns, the
    // characters TRL's training chat template marks with {% generation %} (chatml: from the newline
    // after "<|im_start|>assistant" through "<|im_end|>\n"; llama3: the content and "<|eot_id|>");
    // other rows and chat template families are refused
    bool assistant_only_loss = false;
    int64_t max_length = 1024;  // tokens per example; 0 = no limit
    bool keep_end = false;      // truncation_mode = "keep_end": cut the start instead of the end
    // TRL's packing: examples packed into rows of max_length tokens (bfd: best fit decreasing,
    // cutting longer ones; bfd_split: splitting them; wrapped: the tokens cut every max_length,
    // ignoring where examples end)
    enum class Packing { none, bfd, bfd_split, wrapped } packing = Packing::none;
    // TRL's padding_free (forced by bfd packing): a sequence's first token is not counted as trained
    // (nothing predicts it; TRL's collator masks it, so the step's token count leaves it out)
    bool padding_free = false;
};

// Whether TRL's collator makes each micro-batch one row of every token (padding-free: padding_free,
// or packing with bfd / bfd_split), rather than rows padded to the longest.
bool padding_free_batches(const SftDataOptions& options);

// sft.packing_strategy's names: "bfd", "bfd_split", "wrapped" (the schema admits no other).
SftDataOptions::Packing packing_from_name(const std::string& strategy);

// One JSON row (`where` names it in errors), untruncated, in the first of these formats it has:
// - "input_ids" (TRL's processed rows, tokenized already; no EOS added): all trained, or where
//   "labels" is not -100 (then equal to input_ids there), else where the 0/1 masks
//   "assistant_masks" and "completion_mask" (the latter unless completion_only_loss is false) are 1.
// - prompt + completion (TRL's prompt-completion): text, or chat messages rendered with the chat
//   template (the prompt with its generation prompt, then the whole conversation); the completion
//   starts where the tokens of the prompt alone and of the whole row part, as TRL finds it; a text
//   completion gets the EOS token's text unless it ends with it. The completion may also be
//   Grove's reference episode, turns [{"role": "model"|"environment", "text"}] tokenized one by one
//   as an episode's are, of which only the model's turns (and the EOS) are trained.
// - "messages" (TRL's conversational language modeling): the rendered conversation, all trained.
// A row's "tools" column (function schemas, or their list as JSON text) is rendered into its
// conversation as apply_chat_template(tools=...) renders it, as TRL does (the Qwen families only).
// - text_column (language modeling): the text and the EOS text, all trained.
// Text is tokenized with the tokenizer's special tokens (Llama's and Gemma's BOS), conversations
// without (their template writes them), as TRL does. `eos`: the EOS id when the tokenizer names no
// EOS text (the model's).
SftExample sft_example(const nlohmann::ordered_json& row, const std::string& where, const SftDataOptions& options,
                       const Tokenizer& tokenizer, ChatTemplate chat, std::optional<int64_t> eos);

// Every row of `source` (JSONL or builtin:NAME) as an example, cut to max_length; those left
// without a trained token are left out (counted on `log`), as TRL drops them; or, with packing,
// packed as TRL packs them. Refuses a dataset that keeps no example.
// TRL's pack_dataset on prepared examples: bfd and bfd_split sort each chunk of 1000 examples
// (datasets' map batches) by length, longest first, and put each into the fullest row it fits;
// wrapped cuts each chunk's tokens every max_length.
std::vector<SftExample> packed_examples(const std::vector<SftExample>& examples, int64_t max_length,
                                        SftDataOptions::Packing packing);

std::vector<SftExample> load_sft_examples(const std::string& source, const SftDataOptions& options, const Tokenizer& tokenizer,
                                          ChatTemplate chat, std::optional<int64_t> eos, std::ostream* log);

struct SftResult {
    std::vector<double> losses;  // one per optimizer step
    std::string output;          // the saved Hugging Face folder
};

struct SftOptions {
    bool overwrite = false;             // replace an output folder that holds another run
    std::optional<std::string> resume;  // "latest" or a checkpoint folder
};

// Uses model.*, data.* (source and columns), [adapter] (full or LoRA), [sft], train.* (batch sizes,
// learning rate, schedule, warmup, AdamW, max_grad_norm, epochs or max_steps, seed, mixed precision)
// and output.* (dir, save_steps, save_total_limit). Writes metrics.jsonl, a checkpoint every
// save_steps and at the end (as grove train's: the model as a Hugging Face folder, or the adapter in
// PEFT's layout, and the training state, so --resume continues exactly), and the final model with
// the tokenizer files in output.dir itself.
SftResult run_sft(const Manifest& manifest, std::ostream* log, const SftOptions& options = {});

}  // namespace grove
