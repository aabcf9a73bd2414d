// `grove sft`: supervised warm-start before GRPO. Next-token cross-entropy on prompt -> reference
// completion (+ EOS), with the prompt's tokens masked out of the loss; full fine-tuning, AdamW.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace grove {

class Manifest;

struct SftResult {
    std::vector<double> losses;  // one per optimizer step
    std::string output;          // the saved Hugging Face folder
};

// Uses model.*, data.source / prompt_column / completion_column, train.* (batch size, learning rate,
// schedule, warmup, AdamW, max_grad_norm, max_steps, seed) and output.dir, where the final model
// (with the tokenizer files) and metrics.jsonl are written.
SftResult run_sft(const Manifest& manifest, std::ostream* log);

}  // namespace grove
