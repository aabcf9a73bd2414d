#include "grove/reward_model.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "grove/error.hpp"
#include "grove/model.hpp"
#include "grove/tokenizer.hpp"

namespace grove {

namespace {
constexpr int64_t kRowsPerForward = 16;  // bounds the padded batch's memory on long texts

std::string text_of(const grove_text& t) { return std::string(t.data, t.size); }
}  // namespace

RewardModel::RewardModel(const std::string& folder, const std::string& device, const std::string& origin) {
    try {
        const ModelConfig config = load_model_config(folder);
        if (!config.sequence_classifier)
            throw Error(ErrorKind::input, folder + " is a " + config.architecture +
                                              ", not a reward model: [[rewards]] model = needs a sequence classifier "
                                              "(LlamaForSequenceClassification, Qwen2ForSequenceClassification, "
                                              "Qwen3ForSequenceClassification, MistralForSequenceClassification, "
                                              "Phi3ForSequenceClassification, SmolLM3ForSequenceClassification, "
                                              "Gemma2ForSequenceClassification, Gemma3TextForSequenceClassification, "
                                              "Qwen3MoeForSequenceClassification, Qwen2MoeForSequenceClassification or "
                                              "MixtralForSequenceClassification)");
        folder_ = folder;
        model_ = Model::load(folder, device, "float32");
        tokenizer_ = Tokenizer::load(folder);
        chat_template_ = chat_template_from_name("auto", tokenizer_->config());
    } catch (const Error& e) {
        throw Error(e.kind(), origin + ": " + e.what());
    }
    // TRL: the tokenizer's pad token, else its EOS; the model pools at the last token that is not it
    const TokenizerConfig& t = tokenizer_->config();
    std::optional<int64_t> pad = t.pad_id ? t.pad_id : t.eos_id;
    if (!pad)
        throw Error(ErrorKind::input, origin + ": " + folder +
                                          "'s tokenizer has neither a pad nor an EOS token, so the last real token of "
                                          "a padded row cannot be found; set pad_token in its tokenizer_config.json");
    pad_token_id_ = *pad;
}

std::string RewardModel::conversation_text(const std::vector<ChatMessage>& prompt, const std::string& completion) const {
    // TRL renders the checkpoint's own Jinja template; we cannot
    if (chat_template_ == ChatTemplate::plain || chat_template_ == ChatTemplate::opens_thinking ||
        chat_template_ == ChatTemplate::phi_not_rendered || chat_template_ == ChatTemplate::gemma_not_rendered ||
        chat_template_ == ChatTemplate::not_rendered)
        throw Error(ErrorKind::input,
                    folder_ +
                        ": the prompts are conversations, and this reward model's chat template "
                        "is none of the families Grove renders (ChatML, Qwen3, Llama 3, Llama 2, Phi-3, Phi-4, SmolLM3, "
                        "Gemma, Tulu, Mistral, DeepSeek-R1-Distill), so its "
                        "input would differ from TRL's: use text prompts or a reward plugin");
    std::vector<ChatMessage> messages = prompt;
    messages.push_back({"assistant", completion});
    return render_chat(chat_template_, messages, false, tokenizer_->config());
}

RewardModel::~RewardModel() = default;

std::vector<float> RewardModel::score(const std::vector<std::string>& texts) const {
    at::NoGradGuard no_grad;
    std::vector<float> out;
    for (size_t start = 0; start < texts.size(); start += kRowsPerForward) {
        const size_t end = std::min(texts.size(), start + kRowsPerForward);
        std::vector<std::vector<int64_t>> ids;
        int64_t width = 1;
        for (size_t i = start; i < end; ++i) {
            ids.push_back(tokenizer_->encode(texts[i], false));
            width = std::max<int64_t>(width, int64_t(ids.back().size()));
        }
        const int64_t B = int64_t(ids.size());
        at::Tensor tokens = at::full({B, width}, pad_token_id_, at::kLong), mask = at::zeros({B, width}, at::kLong);
        for (int64_t b = 0; b < B; ++b) {
            const int64_t n = int64_t(ids[size_t(b)].size());
            if (n == 0) continue;
            tokens[b].narrow(0, 0, n).copy_(at::tensor(ids[size_t(b)], at::kLong));
            mask[b].narrow(0, 0, n).fill_(1);
        }
        // transformers' pooling: the last position whose token is not the pad token (0 if none)
        const at::Tensor last = (at::arange(width, at::kLong) * (tokens != pad_token_id_).to(at::kLong)).argmax(-1);
        const at::Tensor positions = (mask.cumsum(-1) - 1).clamp_min(0);
        const at::Device device = model_->device();
        const at::Tensor hidden = model_->hidden_states(tokens.to(device), mask.to(device), positions.to(device));
        const at::Tensor pooled = hidden.index({at::arange(B, at::kLong).to(device), last.to(device)});
        const at::Tensor logits = at::linear(pooled.to(at::kFloat), model_->score_weight().to(at::kFloat)).cpu();
        for (int64_t b = 0; b < B; ++b) out.push_back(logits[b][0].item<float>());
    }
    return out;
}

HostRewardFactory reward_model_factory(const std::string& device) {
    return [device](const PluginUse& use) -> HostReward {
        auto model = std::make_shared<const RewardModel>(use.model, device, use.origin);
        return [model](const grove_reward_batch& batch, const PromptMessages* messages, std::vector<float>& scores) {
            std::vector<std::string> texts;
            for (uint32_t i = 0; i < batch.count; ++i) {
                const std::string completion = text_of(batch.completions[i]);
                if (messages && !(*messages)[i].empty())  // TRL's conversational form
                    texts.push_back(model->conversation_text((*messages)[i], completion));
                else  // its standard form
                    texts.push_back(text_of(batch.prompts[i]) + completion);
            }
            scores = model->score(texts);
        };
    };
}

}  // namespace grove
