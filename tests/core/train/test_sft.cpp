// The warm-start pipeline from nothing: a tokenizer trained on the built-in task, a freshly
// initialised Llama, `grove sft` on the reference completions, and `grove eval` of the result.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <map>
#include <set>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "grove/adapter_checkpoint.hpp"
#include "grove/dataset.hpp"
#include "grove/model.hpp"
#include "grove/error.hpp"
#include "grove/safetensors.hpp"
#include "grove/tensorboard.hpp"
#include "grove/sft.hpp"
#include "grove/tokenizer.hpp"
#include "model/tensor_io.hpp"
#include "train/sft_loss.hpp"
#include "plugin_test_support.hpp"

namespace fs = std::filesystem;
using grove::test::checkpoint_steps_in;

namespace {
// 8 prompt-completion rows: "I + 2 =" -> " I+2"
void write_pairs(const std::string& path) {
    std::ofstream data(path);
    for (int i = 0; i < 8; ++i)
        data << nlohmann::json({{"prompt", std::to_string(i) + " + 2 ="}, {"completion", " " + std::to_string(i + 2)}}).dump()
             << "\n";
}

// A folder `name` under the tests' trainer folder holding the pairs (training and held-out data) and
// an sft.toml for the tiny Llama in batches of 4, followed by `settings` (more [train] keys first).
std::string pairs_run(const std::string& name, const std::string& settings) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_pairs(dir + "/pairs.jsonl");
    std::ofstream(dir + "/sft.toml") << "[model]\npath = \"" << GROVE_TEST_BINARY_DIR
                                     << "/models/tiny/llama_gqa\"\nchat_template = \"none\"\n"
                                        "[data]\nsource = \"pairs.jsonl\"\neval_source = \"pairs.jsonl\"\n"
                                        "[[rewards]]\nplugin = \"correctness\"\n[generation]\nnum_generations = 4\n"
                                        "[train]\nper_device_train_batch_size = 4\n"
                                     << settings;
    return dir;
}

// Whether two model folders hold the same tensors in model.safetensors.
bool same_weights(const std::string& a_folder, const std::string& b_folder) {
    grove::SafetensorsFile a(a_folder + "/model.safetensors"), b(b_folder + "/model.safetensors");
    for (const auto& t : a.tensors()) {
        const grove::TensorEntry* other = b.find(t.name);
        if (!other || !at::equal(grove::tensor_from_entry(t, a.path()), grove::tensor_from_entry(*other, b.path())))
            return false;
    }
    return true;
}
}  // namespace

TEST(Sft, FromScratchTheModelLearnsTheAnswerFormat) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/sft";
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto step = [&](const std::string& args) {
        auto r = grove::test::run_grove(args);
        EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.out;
        return r;
    };
    step("tokenizer train --input builtin:arithmetic --out " + dir +
         "/tok --vocab-size 512 --symbol '<think>' "
         "--symbol '</think>' --symbol '<answer>' --symbol '</answer>'");
    step("init-model " + dir + "/base --tokenizer " + dir +
         "/tok --hidden 64 --layers 2 --heads 4 --kv-heads 2 "
         "--intermediate 192 --seed 1");
    auto before = nlohmann::json::parse(step("eval --model " + dir +
                                             "/base --data builtin:arithmetic-test --limit 20 "
                                             "--reward format --greedy --max-new-tokens 24 --json 2>/dev/null")
                                            .out);
    std::ofstream(dir + "/sft.toml") << "[model]\npath = \"base\"\nchat_template = \"plain\"\n"
                                        "[data]\nsource = \"builtin:arithmetic\"\n"
                                        "[[rewards]]\nplugin = \"correctness\"\n"
                                        "[train]\nper_device_train_batch_size = 16\nlearning_rate = 3e-3\nwarmup_steps = 5\n"
                                        "lr_scheduler_type = \"cosine\"\nmax_steps = 100\n"
                                        "[output]\ndir = \"sft\"\n[logging]\nlogging_steps = 10\n";
    step("sft " + dir + "/sft.toml");
    std::vector<double> losses;
    std::ifstream metrics(dir + "/sft/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    ASSERT_EQ(losses.size(), 100u);
    EXPECT_LT(losses.back(), 0.5 * losses.front()) << "loss " << losses.front() << " -> " << losses.back();
    auto after = nlohmann::json::parse(step("eval --model " + dir +
                                            "/sft --data builtin:arithmetic-test --limit 20 "
                                            "--reward format --greedy --max-new-tokens 24 --json 2>/dev/null")
                                           .out);
    EXPECT_EQ(before["format_rate"].get<double>(), 0.0);  // a random model never writes the format
    EXPECT_GE(after["format_rate"].get<double>(), 0.8) << after["rows"][0]["completion"];
}

