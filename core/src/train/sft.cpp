#include "grove/sft.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "grove/dataset.hpp"
#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/model.hpp"
#include "grove/optimizer.hpp"
#include "grove/run_config.hpp"
#include "grove/tokenizer.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

SftResult run_sft(const Manifest& manifest, std::ostream* log) {
    const RunConfig c = RunConfig::from(manifest);
    auto model = Model::load(c.model.path, c.model.device, c.model.dtype);
    auto tokenizer = Tokenizer::load(c.model.path);
    ChatTemplate chat = chat_template_from_name(c.model.chat_template, tokenizer->config());
    auto source = c.data.source;
    if (!source) throw Error(ErrorKind::manifest, c.manifest_path + ": grove sft needs data.source");
    auto rows = load_prompts(*source, c.data.prompt_column);
    std::string column = c.data.completion_column;
    std::optional<int64_t> eos = tokenizer->config().eos_id;
    if (!eos && !model->config().eos_token_ids.empty()) eos = model->config().eos_token_ids.front();

    // tokenized examples: prompt ids, then completion ids + EOS (the part the loss sees)
    std::vector<std::vector<int64_t>> inputs;
    std::vector<int64_t> prompt_lengths;
    for (const auto& row : rows) {
        json columns = json::parse(row.columns_json);
        if (!columns.contains(column) || !columns[column].is_string())
            throw Error(ErrorKind::input,
                        row.origin + ": no text column \"" + column + "\" (data.completion_column) to imitate");
        std::string prompt = prompt_text(row, chat, tokenizer->config());
        std::vector<int64_t> ids = tokenizer->encode(prompt, false);
        prompt_lengths.push_back(int64_t(ids.size()));
        for (int64_t id : tokenizer->encode(columns[column].get<std::string>(), false)) ids.push_back(id);
        if (eos) ids.push_back(*eos);
        inputs.push_back(std::move(ids));
    }

    model->set_base_trainable(true);
    AdamWOptions ao;
    ao.beta1 = c.train.adam_beta1;
    ao.beta2 = c.train.adam_beta2;
    ao.epsilon = c.train.adam_epsilon;
    ao.weight_decay = c.train.weight_decay;
    AdamW optimizer(model->trainable_parameters(), ao);
    int64_t batch = c.train.per_device_train_batch_size;
    int64_t total = c.train.max_steps;
    if (total <= 0) total = int64_t(std::ceil(c.train.num_train_epochs * double(rows.size()) / double(batch)));
    int64_t warmup = c.train.warmup_steps > 0 ? c.train.warmup_steps : int64_t(std::ceil(c.train.warmup_ratio * double(total)));
    std::string output = c.output.dir;
    fs::create_directories(output);
    std::ofstream metrics(fs::path(output) / "metrics.jsonl");
    at::Generator g = at::detail::createCPUGenerator(uint64_t(c.train.seed));
    at::Tensor order = at::randperm(int64_t(inputs.size()), g, at::kLong);
    int64_t cursor = 0;

    SftResult result;
    for (int64_t step = 0; step < total; ++step) {
        std::vector<int64_t> picked;
        for (int64_t b = 0; b < batch; ++b) {
            if (cursor == int64_t(inputs.size())) {
                order = at::randperm(int64_t(inputs.size()), g, at::kLong);
                cursor = 0;
            }
            picked.push_back(order[cursor++].item<int64_t>());
        }
        int64_t T = 0;
        for (int64_t i : picked) T = std::max<int64_t>(T, int64_t(inputs[size_t(i)].size()));
        // right-padded; labels = next token, -100 on prompt positions and padding
        at::Tensor ids = at::zeros({batch, T}, at::kLong), mask = at::zeros({batch, T}, at::kLong);
        at::Tensor labels = at::full({batch, T}, -100, at::kLong);
        for (int64_t b = 0; b < batch; ++b) {
            const auto& seq = inputs[size_t(picked[size_t(b)])];
            int64_t n = int64_t(seq.size()), p = prompt_lengths[size_t(picked[size_t(b)])];
            ids[b].narrow(0, 0, n).copy_(at::tensor(seq, at::kLong));
            mask[b].narrow(0, 0, n).fill_(1);
            if (n > p)
                labels[b]
                    .narrow(0, p - 1, n - p)
                    .copy_(at::tensor(std::vector<int64_t>(seq.begin() + p, seq.end()), at::kLong));
        }
        at::Tensor positions = (mask.cumsum(-1) - 1).clamp_min(0);
        at::Tensor logits = model->forward(ids, mask, positions).to(at::kFloat);
        at::Tensor loss = at::cross_entropy_loss(logits.view({batch * T, -1}), labels.view({-1}).to(logits.device()),
                                                 std::nullopt, at::Reduction::Mean, -100);
        double value = loss.item<double>();
        if (!std::isfinite(value))
            throw Error(ErrorKind::runtime, "grove sft: the loss became " + std::to_string(value) + " at step " +
                                                std::to_string(step + 1) + "; lower train.learning_rate");
        loss.backward();
        double grad_norm = optimizer.clip_grad_norm(c.train.max_grad_norm);
        double lr = c.train.learning_rate * learning_rate_multiplier(c.train.lr_scheduler_type, step, warmup, total);
        optimizer.step(lr);
        optimizer.zero_grad();
        result.losses.push_back(value);
        metrics << json({{"step", step + 1}, {"loss", value}, {"grad_norm", grad_norm}, {"learning_rate", lr}}).dump() << "\n";
        if (log && ((step + 1) % c.logging.logging_steps == 0 || step + 1 == total))
            *log << "sft step " << step + 1 << "/" << total << "  loss " << value << "  grad_norm " << grad_norm << "\n"
                 << std::flush;
    }
    model->save(output);
    copy_tokenizer_files(c.model.path, output);
    result.output = output;
    return result;
}

}  // namespace grove
