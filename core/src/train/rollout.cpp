#include "train/rollout.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "grove/error.hpp"
#include "grove/model.hpp"
#include "grove/tokenizer.hpp"
#include "text/text_util.hpp"

namespace grove {

using nlohmann::json;

PromptSource::PromptSource(std::vector<BatchRow> prompts, int64_t num_generations, uint64_t seed, bool shuffle)
        : prompts_(std::move(prompts)), G_(num_generations), seed_(seed), shuffle_(shuffle) {
    fill_permutation();
}

PromptSource::PromptSource(std::vector<ReplayRow> replay, int64_t num_generations)
        : replay_(std::move(replay)), G_(num_generations) {}

void PromptSource::fill_permutation() {
    if (!replay_.empty()) return;
    at::Generator g = at::detail::createCPUGenerator(seed_ * 1000003ull + uint64_t(at_.epoch));
    at::Tensor p =
        shuffle_ ? at::randperm(int64_t(prompts_.size()), g, at::kLong) : at::arange(int64_t(prompts_.size()), at::kLong);
    permutation_.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
}

void PromptSource::restore(const Position& position) {
    at_ = position;
    fill_permutation();
}

double PromptSource::epoch_progress() const {
    return double(at_.epoch) + double(at_.position) / double(std::max<size_t>(1, prompt_count()));
}

std::vector<BatchRow> PromptSource::next_batch(int64_t rows) {
    std::vector<BatchRow> batch;
    if (!replay_.empty()) {  // whole groups in file order
        for (int64_t i = 0; i < rows; ++i) {
            if (at_.replay_position >= replay_.size()) {
                at_.replay_position = 0;
                ++at_.epoch;
            }
            const ReplayRow& r = replay_[at_.replay_position++];
            batch.push_back({r.prompt_ids, r.prompt_text, r.columns_json, &r});
        }
        at_.position = int64_t(at_.replay_position / size_t(G_));
        return batch;
    }
    const int64_t count = rows / G_;
    if (at_.position + count > int64_t(prompts_.size())) {  // TRL's RepeatSampler drops an incomplete last chunk
        ++at_.epoch;
        at_.position = 0;
        fill_permutation();
    }
    for (int64_t i = 0; i < count; ++i)
        for (int64_t j = 0; j < G_; ++j) batch.push_back(prompts_[size_t(permutation_[size_t(at_.position + i)])]);
    at_.position += count;
    return batch;
}

std::vector<BatchRow> shard_rows(const std::vector<BatchRow>& batch, int rank, int world_size) {
    const size_t n = batch.size() / size_t(world_size), first = size_t(rank) * n;
    return std::vector<BatchRow>(batch.begin() + long(first), batch.begin() + long(first + n));
}

at::Tensor model_tokens(const Rollout& rollout) {
    return rollout.model_token_mask.defined() ? rollout.model_token_mask : rollout.completions.completion_mask;
}

std::vector<int64_t> model_token_counts(const Rollout& rollout) {
    if (!rollout.model_token_mask.defined()) return rollout.completions.lengths;
    at::Tensor counts = rollout.model_token_mask.sum(1).to(at::kLong).contiguous();
    return std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
}

Rollout generate_rollout(const Model& model, std::vector<BatchRow> rows, const SamplingOptions& options, int64_t first_row) {
    std::vector<std::vector<int64_t>> prompts;
    for (const BatchRow& row : rows) prompts.push_back(row.prompt_ids);
    Rollout r;
    r.completions = generate(model, prompts, options);
    r.rows = std::move(rows);
    r.first_row = first_row;
    r.seed = options.seed;
    return r;
}

namespace {
// Rows of different lengths as one [rows, width] tensor, `fill` past each row's end.
template <class T>
at::Tensor padded_rows(const std::vector<std::vector<T>>& rows, int64_t width, T fill, at::ScalarType type) {
    at::Tensor out = at::full({int64_t(rows.size()), width}, double(fill), type);
    for (size_t i = 0; i < rows.size(); ++i)
        if (!rows[i].empty()) out[int64_t(i)].narrow(0, 0, int64_t(rows[i].size())).copy_(at::tensor(rows[i], type));
    return out;
}
}  // namespace

GenerationResult padded_completions(const std::vector<std::vector<int64_t>>& ids,
                                    const std::vector<std::vector<float>>& logprobs, const SamplingOptions& options) {
    const std::set<int64_t> eos(options.eos_token_ids.begin(), options.eos_token_ids.end());
    int64_t width = 1;
    for (const auto& row : ids) width = std::max<int64_t>(width, int64_t(row.size()));
    GenerationResult c;
    c.completion_ids = padded_rows(ids, width, options.pad_token_id, at::kLong);
    c.sampled_logprobs = padded_rows(logprobs, width, 0.0f, at::kFloat);
    c.truncated = at::zeros({int64_t(ids.size())}, at::kBool);
    for (size_t i = 0; i < ids.size(); ++i) {
        c.truncated[int64_t(i)] = ids[i].empty() || !eos.count(ids[i].back());
        c.lengths.push_back(int64_t(ids[i].size()));
    }
    c.completion_mask =
        (at::arange(width, at::kLong).unsqueeze(0) < at::tensor(c.lengths, at::kLong).unsqueeze(1)).to(at::kLong);
    return c;
}

at::Tensor padded_model_tokens(const std::vector<std::vector<int64_t>>& model_tokens, const GenerationResult& completions) {
    return padded_rows(model_tokens, completions.completion_ids.size(1), int64_t(0), at::kLong);
}

Rollout replay_rollout(std::vector<BatchRow> rows, const SamplingOptions& options, int64_t first_row) {
    const std::set<int64_t> eos(options.eos_token_ids.begin(), options.eos_token_ids.end());
    std::vector<std::vector<int64_t>> ids, model_tokens;
    std::vector<std::vector<float>> logprobs;
    bool multi_turn = false;
    for (const BatchRow& batch_row : rows) {
        const ReplayRow& row = *batch_row.replay;
        auto end = row.completion_ids.end();
        // a multi-turn row (one with an env_mask) holds an EOS after each model turn: it stays whole
        if (row.env_mask.empty()) {
            const auto first_eos = std::find_if(row.completion_ids.begin(), end, [&](int64_t id) { return eos.count(id) > 0; });
            if (first_eos != end) end = first_eos + 1;  // kept, as generation keeps it
        }
        const size_t length = size_t(end - row.completion_ids.begin());
        ids.emplace_back(row.completion_ids.begin(), end);
        // given sampling log-probs are kept, so save_rollouts writes them back
        logprobs.emplace_back(row.sampling_logprobs.begin(),
                              row.sampling_logprobs.begin() + long(row.sampling_logprobs.empty() ? 0 : length));
        // multi-turn rows: the model's tokens are those their env_mask marks; other rows' are all the model's
        model_tokens.push_back(row.env_mask.empty() ? std::vector<int64_t>(length, 1) : row.env_mask);
        multi_turn = multi_turn || !row.env_mask.empty();
    }
    Rollout r;
    r.completions = padded_completions(ids, logprobs, options);
    if (multi_turn) r.model_token_mask = padded_model_tokens(model_tokens, r.completions);
    r.rows = std::move(rows);
    r.first_row = first_row;
    r.seed = options.seed;
    return r;
}

}  // namespace grove