// A reference episode as turns: each turn is tokenized on its own (as an episode's turns and
// observations are), and only the model's turns and the EOS are trained. The text prompt gets the
// tokenizer's special tokens (Gemma's <bos>), as GRPO training tokenizes it.
TEST(Sft, AnEpisodesEnvironmentTurnsAreContextOnly) {
    auto tokenizer = grove::Tokenizer::load(std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/gemma3_window");
    const std::string prompt = "What is 12 * 34?";
    nlohmann::json row = {{"prompt", prompt},
                          {"episode",
                           {{{"role", "model"}, {"text", "<calc>12 * 34</calc>"}},
                            {{"role", "environment"}, {"text", "<result>408</result>"}},
                            {{"role", "model"}, {"text", "<answer>408</answer>"}}}}};
    grove::SftDataOptions options;
    options.completion_column = "episode";
    const auto e = grove::sft_example(row, "rows.jsonl:3", options, *tokenizer, grove::ChatTemplate::plain, 2);
    std::vector<int64_t> ids = tokenizer->encode(prompt, true);
    ASSERT_EQ(ids[0], 2) << "Gemma's <bos>";
    std::vector<uint8_t> trained(ids.size(), 0);
    for (auto [text, learn] :
         {std::pair{"<calc>12 * 34</calc>", 1}, {"<result>408</result>", 0}, {"<answer>408</answer>", 1}}) {
        const auto part = tokenizer->encode(text, false);
        ids.insert(ids.end(), part.begin(), part.end());
        trained.resize(ids.size(), uint8_t(learn));
    }
    ids.push_back(2);
    trained.push_back(1);
    EXPECT_EQ(e.ids, ids);
    EXPECT_EQ(e.trained, trained);
    // completion_only_loss = false trains the prompt too, never the environment's turns
    options.completion_only_loss = false;
    const auto whole = grove::sft_example(row, "rows.jsonl:3", options, *tokenizer, grove::ChatTemplate::plain, 2);
    std::vector<uint8_t> with_prompt = trained;
    std::fill(with_prompt.begin(), with_prompt.begin() + long(tokenizer->encode(prompt, true).size()), 1);
    EXPECT_EQ(whole.trained, with_prompt);

    row["episode"] = {{{"role", "tool"}, {"text", "x"}}};
    try {
        grove::sft_example(row, "rows.jsonl:3", options, *tokenizer, grove::ChatTemplate::plain, 2);
        FAIL() << "a turn with role 'tool' was accepted";
    } catch (const grove::Error& error) {
        const std::string what = error.what();
        EXPECT_NE(what.find("rows.jsonl:3: column \"episode\": each turn needs \"role\" (model or environment)"),
                  std::string::npos)
            << what;
    }
}

// sft.assistant_only_loss marks what it can mark as TRL does, and refuses, naming the row: a row that
// is no conversation, a chat template family without TRL's training template, and a turn whose edge
// falls inside a token. (TrlReference cases compare what it marks for each family with TRL's.)
TEST(SftData, AssistantOnlyLossRefusesWhatItCannotMarkAsTrl) {
    const std::string tiny = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/";
    grove::SftDataOptions options;
    options.assistant_only_loss = true;
    auto refusal = [&](const nlohmann::json& row, const std::string& tokenizer_folder, grove::ChatTemplate chat) {
        const auto tokenizer = grove::Tokenizer::load(tokenizer_folder);
        try {
            grove::sft_example(row, "rows.jsonl:4", options, *tokenizer, chat, tokenizer->config().eos_id);
        } catch (const grove::Error& error) {
            return std::string(error.what());
        }
        return std::string("accepted");
    };
    const nlohmann::json conversation = {
        {"messages", {{{"role", "user"}, {"content", "Hi."}}, {{"role", "assistant"}, {"content", "Hello."}}}}};
    EXPECT_CONTAINS(refusal({{"prompt", "Hi."}, {"completion", " Hello."}}, tiny + "llama_gqa", grove::ChatTemplate::chatml),
                    "rows.jsonl:4: sft.assistant_only_loss trains the assistant turns of conversation rows");
    EXPECT_CONTAINS(refusal(conversation, tiny + "mistral_mha", grove::ChatTemplate::mistral),
                    "rows.jsonl:4: sft.assistant_only_loss marks assistant turns as TRL's training chat templates do for "
                    "the chatml, qwen3, qwen3_instruct, llama3 and gemma families, not for the mistral chat template");
    EXPECT_EQ(refusal(conversation, tiny + "llama_gqa", grove::ChatTemplate::chatml), "accepted");
    // a row's tools under a checkpoint's ChatML template without a tools section (transformers drops
    // them), and under Mistral's (which writes none)
    nlohmann::json with_tools = conversation;
    with_tools["tools"] = {{{"type", "function"}, {"function", {{"name", "add"}}}}};
    EXPECT_CONTAINS(refusal(with_tools, tiny + "llama_gqa", grove::ChatTemplate::chatml),
                    "rows.jsonl:4: the row has \"tools\", but the checkpoint's ChatML template has no tools section");
    with_tools["tools"] = nlohmann::json::array();
    EXPECT_EQ(refusal(with_tools, tiny + "llama_gqa", grove::ChatTemplate::chatml), "accepted");
    with_tools["tools"] = {{{"type", "function"}, {"function", {{"name", "add"}}}}};
    options.assistant_only_loss = false;  // (Mistral has no training template: that refusal would come first)
    EXPECT_CONTAINS(refusal(with_tools, tiny + "mistral_mha", grove::ChatTemplate::mistral),
                    "rows.jsonl:4: the conversation has tools");
    options.assistant_only_loss = true;
    // a tokenizer with one token for "assistant\n": chatml's turn starts inside it, so no mask is guessed
    const std::string merged = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/assistant_newline_token";
    fs::create_directories(merged);
    fs::copy_file(tiny + "llama_gqa/tokenizer_config.json", merged + "/tokenizer_config.json",
                  fs::copy_options::overwrite_existing);
    nlohmann::json tokenizer_json = nlohmann::json::parse(std::ifstream(tiny + "llama_gqa/tokenizer.json"));
    tokenizer_json["added_tokens"].push_back({{"id", 300},
                                              {"content", "assistant\n"},
                                              {"single_word", false},
                                              {"lstrip", false},
                                              {"rstrip", false},
                                              {"normalized", false},
                                              {"special", false}});
    std::ofstream(merged + "/tokenizer.json") << tokenizer_json.dump();
    EXPECT_CONTAINS(refusal(conversation, merged, grove::ChatTemplate::chatml),
                    "rows.jsonl:4: an assistant turn starts or ends inside a token of this tokenizer");
    // what it marks: chatml's turn from the newline after "<|im_start|>assistant" through "<|im_end|>\n"
    const auto tokenizer = grove::Tokenizer::load(tiny + "llama_gqa");
    const auto e = grove::sft_example(conversation, "rows.jsonl:4", options, *tokenizer, grove::ChatTemplate::chatml,
                                      tokenizer->config().eos_id);
    std::vector<int64_t> marked;
    for (size_t i = 0; i < e.ids.size(); ++i)
        if (e.trained[i]) marked.push_back(e.ids[i]);
    EXPECT_EQ(tokenizer->decode(marked, false), "\nHello.<|im_end|>\n");
}

// TRL 1.16's SFTTrainer prepares each of its dataset formats (language modeling, conversational
// language modeling, prompt-completion, conversational prompt-completion, tokenized rows with or
// without masks or labels) with the tiny checkpoints'
// tokenizers and chat templates (ChatML, Gemma's, Qwen3's reasoning blocks), under its defaults, a
// 24-token limit keeping either end, completion_only_loss = false, packing into rows of 32 tokens
// (bfd, bfd_split, wrapped) and padding-free rows, and assistant_only_loss with TRL's Qwen2.5, Qwen3, Llama 3 and Gemma 3
// templates (tests/core/train/trl_sft_data_reference.py);
// grove sft's examples are its input_ids, with trained = labels != -100 (after the padding-free
// collator's masking) and its packed sequence lengths, row for row, the rows TRL drops left out.
TEST(SftData, PreparesRowsAsTrl) {
    std::ifstream in(std::string(GROVE_TEST_BINARY_DIR) + "/trainer/trl_sft_data/cases.json");
    ASSERT_TRUE(in) << "run the sft_data_trl_reference test first";
    const nlohmann::json cases = nlohmann::json::parse(in);
    ASSERT_GE(cases.size(), 100u);
    for (const auto& c : cases) {
        SCOPED_TRACE(c["name"].get<std::string>());
        auto tokenizer = grove::Tokenizer::load(c["tokenizer"]);
        grove::SftDataOptions o;
        const auto& options = c["options"];
        o.max_length = !options.contains("max_length")   ? 1024
                       : options["max_length"].is_null() ? 0
                                                         : options["max_length"].get<int64_t>();
        o.keep_end = options.value("truncation_mode", "keep_start") == "keep_end";
        o.completion_only_loss = options.value("completion_only_loss", true);
        o.assistant_only_loss = options.value("assistant_only_loss", false);
        if (options.value("packing", false)) o.packing = grove::packing_from_name(options.value("packing_strategy", "bfd"));
        o.padding_free = options.value("padding_free", false);
        const auto chat = grove::chat_template_from_name("auto", tokenizer->config());
        const auto examples = grove::load_sft_examples(c["data"], o, *tokenizer, chat, tokenizer->config().eos_id, nullptr);
        ASSERT_EQ(examples.size(), c["rows"].size());
        for (size_t i = 0; i < examples.size(); ++i) {
            const auto& row = c["rows"][i];
            EXPECT_EQ(examples[i].ids, row["input_ids"].get<std::vector<int64_t>>()) << "row " << i;
            std::vector<uint8_t> trained;
            for (const auto& label : row["labels"]) trained.push_back(label.get<int64_t>() != -100);
            EXPECT_EQ(examples[i].trained, trained) << "row " << i;
            EXPECT_EQ(examples[i].sequence_lengths,
                      row["seq_lengths"].is_null() ? std::vector<int64_t>{} : row["seq_lengths"].get<std::vector<int64_t>>())
                << "row " << i;
        }
    }
}

// grove sft checkpoints as grove train does: 2 steps, then --resume to 4, ends with the weights and
// metrics of 4 steps straight (8 examples in batches of 4: the first pass ends at the checkpoint,
// the resumed steps draw the second); a folder that holds a run is refused unless resumed or
// overwritten, and never overwritten when it holds the model being trained.
TEST(Sft, ResumesExactlyAndKeepsAnEarlierRun) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/sft_resume";
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_pairs(dir + "/pairs.jsonl");
    std::ofstream(dir + "/sft.toml") << "[model]\npath = \"" << GROVE_TEST_BINARY_DIR
                                     << "/models/tiny/llama_gqa\"\nchat_template = \"none\"\n"
                                        "[data]\nsource = \"pairs.jsonl\"\n[[rewards]]\nplugin = \"correctness\"\n"
                                        "[generation]\nnum_generations = 4\n"
                                        "[train]\nper_device_train_batch_size = 4\nlearning_rate = 1e-3\n"
                                        "lr_scheduler_type = \"constant\"\nweight_decay = 0.1\n"
                                        "[output]\nsave_steps = 2\n[logging]\nlogging_steps = 1\n"
                                        "report_to = \"tensorboard\"\n";
    auto sft = [&](const std::string& out, const std::string& extra) {
        return grove::test::run_grove("sft " + dir + "/sft.toml --set 'output.dir=\"" + out + "\"' " + extra + " 2>&1");
    };
    auto weights = [](const std::string& folder) {
        grove::SafetensorsFile f(folder + "/model.safetensors");
        std::map<std::string, at::Tensor> out;
        for (const auto& t : f.tensors()) out[t.name] = grove::tensor_from_entry(t, f.path()).clone();
        return out;
    };
    auto steps_logged = [](const std::string& out) {
        std::vector<int64_t> steps;
        std::ifstream in(out + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
        return steps;
    };
    ASSERT_EQ(sft(dir + "/straight", "--set train.max_steps=4").exit_code, 0);
    ASSERT_EQ(sft(dir + "/resumed", "--set train.max_steps=2").exit_code, 0);
    auto resumed = sft(dir + "/resumed", "--set train.max_steps=4 --resume");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
    EXPECT_NE(resumed.out.find("sft step 3/4"), std::string::npos) << resumed.out;
    EXPECT_EQ(resumed.out.find("sft step 2/4"), std::string::npos) << "the resumed run starts after its checkpoint:\n"
                                                                   << resumed.out;

    EXPECT_EQ(steps_logged(dir + "/resumed"), (std::vector<int64_t>{1, 2, 3, 4}));
    std::vector<int64_t> tensorboard_steps;  // logging.report_to: the event file holds each step once too
    for (const auto& event : grove::read_event_file(dir + "/resumed/runs/events.out.tfevents.grove"))
        if (event.has_step) tensorboard_steps.push_back(event.step);
    EXPECT_EQ(tensorboard_steps, (std::vector<int64_t>{1, 2, 3, 4}));
    auto a = weights(dir + "/straight"), b = weights(dir + "/resumed");
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(t, b.at(name))) << name;
    double moved = 0.0;  // steps 3 and 4 changed the weights after checkpoint-2
    for (const auto& [name, t] : weights(dir + "/resumed/checkpoint-2"))
        moved = std::max(moved, (t - b.at(name)).abs().max().item<double>());
    EXPECT_GT(moved, 0.0);
    EXPECT_TRUE(fs::exists(dir + "/resumed/checkpoint-4/tokenizer.json")) << "a checkpoint is a model folder to load";
    auto again = sft(dir + "/resumed", "--set train.max_steps=4 --resume");
    EXPECT_EQ(again.exit_code, 0) << again.out;
    EXPECT_NE(again.out.find("sft had no steps left"), std::string::npos) << again.out;

    // train.gradient_accumulation_steps, scaled as TRL's Trainer scales it (each micro-batch's token
    // sum over the trained tokens of the whole step): 2 micro-batches of 2 examples take the steps
    // of batches of 4 — the same losses and weights, up to float rounding
    auto accumulated = sft(dir + "/accumulated",
                           "--set train.max_steps=4 --set train.per_device_train_batch_size=2 "
                           "--set train.gradient_accumulation_steps=2");
    ASSERT_EQ(accumulated.exit_code, 0) << accumulated.out;
    auto losses_logged = [](const std::string& out) {
        std::vector<double> losses;
        std::ifstream in(out + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);) losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
        return losses;
    };
    const auto whole_losses = losses_logged(dir + "/straight"), accumulated_losses = losses_logged(dir + "/accumulated");
    ASSERT_EQ(accumulated_losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(accumulated_losses[i], whole_losses[i], 1e-5) << "step " << i + 1;
    double apart = 0.0;
    for (const auto& [name, t] : weights(dir + "/accumulated"))
        apart = std::max(apart, (t - a.at(name)).abs().max().item<double>());
    EXPECT_LT(apart, 1e-4) << "after 4 steps of learning rate 1e-3";

    // a GRPO-only setting in the shared manifest is named as ignored, not silently dropped
    auto cast = sft(dir + "/cast", "--set train.max_steps=1 --set model.cast_lm_head_to_fp32=true");
    EXPECT_EQ(cast.exit_code, 0) << cast.out;
    EXPECT_NE(cast.out.find("warning: model.cast_lm_head_to_fp32 is a GRPO setting"), std::string::npos) << cast.out;
    EXPECT_EQ(sft(dir + "/plain", "--set train.max_steps=1").out.find("cast_lm_head_to_fp32"), std::string::npos);

    auto refused = sft(dir + "/straight", "--set train.max_steps=4");
    EXPECT_EQ(refused.exit_code, 2);
    EXPECT_NE(refused.out.find("already holds a run: pass --resume to continue it, --overwrite to replace it"),
              std::string::npos)
        << refused.out;
    EXPECT_EQ(sft(dir + "/straight", "--set train.max_steps=1 --overwrite").exit_code, 0);
    EXPECT_EQ(steps_logged(dir + "/straight"), (std::vector<int64_t>{1})) << "--overwrite starts the run again";

    // fine-tuning in place: the model inside output.dir
    fs::create_directories(dir + "/inplace");
    fs::copy(std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa", dir + "/inplace/base", fs::copy_options::recursive);
    const std::string in_place = "--set train.max_steps=1 --set 'model.path=\"" + dir + "/inplace/base\"'";
    ASSERT_EQ(sft(dir + "/inplace", in_place).exit_code, 0);
    auto kept = sft(dir + "/inplace", in_place + " --overwrite");
    EXPECT_EQ(kept.exit_code, 2);
    EXPECT_NE(kept.out.find("--overwrite would delete " + dir + "/inplace, which holds the model it trains"), std::string::npos)
        << kept.out;
    EXPECT_TRUE(fs::exists(dir + "/inplace/base/model.safetensors"));
}

// Epochs as transformers' Trainer counts them: 10 examples in batches of 4 are 3 batches an epoch
// (the last of 2), in steps of 2 batches: 2 steps an epoch, the second of one batch; 2 epochs are 4
// steps, 1.5 epochs ceil(1.5 x 2) = 3. TRL's num_tokens (every token trained on so far) shows each
// epoch takes every example exactly once, whatever the shuffle; save_strategy = "epoch" saves where
// an epoch ends.
TEST(Sft, EpochsCountStepsAsTransformersTrainer) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/sft_epochs";
    fs::remove_all(dir);
    fs::create_directories(dir);
    {
        std::ofstream data(dir + "/texts.jsonl");
        for (int i = 0; i < 10; ++i) data << nlohmann::json({{"text", std::string(size_t(i + 1), 'a') + " b"}}).dump() << "\n";
    }
    const std::string model = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa";
    std::ofstream(dir + "/sft.toml") << "[model]\npath = \"" << model
                                     << "\"\nchat_template = \"none\"\n[data]\nsource = \"texts.jsonl\"\n"
                                        "[[rewards]]\nplugin = \"correctness\"\n[generation]\nnum_generations = 4\n"
                                        "[train]\nper_device_train_batch_size = 4\ngradient_accumulation_steps = 2\n"
                                        "[logging]\nlogging_steps = 1\n";
    auto tokenizer = grove::Tokenizer::load(model);
    int64_t all_tokens = 0;
    for (const auto& e : grove::load_sft_examples(dir + "/texts.jsonl", {}, *tokenizer, grove::ChatTemplate::plain,
                                                  tokenizer->config().eos_id, nullptr))
        all_tokens += int64_t(e.ids.size());
    auto tokens_logged = [&](const std::string& epochs) {
        const std::string out = dir + "/epochs" + epochs;
        auto r = grove::test::run_grove("sft " + dir + "/sft.toml --set 'output.dir=\"" + out +
                                        "\"' --set train.num_train_epochs=" + epochs + " 2>&1");
        EXPECT_EQ(r.exit_code, 0) << r.out;
        std::vector<int64_t> tokens;
        std::ifstream in(out + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);)
            tokens.push_back(int64_t(nlohmann::json::parse(line)["num_tokens"].get<double>()));
        return tokens;
    };
    const auto two = tokens_logged("2");
    ASSERT_EQ(two.size(), 4u);
    EXPECT_EQ(two[1], all_tokens) << "the first epoch ends with the second step";
    EXPECT_EQ(two[3], 2 * all_tokens);
    EXPECT_LT(two[1] - two[0], two[0]) << "the epoch's last step has its last batch, 2 examples";
    EXPECT_EQ(tokens_logged("1.5").size(), 3u);
    {  // save_strategy = "epoch": a checkpoint where the first epoch ends (step 2) and at the run's end
        const std::string out = dir + "/saved_each_epoch";
        auto r = grove::test::run_grove("sft " + dir + "/sft.toml --set 'output.dir=\"" + out +
                                        "\"' --set train.num_train_epochs=1.5 --set 'output.save_strategy=\"epoch\"' 2>&1");
        EXPECT_EQ(r.exit_code, 0) << r.out;
        EXPECT_FALSE(fs::exists(out + "/checkpoint-1"));
        EXPECT_TRUE(fs::exists(out + "/checkpoint-2"));
        EXPECT_TRUE(fs::exists(out + "/checkpoint-3"));
    }

    // a resume inside the second epoch (step 3: 8 of its 10 examples) continues it exactly: the same
    // weights as 4 steps straight, with accumulation and the epoch's shorter last step
    auto run = [&](const std::string& out, const std::string& extra) {
        auto r = grove::test::run_grove("sft " + dir + "/sft.toml --set 'output.dir=\"" + dir + "/" + out +
                                        "\"' --set train.lr_scheduler_type=\"constant\" --set train.learning_rate=1e-3 " +
                                        extra + " 2>&1");
        EXPECT_EQ(r.exit_code, 0) << r.out;
    };
    run("straight", "--set train.max_steps=4");
    run("resumed", "--set train.max_steps=3");
    run("resumed", "--set train.max_steps=4 --resume");
    grove::SafetensorsFile straight(dir + "/straight/model.safetensors"), resumed(dir + "/resumed/model.safetensors");
    for (const auto& t : straight.tensors())
        EXPECT_TRUE(at::equal(grove::tensor_from_entry(t, straight.path()),
                              grove::tensor_from_entry(*resumed.find(t.name), resumed.path())))
            << t.name;
}

