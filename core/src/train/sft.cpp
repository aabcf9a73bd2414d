#include "grove/sft.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "grove/adapter_checkpoint.hpp"
#include "grove/adapter_host.hpp"
#include "grove/dataset.hpp"
#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/model.hpp"
#include "grove/optimizer.hpp"
#include "grove/plugin_host.hpp"
#include "grove/run_config.hpp"
#include "grove/tokenizer.hpp"
#include "model/autocast.hpp"
#include "train/checkpoint.hpp"
#include "train/run_log.hpp"
#include "train/sft_loss.hpp"

namespace grove {

namespace {
// The examples in the order SFT visits them: a permutation per pass (epoch), drawn from the run
// seed, so a resumed run can draw the same ones again.
class ExampleOrder {
public:
    ExampleOrder(int64_t examples, int64_t seed)
            : examples_(examples), generator_(at::detail::createCPUGenerator(uint64_t(seed))) {
        draw();
    }
    // Continues at `position` of pass `epoch` (0-based), as a checkpoint recorded it.
    void seek(const PromptSource::Position& p) {
        if (p.position < 0 || p.position > examples_)
            throw Error(ErrorKind::input, "the checkpoint is at example " + std::to_string(p.position) +
                                              " of a pass, but the data has " + std::to_string(examples_) +
                                              " examples: resume with the data it was trained on");
        while (at_.epoch < p.epoch) draw(), ++at_.epoch;
        at_.position = p.position;
    }
    // transformers' Trainer: an epoch is ceil(examples / batch) batches, the last one shorter,
    // taken `micro_batches` at a time; the last step of an epoch takes the batches left.
    std::vector<std::vector<int64_t>> next_step(int64_t batch, int64_t micro_batches) {
        if (at_.position == examples_) draw(), ++at_.epoch, at_.position = 0;
        std::vector<std::vector<int64_t>> step;
        while (int64_t(step.size()) < micro_batches && at_.position < examples_) {
            std::vector<int64_t>& picked = step.emplace_back();
            while (int64_t(picked.size()) < batch && at_.position < examples_)
                picked.push_back(order_[at_.position++].item<int64_t>());
        }
        return step;
    }
    const PromptSource::Position& position() const { return at_; }

private:
    void draw() { order_ = at::randperm(examples_, generator_, at::kLong); }
    int64_t examples_;
    at::Generator generator_;
    at::Tensor order_;
    PromptSource::Position at_;
};

SftDataOptions sft_data_options(const RunConfig& c) {
    SftDataOptions o;
    o.prompt_column = c.data.prompt_column;
    o.completion_column = c.data.completion_column;
    o.text_column = c.data.text_column;
    o.completion_only_loss = c.sft.completion_only_loss;
    o.assistant_only_loss = c.sft.assistant_only_loss;
    o.max_length = c.sft.max_length;
    o.keep_end = c.sft.keep_end;
    if (c.sft.packing) o.packing = packing_from_name(c.sft.packing_strategy);
    o.padding_free = c.sft.padding_free;
    return o;
}

// GRPO settings in a shared manifest, named when grove sft ignores them.
void warn_of_ignored_settings(const RunConfig& c, std::ostream* log) {
    if (!log) return;
    // TRL's SFTConfig does not have these
    for (const auto& [set, key] : {std::pair{c.model.cast_lm_head_to_fp32, "model.cast_lm_head_to_fp32"},
                                   {c.model.disable_dropout, "model.disable_dropout"}})
        if (set)
            *log << "grove: warning: " << key << " is a GRPO setting (TRL's GRPOConfig has it, its SFTConfig "
                 << "does not); grove sft ignores it\n";
    if (!c.data.shuffle)
        *log << "grove: warning: grove sft ignores data.shuffle = false: each epoch visits the examples in a new order, "
                "as transformers' Trainer does, and packing takes them in the file's order (TRL's default "
                "shuffle_dataset = False)\n";
}

// transformers' epoch: ceil(ceil(examples / batch) / micro_batches) optimizer steps
int64_t steps_per_epoch(const TrainSection& t, int64_t examples) {
    const int64_t batches = (examples + t.per_device_train_batch_size - 1) / t.per_device_train_batch_size;
    return std::max<int64_t>((batches + t.gradient_accumulation_steps - 1) / t.gradient_accumulation_steps, 1);
}

// transformers' step count: ceil(epochs x steps per epoch); max_steps > 0 overrides it.
int64_t total_steps(const TrainSection& t, int64_t examples) {
    if (t.max_steps > 0) return t.max_steps;
    return int64_t(std::ceil(t.num_train_epochs * double(steps_per_epoch(t, examples))));
}

// NEFTune's noise for the examples `picked` (SftNoise), or no hook
Model::EmbeddingHook neftune_hook(const SftNoise& noise, const std::vector<SftExample>& examples,
                                  const std::vector<int64_t>& picked) {
    if (noise.neftune_noise_alpha == 0.0) return {};
    // TRL's collated layout: a row per example padded to the longest, or one row of every token
    std::vector<int64_t> row_lengths;
    for (int64_t i : picked) row_lengths.push_back(int64_t(examples[size_t(i)].ids.size()));
    if (noise.padding_free) row_lengths = {std::accumulate(row_lengths.begin(), row_lengths.end(), int64_t(0))};
    const auto rows = int64_t(row_lengths.size());
    const int64_t width = *std::max_element(row_lengths.begin(), row_lengths.end());
    std::vector<int64_t> slots;  // each token's position in that layout
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < row_lengths[size_t(r)]; ++t) slots.push_back(r * width + t);
    return [alpha = noise.neftune_noise_alpha, rows, width, slots = at::tensor(slots, at::kLong)](const at::Tensor& h) {
        const int64_t H = h.size(1);
        // transformers' half-width, alpha / sqrt(tensor(L x H)), is float32's reciprocal times alpha
        const float half_width = (1.0f / std::sqrt(float(width * H))) * float(alpha);
        const at::Tensor drawn = at::zeros({rows, width, H}, h.options()).uniform_(-half_width, half_width);
        return h + drawn.view({rows * width, H}).index_select(0, slots.to(h.device()));
    };
}

}  // namespace

