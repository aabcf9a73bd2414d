// `grove sft`: supervised warm-start before GRPO. Next-token cross-entropy on prompt -> reference
// completion (+ EOS), with the prompt's tokens masked out of the loss; full fine-tuning, AdamW. A
// reference episode given as turns trains the model's turns only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace grove {

class Manifest;
class Tokenizer;
struct PromptRow;
enum class ChatTemplate;

// One supervised example: the prompt's and the completion's token ids, and which of them the loss
// trains. The completion column holds text, or turns [{"role": "model"|"environment", "text"}]
// (the shape `grove eval` prints episodes in), tokenized turn by turn as an episode is; the
// environment's turns are context only (TRL's env_mask).
struct SftExample {
    std::vector<int64_t> ids;
    std::vector<uint8_t> trained;
};
SftExample sft_example(const PromptRow& row, const std::string& column, const Tokenizer& tokenizer, ChatTemplate chat,
                       std::optional<int64_t> eos);

struct SftResult {
    std::vector<double> losses;  // one per optimizer step
    std::string output;          // the saved Hugging Face folder
};

struct SftOptions {
    bool overwrite = false;             // replace an output folder that holds another run
    std::optional<std::string> resume;  // "latest" or a checkpoint folder
};

// Uses model.*, data.source / prompt_column / completion_column, train.* (batch size, learning rate,
// schedule, warmup, AdamW, max_grad_norm, max_steps, seed) and output.* (dir, save_steps,
// save_total_limit). Writes metrics.jsonl, a checkpoint every save_steps and at the end (as grove
// train's: the model as a Hugging Face folder and the training state, so --resume continues
// exactly), and the final model with the tokenizer files in output.dir itself.
SftResult run_sft(const Manifest& manifest, std::ostream* log, const SftOptions& options = {});

}  // namespace grove