// train.eval_steps and eval_on_start: TRL's evaluation of data.eval_source (SftLoss.EvaluationMatchesTrlEvaluate
// checks the figures) in the lines of step 0 and of every second step
TEST(Sft, EvaluatesTheHeldOutExamplesEveryNSteps) {
    const std::string dir = pairs_run("sft_eval",
                                      "learning_rate = 3e-3\nmax_steps = 4\neval_steps = 2\neval_on_start = true\n"
                                      "per_device_eval_batch_size = 3\n[output]\ndir = \"out\"\n");
    auto r = grove::test::run_grove("sft " + dir + "/sft.toml 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::vector<nlohmann::json> lines;
    std::ifstream in(dir + "/out/metrics.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(lines.size(), 5u);
    EXPECT_EQ(lines[0]["step"], 0);
    EXPECT_FALSE(lines[0].contains("loss")) << "step 0 is the evaluation alone";
    for (size_t i : {0u, 2u, 4u}) EXPECT_TRUE(lines[i].contains("eval_loss")) << "step " << i;
    for (size_t i : {1u, 3u}) EXPECT_FALSE(lines[i].contains("eval_loss")) << "step " << i;
    EXPECT_LT(lines[4]["eval_loss"].get<double>(), lines[0]["eval_loss"].get<double>()) << "it learnt the examples";
    // step 0 is the untrained model, in batches of 3, 3 and 2
    auto model = grove::Model::load(std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa", "cpu", "float32");
    auto tokenizer = grove::Tokenizer::load(std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa");
    const auto held_out = grove::load_sft_examples(dir + "/pairs.jsonl", {}, *tokenizer, grove::ChatTemplate::plain,
                                                   tokenizer->config().eos_id, nullptr);
    const double nll = grove::sft_evaluate(*model, held_out, 3, {}).at("eval_loss");
    EXPECT_NEAR(lines[0]["eval_loss"].get<double>(), nll, 1e-6);

    // one step of a variant of the run (its own folder, `settings` added), its metrics.jsonl lines
    auto variant = [&](const std::string& folder, const std::string& settings) {
        auto r = grove::test::run_grove("sft " + dir + "/sft.toml --set train.max_steps=1 --set 'output.dir=\"" + dir + "/" +
                                        folder + "\"' " + settings + " 2>&1");
        EXPECT_EQ(r.exit_code, 0) << r.out;
        std::vector<nlohmann::json> logged;
        std::ifstream metrics(dir + "/" + folder + "/metrics.jsonl");
        for (std::string line; std::getline(metrics, line);) logged.push_back(nlohmann::json::parse(line));
        return logged;
    };

    // sft.loss_type = "dft" reaches training and evaluation: step 0 evaluates the DFT loss
    const auto dft = variant("dft", "--set 'sft.loss_type=\"dft\"'");
    ASSERT_FALSE(dft.empty());
    const double dft_loss = dft[0]["eval_loss"].get<double>();
    EXPECT_NEAR(dft_loss, grove::sft_evaluate(*model, held_out, 3, {true, 0.0}).at("eval_loss"), 1e-6);
    EXPECT_LT(dft_loss, 0.5 * nll) << "each token's loss weighted by its probability, far below 1 for a random model";

    // sft.neftune_noise_alpha: noise in the training step's embeddings (its loss moves), none in
    // evaluation (SftLoss.MatchesTrlSftComputeLoss compares the noise itself with TRL's)
    const auto noisy = variant("neftune", "--set sft.neftune_noise_alpha=50.0");
    ASSERT_EQ(noisy.size(), 2u);
    EXPECT_DOUBLE_EQ(noisy[0]["eval_loss"].get<double>(), lines[0]["eval_loss"].get<double>());
    EXPECT_GT(std::abs(noisy[1]["loss"].get<double>() - lines[1]["loss"].get<double>()), 1e-4);

    // sft.eval_packing: training packs (bfd), evaluation packs too unless eval_packing = false, which
    // evaluates the examples unpacked in batches still padding-free (each first token untrained)
    auto packed_run = [&](const std::string& folder, const std::string& extra) {
        const auto logged = variant(folder, "--set sft.packing=true --set sft.max_length=64 " + extra);
        return logged.empty() ? -1.0 : logged[0]["eval_loss"].get<double>();
    };
    grove::SftDataOptions packed_options;
    packed_options.max_length = 64;
    packed_options.packing = grove::SftDataOptions::Packing::bfd;
    grove::SftDataOptions unpacked_options;
    unpacked_options.max_length = 64;
    unpacked_options.padding_free = true;
    auto examples_with = [&](const grove::SftDataOptions& o) {
        return grove::load_sft_examples(dir + "/pairs.jsonl", o, *tokenizer, grove::ChatTemplate::plain,
                                        tokenizer->config().eos_id, nullptr);
    };
    const auto packed_held_out = examples_with(packed_options), unpacked_held_out = examples_with(unpacked_options);
    ASSERT_LT(packed_held_out.size(), unpacked_held_out.size());
    EXPECT_NEAR(packed_run("packed_eval", ""), grove::sft_evaluate(*model, packed_held_out, 3, {}).at("eval_loss"), 1e-6);
    EXPECT_NEAR(packed_run("unpacked_eval", "--set sft.eval_packing=false"),
                grove::sft_evaluate(*model, unpacked_held_out, 3, {}).at("eval_loss"), 1e-6);
}

// train.metric_for_best_model = "loss" with greater_is_better = true: the loss falls, so the first
// evaluation stays the best. save_total_limit = 2 then keeps it beside the newest checkpoint (as
// transformers rotates them; BestCheckpoint.* compares the rotation itself), trainer_state.json names
// it as transformers does, a resume goes on from the best it saved, and load_best_model_at_end
// writes its model into output.dir at the end. save_strategy = "best" saves only new bests.
TEST(Sft, TheBestCheckpointIsKeptResumedAndItsModelWrittenAtTheEnd) {
    const std::string dir = pairs_run("sft_best",
                                      "learning_rate = 3e-3\nmax_steps = 4\nlr_scheduler_type = \"constant\"\neval_steps = 1\n"
                                      "metric_for_best_model = \"loss\"\ngreater_is_better = true\n"
                                      "load_best_model_at_end = true\n[output]\nsave_steps = 1\nsave_total_limit = 2\n");
    auto run = [&](const std::string& out, const std::string& extra) {
        auto r = grove::test::run_grove("sft " + dir + "/sft.toml --set 'output.dir=\"" + dir + "/" + out + "\"' " + extra +
                                        " 2>&1");
        EXPECT_EQ(r.exit_code, 0) << r.out;
        return r.out;
    };
    const std::string out = dir + "/straight";
    const std::string log = run("straight", "");
    std::vector<double> eval_losses;
    {
        std::ifstream in(out + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);) eval_losses.push_back(nlohmann::json::parse(line)["eval_loss"]);
    }
    ASSERT_EQ(eval_losses.size(), 4u);
    for (size_t i = 1; i < 4; ++i) ASSERT_LT(eval_losses[i], eval_losses[i - 1]) << "the loss falls at every step";

    EXPECT_EQ(checkpoint_steps_in(out), (std::set<int64_t>{1, 4})) << "the best (1) and the newest";
    std::ifstream state_file(out + "/checkpoint-4/trainer_state.json");
    const auto state = nlohmann::json::parse(state_file);
    EXPECT_EQ(state["best_global_step"], 1);
    EXPECT_EQ(state["best_metric"].get<double>(), eval_losses[0]);
    EXPECT_EQ(state["best_model_checkpoint"], out + "/checkpoint-1");
    EXPECT_TRUE(same_weights(out, out + "/checkpoint-1")) << "output.dir has the best checkpoint's model";
    EXPECT_FALSE(same_weights(out, out + "/checkpoint-4"));
    EXPECT_CONTAINS(log, "train.load_best_model_at_end: the model written to " + out + " is checkpoint-1's, whose eval_loss");

    // stopped after step 2 and resumed: the best comes back with the checkpoint
    run("resumed", "--set train.max_steps=2");
    run("resumed", "--resume");
    EXPECT_EQ(checkpoint_steps_in(dir + "/resumed"), (std::set<int64_t>{1, 4}));
    EXPECT_TRUE(same_weights(dir + "/resumed", out));
    EXPECT_TRUE(same_weights(dir + "/resumed/checkpoint-4", out + "/checkpoint-4"));

    // the best evaluation (step 1) without a checkpoint (every 2 steps, as transformers allows): no
    // checkpoint is at a best-so-far evaluation, so the model stays the last step's, and the line says so
    const std::string unsaved = run("best_unsaved", "--set output.save_steps=2");
    EXPECT_EQ(checkpoint_steps_in(dir + "/best_unsaved"), (std::set<int64_t>{2, 4}));
    EXPECT_CONTAINS(unsaved,
                    "no checkpoint was written at a best-so-far evaluation of eval_loss, so the model is the "
                    "last step's");
    EXPECT_TRUE(same_weights(dir + "/best_unsaved", dir + "/best_unsaved/checkpoint-4"));

    // save_strategy = "best": a checkpoint after each new best, and the run's last
    run("only_best", "--set 'output.save_strategy=\"best\"' --set output.save_total_limit=100");
    EXPECT_EQ(checkpoint_steps_in(dir + "/only_best"), (std::set<int64_t>{1, 4}));
    run("every_best",
        "--set 'output.save_strategy=\"best\"' --set output.save_total_limit=100 --set train.greater_is_better=false");
    EXPECT_EQ(checkpoint_steps_in(dir + "/every_best"), (std::set<int64_t>{1, 2, 3, 4})) << "each evaluation improves";
    EXPECT_TRUE(same_weights(dir + "/every_best", dir + "/every_best/checkpoint-4"));

    // early_stopping_patience = 2: steps 2 and 3 do not improve on step 1, so the run ends after step 3,
    // with a checkpoint there beside the best
    const std::string stopped = run("stopped_early", "--set train.early_stopping_patience=2");
    EXPECT_EQ(checkpoint_steps_in(dir + "/stopped_early"), (std::set<int64_t>{1, 3}));
    EXPECT_CONTAINS(stopped,
                    "grove: early stopping: 2 evaluations in a row did not improve eval_loss by more than 0 on "
                    "the best");
    EXPECT_CONTAINS(stopped, "the run ends after step 3 of 4");
    EXPECT_TRUE(same_weights(dir + "/stopped_early", out + "/checkpoint-1"));
    // a threshold larger than any step's change: no evaluation improves, as EarlyStoppingCallback counts
    run("threshold",
        "--set train.early_stopping_patience=2 --set train.early_stopping_threshold=100.0 --set "
        "train.greater_is_better=false");
    EXPECT_EQ(checkpoint_steps_in(dir + "/threshold"), (std::set<int64_t>{2, 3})) << "3 is the best, 2 the one before";

    // a metric grove sft's evaluation does not log is refused before the first step
    auto refused = grove::test::run_grove("sft " + dir + "/sft.toml --set 'output.dir=\"" + dir +
                                          "/refused\"' --set 'train.metric_for_best_model=\"reward\"' 2>&1");
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_CONTAINS(refused.out,
                    "train.metric_for_best_model = \"reward\": the run's evaluation logs no eval_reward; it "
                    "logs entropy, loss, mean_token_accuracy, num_tokens: name one of those");
    EXPECT_FALSE(fs::exists(dir + "/refused/checkpoint-1"));

    // a copy that fails (a folder where the last model file's copy goes) leaves output.dir without a
    // part of the best model: every file is copied before any takes its place
    fs::create_directories(dir + "/blocked/tokenizer_config.json.tmp/in_the_way");
    auto blocked = grove::test::run_grove("sft " + dir + "/sft.toml --set 'output.dir=\"" + dir + "/blocked\"' 2>&1");
    EXPECT_NE(blocked.exit_code, 0);
    EXPECT_CONTAINS(blocked.out, "train.load_best_model_at_end: could not copy the model of " + dir +
                                     "/blocked/checkpoint-1 into " + dir + "/blocked");
    EXPECT_CONTAINS(blocked.out, "the run's checkpoints are whole");
    for (const char* file : {"config.json", "model.safetensors", "tokenizer.json", "model.safetensors.tmp", "config.json.tmp"})
        EXPECT_FALSE(fs::exists(dir + "/blocked/" + file)) << file;
    EXPECT_TRUE(same_weights(dir + "/blocked/checkpoint-4", out + "/checkpoint-4"));
}

// output.save_only_model (TrainingArguments' save_only_model): checkpoints during the run hold the
// model alone, at a fraction of the size; the run's last one stays whole, so the run can still be
// resumed or extended. --resume refuses a model-only checkpoint with what to do instead, and
// load_best_model_at_end copies the model of a model-only best checkpoint.
TEST(Sft, SaveOnlyModelLeavesOutTheResumeStateButNotAtTheEnd) {
    const std::string dir = pairs_run("sft_model_only",
                                      "learning_rate = 3e-3\nmax_steps = 4\neval_steps = 1\nmetric_for_best_model = \"loss\"\n"
                                      "greater_is_better = true\nload_best_model_at_end = true\n[output]\nsave_steps = 1\n");
    auto run = [&](const std::string& out, const std::string& extra) {
        return grove::test::run_grove("sft " + dir + "/sft.toml --set 'output.dir=\"" + dir + "/" + out + "\"' " + extra +
                                      " 2>&1");
    };
    ASSERT_EQ(run("whole", "").exit_code, 0);
    const auto r = run("model_only", "--set output.save_only_model=true");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const std::string out = dir + "/model_only";
    EXPECT_EQ(checkpoint_steps_in(out), (std::set<int64_t>{1, 2, 3, 4}));
    auto bytes = [](const std::string& folder) {
        uintmax_t total = 0;
        for (const auto& entry : fs::recursive_directory_iterator(folder))
            if (entry.is_regular_file()) total += entry.file_size();
        return total;
    };
    for (int step : {1, 2, 3}) {
        const std::string checkpoint = out + "/checkpoint-" + std::to_string(step);
        EXPECT_FALSE(fs::exists(checkpoint + "/optimizer.safetensors")) << checkpoint;
        EXPECT_FALSE(fs::exists(checkpoint + "/trainable.safetensors")) << checkpoint;
        EXPECT_LT(bytes(checkpoint) * 3, bytes(out + "/checkpoint-4")) << "the model alone";
        EXPECT_TRUE(same_weights(checkpoint, dir + "/whole/checkpoint-" + std::to_string(step))) << "the same training";
    }
    EXPECT_TRUE(fs::exists(out + "/checkpoint-4/optimizer.safetensors")) << "the last checkpoint stays whole";
    EXPECT_TRUE(same_weights(out, out + "/checkpoint-1")) << "the best model, copied from a model-only checkpoint";

    const auto refused = run("model_only", "--set output.save_only_model=true --resume " + out + "/checkpoint-2");
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_CONTAINS(refused.out, out +
                                     "/checkpoint-2 holds only the model (output.save_only_model = true), without the "
                                     "optimizer's state a resume needs");
    EXPECT_CONTAINS(refused.out, "resume from the run's last whole checkpoint, --resume " + out +
                                     "/checkpoint-4, or start a new run from its model (model.path = \"" + out +
                                     "/checkpoint-2\")");
    // another run resuming that checkpoint is told of the whole one in the folder it named
    const auto elsewhere = run("elsewhere", "--resume " + out + "/checkpoint-2/");
    EXPECT_NE(elsewhere.exit_code, 0);
    EXPECT_CONTAINS(elsewhere.out, "resume from the run's last whole checkpoint, --resume " + out + "/checkpoint-4");
    const auto relative =
        grove::test::run_command("cd " + out + " && " + GROVE_EXECUTABLE + " sft " + dir + "/sft.toml --set 'output.dir=\"" +
                                 dir + "/elsewhere\"' --resume checkpoint-2 2>&1");
    EXPECT_CONTAINS(relative.out, "resume from the run's last whole checkpoint, --resume ./checkpoint-4");

    // killed while writing step 4's (whole) checkpoint, with save_total_limit = 1: the newest whole
    // checkpoint (2) outlived the model-only 3, and --resume goes on from it, naming the one it passes over
    const std::string resumed = pairs_run("sft_model_only_resume",
                                          "learning_rate = 3e-3\nmax_steps = 4\n[output]\n"
                                          "dir = \"out\"\nsave_steps = 1\nsave_only_model = true\n"
                                          "save_total_limit = 1\n");
    const std::string sft = std::string(GROVE_EXECUTABLE) + " sft " + resumed + "/sft.toml ";
    EXPECT_EQ(grove::test::run_command(sft + "--set train.max_steps=2 2>&1").exit_code, 0);
    const auto killed = grove::test::run_command("GROVE_TEST_KILL_AT=save:4 " + sft + "--resume 2>&1");
    EXPECT_NE(killed.exit_code, 0);
    EXPECT_EQ(checkpoint_steps_in(resumed + "/out"), (std::set<int64_t>{2, 3})) << killed.out;
    const auto again = grove::test::run_command(sft + "--resume 2>&1");
    EXPECT_EQ(again.exit_code, 0) << again.out;
    EXPECT_CONTAINS(again.out,
                    "grove: resuming from checkpoint-2, the newest checkpoint that holds what a resume needs; "
                    "checkpoint-3 holds only the model (output.save_only_model)");
    EXPECT_EQ(checkpoint_steps_in(resumed + "/out"), (std::set<int64_t>{4}));
    // every checkpoint model-only (the whole one lost): --resume starts again from step 0, and says why
    fs::remove_all(resumed + "/out/checkpoint-4");
    EXPECT_EQ(
        grove::test::run_command(sft + "--set train.max_steps=3 --set output.save_total_limit=10 --overwrite 2>&1").exit_code,
        0);
    fs::remove_all(resumed + "/out/checkpoint-3");
    const auto other = grove::test::run_command(sft + "--set 'output.dir=\"" + resumed + "/other\"' --resume " + resumed +
                                                "/out/checkpoint-2 2>&1");
    EXPECT_NE(other.exit_code, 0);
    EXPECT_CONTAINS(other.out, "without the optimizer's state a resume needs; start without --resume");
    const auto from_zero = grove::test::run_command(sft + "--resume 2>&1");
    EXPECT_EQ(from_zero.exit_code, 0) << from_zero.out;
    EXPECT_CONTAINS(from_zero.out,
                    "has no checkpoint to resume from yet (its checkpoints hold only the model: "
                    "output.save_only_model); starting from step 0");
}

// [adapter] lora (TRL's peft_config): grove sft trains the adapter alone and saves it in PEFT's
// layout; PEFT loads it onto transformers' model with the logits Grove computes from the folder.
TEST(Sft, LoraTrainsTheAdapterThatPeftLoads) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/sft_lora";
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_pairs(dir + "/pairs.jsonl");
    const std::string base = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa";
    std::ofstream(dir + "/sft.toml")
        << "[model]\npath = \"" << base
        << "\"\nchat_template = \"none\"\n[data]\nsource = \"pairs.jsonl\"\n"
           "[[rewards]]\nplugin = \"correctness\"\n[generation]\nnum_generations = 4\n"
           "[adapter]\nplugin = \"lora\"\nconfig = { r = 4, alpha = 8, target_modules = "
           "[\"q_proj\", \"v_proj\", \"down_proj\"] }\n"
           "[train]\nper_device_train_batch_size = 4\nlearning_rate = 1e-2\nmax_steps = 6\n"
           "lr_scheduler_type = \"constant\"\n[output]\ndir = \"out\"\n[logging]\nlogging_steps = 1\n";
    auto r = grove::test::run_grove("sft " + dir + "/sft.toml 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const std::string out = dir + "/out";
    EXPECT_TRUE(fs::exists(out + "/adapter_model.safetensors"));
    EXPECT_FALSE(fs::exists(out + "/model.safetensors")) << "only the adapter is saved";
    std::vector<double> losses;
    std::ifstream metrics(out + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    ASSERT_EQ(losses.size(), 6u);
    EXPECT_LT(losses.back(), losses.front());

    auto model = grove::load_model_or_adapter_checkpoint(out, "cpu", "float32");
    at::Tensor ids = at::arange(5, 17, at::kLong).unsqueeze(0), logits;
    {
        at::NoGradGuard no_grad;
        logits = model->forward(ids, at::ones_like(ids), at::arange(0, 12, at::kLong).unsqueeze(0));
    }
    const std::string file = dir + "/grove_logits.safetensors";
    grove::save_tensors(file, {{"input_ids", ids}, {"logits", logits.contiguous()}});
    const std::string command = std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR + "/tests/core/train/check_peft.py " +
                                out + " " + base + " " + file;
    EXPECT_EQ(std::system(command.c_str()), 0) << command;

    // with LoRA dropout, resumed after step 2, the adapter ends as 4 steps straight: every step
    // reseeds the masks' generator, which a checkpoint does not hold
    std::string with_dropout;
    {
        std::ifstream in(dir + "/sft.toml");
        with_dropout.assign(std::istreambuf_iterator<char>(in), {});
        with_dropout.replace(with_dropout.find("r = 4,"), 6, "r = 4, dropout = 0.3,");
    }
    std::ofstream(dir + "/dropout.toml") << with_dropout;
    auto dropout_run = [&](const std::string& folder, const std::string& extra) {
        return grove::test::run_grove("sft " + dir + "/dropout.toml --set 'output.dir=\"" + dir + "/" + folder +
                                      "\"' --set output.save_steps=2 " + extra + " 2>&1");
    };
    ASSERT_EQ(dropout_run("straight", "--set train.max_steps=4").exit_code, 0);
    ASSERT_EQ(dropout_run("resumed", "--set train.max_steps=2").exit_code, 0);
    auto resumed = dropout_run("resumed", "--set train.max_steps=4 --resume");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
    grove::SafetensorsFile straight(dir + "/straight/adapter_model.safetensors"),
        again(dir + "/resumed/adapter_model.safetensors");
    ASSERT_EQ(straight.tensors().size(), again.tensors().size());
    for (size_t i = 0; i < straight.tensors().size(); ++i)
        EXPECT_TRUE(at::equal(grove::tensor_from_entry(straight.tensors()[i], straight.path()),
                              grove::tensor_from_entry(again.tensors()[i], again.path())))
            << straight.tensors()[i].name;
}

// A mixture of experts: grove sft adds TRL 1.16's SFT load-balancing term (loss + coef x aux) and
// logs aux_loss; the same step with the coefficient at 0 logs the cross-entropy alone, smaller by
// exactly coef x aux. (The aux loss itself is compared with TRL's in PolicyLoss.MatchesTrlComputeLoss.)
TEST(Sft, AMixtureOfExpertsTakesTrlsLoadBalancingLoss) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/sft_moe";
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir + "/rows.jsonl") << R"({"prompt": "What is 2 + 3?", "completion": "The answer is 5."})" << "\n"
                                       << R"({"prompt": "What is 7 + 1?", "completion": "It is 8."})" << "\n";
    std::ofstream(dir + "/sft.toml") << "[model]\npath = \"" << GROVE_TEST_BINARY_DIR
                                     << "/models/tiny/qwen3_moe_experts\"\nchat_template = \"plain\"\n"
                                        "[data]\nsource = \"rows.jsonl\"\n[[rewards]]\nplugin = \"format\"\n"
                                        "[generation]\nnum_generations = 2\n"
                                        "[train]\nper_device_train_batch_size = 2\nmax_steps = 1\n";
    auto first_line = [&](const std::string& coef) {
        const std::string out = dir + "/run_" + coef;
        auto r = grove::test::run_grove("sft " + dir + "/sft.toml --set output.dir=\"" + out +
                                        "\" --set loss.router_aux_loss_coef=" + coef);
        EXPECT_EQ(r.exit_code, 0) << r.out;
        std::ifstream metrics(out + "/metrics.jsonl");
        std::string line;
        std::getline(metrics, line);
        return nlohmann::json::parse(line);
    };
    const auto with = first_line("0.5"), without = first_line("0");
    ASSERT_TRUE(with.contains("aux_loss")) << with.dump();
    EXPECT_FALSE(without.contains("aux_loss")) << without.dump();
    const double aux = with["aux_loss"].get<double>();
    EXPECT_GT(aux, 1.9);  // 2 experts per token: 2 when the load is even, more when it concentrates
    EXPECT_LT(aux, 8.0);
    EXPECT_NEAR(with["loss"].get<double>() - without["loss"].get<double>(), 0.5 * aux, 1e-5);
}