int64_t trained_tokens(const std::vector<SftExample>& examples, const std::vector<int64_t>& picked) {
    // TRL counts the labels before the shift, so a row's first token counts if it is trained (a row
    // without a prompt), though nothing predicts it
    int64_t count = 0;
    for (int64_t i : picked)
        for (uint8_t trained : examples[size_t(i)].trained) count += trained ? 1 : 0;
    return std::max<int64_t>(count, 1);
}

SftLoss sft_loss(Model& model, const std::vector<SftExample>& examples, const std::vector<int64_t>& picked,
                 const SftObjective& objective, const SftStep& step) {
    // labels = next token where it is trained, -100 elsewhere (prompt, environment, each row's last token)
    std::vector<int64_t> tokens, positions, labels, row_lengths;
    for (int64_t i : picked) {
        const SftExample& e = examples[size_t(i)];
        int64_t start = 0;  // each sequence of a packed example is a row of its own
        for (int64_t n : e.sequences()) {
            for (int64_t t = 0; t < n; ++t) {
                tokens.push_back(e.ids[size_t(start + t)]);
                positions.push_back(t);
                labels.push_back(t + 1 < n && e.trained[size_t(start + t + 1)] ? e.ids[size_t(start + t + 1)] : -100);
            }
            row_lengths.push_back(n);
            start += n;
        }
    }
    RouterLoad routing;
    const at::Tensor hidden = model.packed_hidden_states(at::tensor(tokens, at::kLong), at::tensor(positions, at::kLong),
                                                         row_lengths, objective.router_aux_loss_coef != 0 ? &routing : nullptr,
                                                         neftune_hook(step.noise, examples, picked));
    const at::Tensor logits = model.float32_logits(hidden);
    const at::Tensor targets = at::tensor(labels, at::kLong).to(logits.device());
    SftLoss out;
    const int64_t divisor = step.trained_tokens.value_or(
        std::max<int64_t>(std::count_if(labels.begin(), labels.end(), [](int64_t l) { return l != -100; }), 1));
    if (objective.dft) {  // -log p x p: 0 at the ignored positions, whose cross-entropy is 0
        const at::Tensor per_token = at::cross_entropy_loss(logits, targets, std::nullopt, at::Reduction::None, -100);
        out.loss = (per_token * at::exp(-per_token.detach())).sum() / double(divisor);
    } else {
        out.loss = at::cross_entropy_loss(logits, targets, std::nullopt, at::Reduction::Sum, -100) / double(divisor);
    }
    {
        at::NoGradGuard no_grad;
        const at::Tensor scored = targets.ne(-100).nonzero().squeeze(1);
        const double count = double(scored.numel());
        if (count > 0) {
            const at::Tensor z = logits.detach().index_select(0, scored);
            const at::Tensor normalizer = at::logsumexp(z, -1);
            out.entropy = (normalizer - (at::softmax(z, -1) * z).sum(-1)).sum().item<double>() / count;
            out.mean_token_accuracy = z.argmax(-1).eq(targets.index_select(0, scored)).sum().item<double>() / count;
        }
    }
    if (objective.router_aux_loss_coef != 0) {
        const at::Tensor aux = routing.balancing_loss().to(out.loss.device());
        out.aux_loss = aux.item<double>();
        out.loss = out.loss + aux * (objective.router_aux_loss_coef / double(step.micro_batches));
    }
    return out;
}

