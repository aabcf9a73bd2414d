// A Hugging Face sequence-classification checkpoint as a reward (TRL's reward_funcs given as a
// model; [[rewards]] model = "DIR"): each row's prompt + completion text is tokenized with the reward
// model's own tokenizer without special tokens, right-padded, and scored by the first label's logit at
// the last token that is not padding, as transformers pools it. A conversational prompt and its
// completion are rendered with the reward model's own chat template first. Batched, no gradients.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grove/reward_set.hpp"

namespace grove {

class Model;
class Tokenizer;

class RewardModel {
public:
    // `origin` (the manifest's [[rewards]] entry) prefixes errors: a folder that is not a supported
    // sequence classifier is refused with the supported architectures.
    RewardModel(const std::string& folder, const std::string& device, const std::string& origin);
    ~RewardModel();
    std::vector<float> score(const std::vector<std::string>& texts) const;
    // What a conversational row is scored as: its prompt messages and the completion as the
    // assistant's reply, rendered with the reward model's own chat template (TRL's apply_chat_template).
    std::string conversation_text(const std::vector<ChatMessage>& prompt, const std::string& completion) const;

private:
    std::unique_ptr<Model> model_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::string folder_;
    int64_t pad_token_id_ = 0;
    ChatTemplate chat_template_ = ChatTemplate::plain;
};

// What grove train and grove eval give RewardSet for its model rewards (on `device`).
HostRewardFactory reward_model_factory(const std::string& device);

}  // namespace grove