SftStepMetrics sft_backward(Model& model, const std::vector<SftExample>& examples,
                            const std::vector<std::vector<int64_t>>& micro_batches, const SftObjective& objective,
                            const SftNoise& noise, int64_t step_number) {
    std::vector<int64_t> all_picked;
    for (const auto& micro_batch : micro_batches) all_picked.insert(all_picked.end(), micro_batch.begin(), micro_batch.end());
    const double parts = double(micro_batches.size());
    const SftStep scale{trained_tokens(examples, all_picked), int64_t(micro_batches.size()), noise};
    SftStepMetrics out;
    for (const auto& micro_batch : micro_batches) {
        const SftLoss part = sft_loss(model, examples, micro_batch, objective, scale);
        const double value = part.loss.item<double>();
        if (!std::isfinite(value))
            throw Error(ErrorKind::runtime, "grove sft: the loss became " + std::to_string(value) + " at step " +
                                                std::to_string(step_number) + "; lower train.learning_rate");
        part.loss.backward();
        out.loss += value;
        if (part.aux_loss) out.aux_loss = out.aux_loss.value_or(0) + *part.aux_loss / parts;
        out.mean_token_accuracy += part.mean_token_accuracy / parts;
        out.entropy += part.entropy / parts;
    }
    return out;
}

std::map<std::string, double> sft_evaluate(Model& model, const std::vector<SftExample>& examples, int64_t batch_size,
                                           const SftObjective& objective) {
    at::NoGradGuard no_grad;
    double weighted_loss = 0, entropy = 0, accuracy = 0, aux = 0;
    int64_t batches = 0;
    bool has_aux = false;
    const auto N = int64_t(examples.size());
    for (int64_t first = 0; first < N; first += batch_size, ++batches) {
        std::vector<int64_t> picked;
        for (int64_t i = first; i < std::min(N, first + batch_size); ++i) picked.push_back(i);
        // without a step's token count, TRL's loss is the mean over the tokens the batch predicts
        const SftLoss part = sft_loss(model, examples, picked, objective, SftStep{});
        weighted_loss += part.loss.item<double>() * double(picked.size());
        entropy += part.entropy;
        accuracy += part.mean_token_accuracy;
        if (part.aux_loss) aux += *part.aux_loss, has_aux = true;
    }
    std::map<std::string, double> metrics{{"eval_loss", weighted_loss / double(std::max<int64_t>(N, 1))},
                                          {"eval_entropy", entropy / double(std::max<int64_t>(batches, 1))},
                                          {"eval_mean_token_accuracy", accuracy / double(std::max<int64_t>(batches, 1))}};
    if (has_aux) metrics["eval_aux_loss"] = aux / double(batches);
    return metrics;
}

SftResult run_sft(const Manifest& given, std::ostream* log, const SftOptions& options) {
    const Manifest manifest = manifest_to_resume(given, options.resume, log);
    const RunConfig c = RunConfig::from(manifest, RunConfig::Kind::sft);
    const std::string output = c.output.dir;
    const RunStart start = run_start(output, c.model.path, options.resume, options.overwrite, log);
    prepare_output_folder(output, start.clear);
    // [adapter]: full fine-tuning, or LoRA (TRL's peft_config); the plugin outlives the model, whose
    // adapted layers call into it when they are destroyed
    PluginHost host(plugin_search_path(c.plugin_dirs));
    const PluginInstance adapter = create_plugin(host, c.adapter, GROVE_PLUGIN_KIND_ADAPTER);
    AdapterHost adapter_host(adapter);
    auto model = Model::load(c.model.path, c.model.device, c.model.dtype);
    model->set_gradient_checkpointing(c.model.gradient_checkpointing);
    auto tokenizer = Tokenizer::load(c.model.path);
    ChatTemplate chat = c.chat_template(tokenizer->config());
    auto source = c.data.source;
    if (!source) throw Error(ErrorKind::manifest, c.manifest_path + ": grove sft needs data.source");
    std::optional<int64_t> eos = tokenizer->config().eos_id;
    if (!eos && !model->config().eos_token_ids.empty()) eos = model->config().eos_token_ids.front();
    const std::vector<SftExample> examples = load_sft_examples(*source, sft_data_options(c), *tokenizer, chat, eos, log);

    const bool full = adapter_host.trains_base_weights();
    c.check_adapter(adapter.info().name, full);
    model->set_base_trainable(full);
    at::manual_seed(uint64_t(c.train.seed));  // the adapter's initialisation
    if (!full) {
        model->attach_adapter(adapter_host);
        train_beside_adapter(*model, c.beside_adapter, c.adapter);
    }
    adapter_host.set_training(true);  // the adapter's dropout, as PEFT trains with it
    std::optional<at::DeviceType> autocast_device;
    if (c.bf16_autocast(model->device().is_cuda())) autocast_device = model->device().type();
    const SftObjective objective{c.sft.dft, c.router_aux_loss_coef_for(model->config())};
    const SftNoise noise{c.sft.neftune_noise_alpha, padding_free_batches(sft_data_options(c))};
    const std::unique_ptr<Optimizer> optimizer_owner =
        make_optimizer(c.train, trainable_parameters_or_refuse(*model, c.adapter, adapter.info().name));
    Optimizer& optimizer = *optimizer_owner;
    const int64_t total = total_steps(c.train, int64_t(examples.size()));
    const double epoch_steps = double(steps_per_epoch(c.train, int64_t(examples.size())));
    const LearningRateSchedule schedule = LearningRateSchedule::of(c.train, total);
    if (log) *log << schedule.ignored_warmup_warning() << ignored_optimizer_settings_warning(c.train);
    warn_of_ignored_settings(c, log);

    TrainingProgress progress;
    std::vector<MicroBatch> no_buffer;  // SFT has no generation batch to carry over
    const std::vector<int> every_tensor_here;
    CheckpointedState state{progress, no_buffer, optimizer.params(), optimizer, every_tensor_here};
    Checkpoints checkpoints(output, 0, 1, nullptr, manifest.resolved_toml(true), {});  // SFT has no rewards
    ExampleOrder order(int64_t(examples.size()), c.train.seed);
    if (start.resume_from) {
        checkpoints.restore(*start.resume_from, state);
        checkpoints.warn_of_changed_settings(*start.resume_from, log);
        order.seek(progress.sampler);
    }
    RunLog run_log(output, true, start.resume_from ? std::optional(RunLog::Resume{progress.global_step}) : std::nullopt,
                   RunLog::Files{false, c.logging.tensorboard, false});
    auto export_model = [&](const std::string& folder) {  // a Hugging Face folder, or the adapter in PEFT's layout
        if (full)
            model->save(folder);
        else
            save_adapter_checkpoint(folder, *model, adapter_host, c.adapter, c.model.path);
        copy_tokenizer_files(c.model.path, folder);
    };

    // TRL's eval_strategy = "steps" on data.eval_source, prepared as the training data, unpacked with
    // eval_packing = false in batches still padding-free when training's are (TRL's collator is shared)
    std::vector<SftExample> held_out;
    if (c.train.eval.strategy != IntervalStrategy::no || c.train.eval_on_start) {
        SftDataOptions held_out_options = sft_data_options(c);
        if (!c.sft.eval_packing) {
            held_out_options.padding_free = padding_free_batches(held_out_options);
            held_out_options.packing = SftDataOptions::Packing::none;
        }
        held_out = load_sft_examples(*c.data.eval_source, held_out_options, *tokenizer, chat, eos, log);
    }
    auto evaluate = [&](const std::vector<SftExample>& examples) {
        const auto started = std::chrono::steady_clock::now();
        adapter_host.set_training(false);  // Trainer.evaluate puts the model in eval mode
        AutocastScope autocast(autocast_device);
        auto figures = sft_evaluate(*model, examples, c.train.per_device_eval_batch_size, objective);
        adapter_host.set_training(true);
        figures["eval_num_tokens"] = double(progress.num_tokens);
        figures["eval_runtime"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        return figures;
    };
    if (c.train.best_model.metric && !held_out.empty()) {  // one example's evaluation names every metric
        std::vector<std::string> evaluated;
        for (const auto& [name, value] : evaluate({held_out.front()})) evaluated.push_back(name);
        check_metric_is_evaluated(c.train.best_model, evaluated, c.manifest_path);
    }
    if (c.train.eval_on_start && progress.global_step == 0) run_log.write_metrics(0, evaluate(held_out));

    SftResult result;
    for (int64_t step = progress.global_step; step < total; ++step) {
        const auto started = std::chrono::steady_clock::now();
        const auto picked = order.next_step(c.train.per_device_train_batch_size, c.train.gradient_accumulation_steps);
        seed_step_randomness(c.train.seed, step);
        const SftStepMetrics stepped = [&] {
            AutocastScope autocast(autocast_device);
            return sft_backward(*model, examples, picked, objective, noise, step + 1);
        }();
        double grad_norm = optimizer.clip_grad_norm(c.train.max_grad_norm);
        const double lr = schedule.rate(step);
        optimizer.step(lr);
        optimizer.zero_grad();
        progress.global_step = step + 1;
        progress.sampler = order.position();
        // TRL's num_tokens: every token of the examples trained on so far, prompts included
        for (const auto& micro_batch : picked)
            for (int64_t example : micro_batch) progress.num_tokens += int64_t(examples[size_t(example)].ids.size());
        result.losses.push_back(stepped.loss);
        std::map<std::string, double> logged{{"loss", stepped.loss},       {"grad_norm", grad_norm},
                                             {"learning_rate", lr},        {"mean_token_accuracy", stepped.mean_token_accuracy},
                                             {"entropy", stepped.entropy}, {"num_tokens", double(progress.num_tokens)}};
        if (stepped.aux_loss) logged["aux_loss"] = *stepped.aux_loss;
        // seconds of the step's passes and update (grove train's step_time), before any evaluation
        logged["step_time"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        const bool evaluated = c.train.eval.due(step + 1, total, epoch_steps);
        if (evaluated) logged.merge(evaluate(held_out));
        const EvaluationOutcome evaluation =
            evaluated ? record_evaluation(c.train.best_model, logged, step + 1, progress.best) : EvaluationOutcome{};
        run_log.write_metrics(step + 1, logged);
        const Interval& lines = c.logging.progress_lines;
        if (log && lines.strategy != IntervalStrategy::no && (lines.due(step + 1, total, epoch_steps) || step + 1 == total))
            *log << "sft step " << step + 1 << "/" << total << "  loss " << stepped.loss << "  grad_norm " << grad_norm
                 << (logged.count("eval_loss") ? "  eval_loss " + std::to_string(logged.at("eval_loss")) : "") << "\n"
                 << std::flush;
        const bool last = step + 1 == total || evaluation.stop_early;  // stays whole: it can always be resumed
        if (last || checkpoint_due(c.output, step + 1, total, epoch_steps, evaluation.new_best))
            checkpoints.save(state, false, c.manifest_path, export_model, c.output.save_total_limit,
                             c.output.save_only_model && !last);
        if (evaluation.stop_early) {
            if (log) *log << early_stopping_note(c.train.best_model, progress.best, step + 1, total);
            break;
        }
    }
    if (!checkpoints.write_best_model(c.train.best_model, progress.best, log)) export_model(output);
    result.output = output;
    return result;
}

}  // namespace grove
