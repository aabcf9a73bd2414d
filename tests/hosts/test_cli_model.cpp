// `grove generate` and `grove logprobs` on a tiny checkpoint, against transformers' outputs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "grove/model_config.hpp"
#include "grove/safetensors.hpp"
#include "model/tensor_io.hpp"
#include "plugin_test_support.hpp"

namespace {

const std::string kModel = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa";

grove::test::CommandResult run_grove(const std::string& args) { return grove::test::run_grove(args); }

nlohmann::json reference_json() {
    std::ifstream in(kModel + "/reference.json");
    return nlohmann::json::parse(in);
}

}  // namespace

TEST(CliModel, GenerateGreedyMatchesTransformersPlainAndChat) {
    auto ref = reference_json();
    auto plain =
        run_grove("generate --model " + kModel + " --prompt 'What is 2 + 2?' --greedy --max-new-tokens 6 --json --device cpu");
    ASSERT_EQ(plain.exit_code, 0) << plain.out;
    auto row = nlohmann::json::parse(plain.out);
    EXPECT_EQ(row["prompt_ids"], ref["plain"]["prompt_ids"]);
    EXPECT_EQ(row["completion_ids"], ref["plain"]["completion_ids"]);
    EXPECT_EQ(row["logprobs"].size(), 6u);
    auto chat =
        run_grove("generate --model " + kModel + " --prompt 'What is 2 + 2?' --chat --greedy --max-new-tokens 6 --json");
    ASSERT_EQ(chat.exit_code, 0) << chat.out;
    row = nlohmann::json::parse(chat.out);
    EXPECT_EQ(row["prompt_ids"], ref["chat"]["prompt_ids"]);  // apply_chat_template + tokenizer
    EXPECT_EQ(row["completion_ids"], ref["chat"]["completion_ids"]);
}

// Qwen3's template with enable_thinking=False (TRL's chat_template_kwargs): the prompt ends in an
// empty <think> block, token for token as transformers renders and tokenizes it. A template without
// the switch refuses it rather than ignoring it.
TEST(CliModel, GenerateWithoutThinkingMatchesTransformers) {
    auto ref = reference_json()["chat_qwen3_no_thinking"];
    auto r =
        run_grove("generate --model " + kModel +
                  " --prompt 'What is 2 + 2?' --chat --chat-template qwen3 --no-thinking --greedy --max-new-tokens 6 --json");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto row = nlohmann::json::parse(r.out);
    EXPECT_EQ(row["prompt_ids"], ref["prompt_ids"]);
    EXPECT_EQ(row["completion_ids"], ref["completion_ids"]);
    auto thinking = run_grove("generate --model " + kModel +
                              " --prompt 'What is 2 + 2?' --chat --chat-template qwen3 --greedy --max-new-tokens 6 --json");
    ASSERT_EQ(thinking.exit_code, 0) << thinking.out;
    EXPECT_NE(nlohmann::json::parse(thinking.out)["prompt_ids"], ref["prompt_ids"]) << "the switch changes the prompt";
    auto refused = run_grove("generate --model " + kModel + " --prompt 'What is 2 + 2?' --chat --no-thinking --json");
    EXPECT_EQ(refused.exit_code, 2) << refused.out;
    EXPECT_NE(refused.out.find("chat template (recognised as chatml) has no thinking switch"), std::string::npos)
        << refused.out;
}

namespace {
// grove generate's prompt and greedy ids for "What is 2 + 2?", plain and with the folder's chat
// template, equal what transformers generated (make_tiny_models.py's chat_reference).
void expect_generates_as_transformers(const std::string& name) {
    const std::string model = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/" + name;
    std::ifstream in(model + "/reference.json");
    const auto ref = nlohmann::json::parse(in);
    for (const char* mode : {"plain", "chat"}) {
        auto r = run_grove("generate --model " + model + " --prompt 'What is 2 + 2?' --greedy --max-new-tokens 6 --json" +
                           (std::string(mode) == "chat" ? " --chat" : ""));
        ASSERT_EQ(r.exit_code, 0) << r.out;
        auto row = nlohmann::json::parse(r.out);
        EXPECT_EQ(row["prompt_ids"], ref[mode]["prompt_ids"]) << name << " " << mode;
        // transformers generated past EOS (eos_token_id=None); grove generate stops after it
        auto expected = ref[mode]["completion_ids"].get<std::vector<int64_t>>();
        const auto eos = grove::load_model_config(model).eos_token_ids;
        const auto stop = std::find_first_of(expected.begin(), expected.end(), eos.begin(), eos.end());
        if (stop != expected.end()) expected.erase(stop + 1, expected.end());
        EXPECT_EQ(row["completion_ids"].get<std::vector<int64_t>>(), expected) << name << " " << mode;
    }
}
}  // namespace

// A Mistral checkpoint's folder as transformers saves it: tokenizer.json converted from the
// sentencepiece model (legacy normalizers, byte fallback) beside tokenizer.model, and the [INST]
// template in chat_template.jinja, which auto recognises (tokenizer_config.json has none).
TEST(CliModel, AMistralFolderGeneratesAsTransformers) { expect_generates_as_transformers("mistral_mha"); }

// A Phi-3.5 checkpoint's folder: a Metaspace tokenizer.json (legacy = false), chat markers that
// strip the newline after them, EOS <|endoftext|>, Phi-3.5's template in chat_template.jinja, and
// the model's fused projections and longrope embedding.
TEST(CliModel, APhi3FolderGeneratesAsTransformers) { expect_generates_as_transformers("phi3_longrope"); }

// A Gemma 3 folder: Gemma's tokenizer.json (a Replace normalizer and a String Split, no prefix) and
// Gemma 3's template, recognised and rendered with its <bos>; the model's four norms per layer, GeGLU,
// scaled embeddings, sliding and global layers with their own rotary bases.
TEST(CliModel, AGemma3FolderGeneratesAsTransformers) { expect_generates_as_transformers("gemma3_window"); }

// A SmolLM3 folder: NoPE layers, and SmolLM3's template (a dated metadata system turn with its default
// instructions, think or no-think) recognised from the checkpoint and rendered as transformers does.
TEST(CliModel, ASmolLM3FolderGeneratesAsTransformers) {
    const std::string model = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/smollm3_nope";
    std::ifstream in(model + "/reference.json");
    const auto reference = nlohmann::json::parse(in);
    const std::time_t now = std::time(nullptr);
    std::ostringstream today;
    today << std::put_time(std::localtime(&now), "%d %B %Y");
    if (today.str() != reference["date"].get<std::string>())
        GTEST_SKIP() << "the reference prompts carry the date they were made (" << reference["date"]
                     << "), not today's: the run crossed midnight; run the tests again";
    expect_generates_as_transformers("smollm3_nope");
    const auto ref = reference["chat_no_thinking"];
    auto r = run_grove("generate --model " + model +
                       " --prompt 'What is 2 + 2?' --chat --no-thinking --greedy --max-new-tokens 6 --json");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto row = nlohmann::json::parse(r.out);
    EXPECT_EQ(row["prompt_ids"], ref["prompt_ids"]);
    EXPECT_EQ(row["completion_ids"], ref["completion_ids"]);
}

// A tokenizer whose ids go past the model's vocabulary (not the checkpoint's own) is an input error
// that says so, not an index error inside the embedding.
TEST(CliModel, APromptIdOutsideTheVocabularyIsAnInputError) {
    const std::string model = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/mistral_mha";
    const std::string copy = std::string(GROVE_TEST_BINARY_DIR) + "/models/foreign_tokenizer";
    std::filesystem::remove_all(copy);
    std::filesystem::copy(model, copy);
    nlohmann::json tokenizer;
    std::ifstream(copy + "/tokenizer.json") >> tokenizer;
    tokenizer["added_tokens"].push_back({{"id", 400},
                                         {"content", "<|foreign|>"},
                                         {"single_word", false},
                                         {"lstrip", false},
                                         {"rstrip", false},
                                         {"normalized", false},
                                         {"special", true}});
    std::ofstream(copy + "/tokenizer.json") << tokenizer.dump();
    auto r = run_grove("generate --model " + copy + " --prompt 'Hello <|foreign|>' --greedy --max-new-tokens 2 --json");
    EXPECT_EQ(r.exit_code, 5) << r.out;
    EXPECT_NE(r.out.find("a prompt holds token id 400, outside the model's vocabulary [0, 320)"), std::string::npos) << r.out;
}

TEST(CliModel, GenerateSeveralSamplesIsSeeded) {
    std::string args =
        "generate --model " + kModel + " --prompt 'Hello' --n 3 --max-new-tokens 5 --temperature 1.5 --json --seed ";
    auto a = run_grove(args + "11"), b = run_grove(args + "11");
    ASSERT_EQ(a.exit_code, 0) << a.out;
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(std::count(a.out.begin(), a.out.end(), '\n'), 3);
}

TEST(CliModel, LogprobsMatchTransformers) {
    grove::SafetensorsFile file(kModel + "/reference.safetensors");
    auto tensor = [&](const char* name) { return grove::tensor_from_entry(*file.find(name), file.path()); };
    at::Tensor ids = tensor("input_ids"), mask = tensor("attention_mask"), greedy = tensor("greedy"),
               expected = tensor("logprobs");
    std::string input = std::string(GROVE_TEST_BINARY_DIR) + "/models/logprobs_input.jsonl";
    {
        std::ofstream out(input);
        for (int64_t b = 0; b < ids.size(0); ++b) {
            std::vector<int64_t> prompt, completion;
            for (int64_t t = 0; t < ids.size(1); ++t)
                if (mask[b][t].item<int64_t>()) prompt.push_back(ids[b][t].item<int64_t>());
            for (int64_t t = 0; t < greedy.size(1); ++t) completion.push_back(greedy[b][t].item<int64_t>());
            out << nlohmann::json({{"prompt_ids", prompt}, {"completion_ids", completion}}).dump() << "\n";
        }
    }
    auto r = run_grove("logprobs --model " + kModel + " --input " + input + " --temperature 0.7");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::istringstream lines(r.out);
    std::string line;
    int64_t b = 0;
    for (; std::getline(lines, line); ++b) {
        auto row = nlohmann::json::parse(line);
        auto values = row["logprobs"].get<std::vector<float>>();
        ASSERT_EQ(int64_t(values.size()), greedy.size(1));
        for (size_t t = 0; t < values.size(); ++t)
            EXPECT_NEAR(values[t], expected[b][int64_t(t)].item<float>(), 1e-4) << "row " << b << " token " << t;
    }
    EXPECT_EQ(b, ids.size(0));
}

TEST(CliModel, BadInputNamesFileAndLine) {
    std::string input = std::string(GROVE_TEST_BINARY_DIR) + "/models/bad_input.jsonl";
    std::ofstream(input) << "{\"prompt_ids\": [5], \"completion_ids\": [6]}\n{\"text\": \"no prompt\"}\n";
    auto r = run_grove("logprobs --model " + kModel + " --input " + input);
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_NE(r.out.find("bad_input.jsonl:2: need prompt_ids + completion_ids, or prompt + completion"), std::string::npos)
        << r.out;
    std::ofstream(input) << "{\"prompt_ids\": [5], \"completion_ids\": [99999]}\n";
    r = run_grove("logprobs --model " + kModel + " --input " + input);
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_NE(r.out.find("token id 99999 is outside the vocabulary"), std::string::npos) << r.out;
    r = run_grove("generate --model /nonexistent --prompt x");
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_NE(r.out.find("/nonexistent: no such folder"), std::string::npos) << r.out;
    r = run_grove("generate --model " + kModel);
    EXPECT_EQ(r.exit_code, 2);
}

// `grove check` renders the training prompts as `grove train` will, with the checkpoint's chat
// template, and says how many; a conversation the template refuses fails the check, naming its row.
TEST(CliModel, CheckRendersTheTrainingPromptsAsTrainDoes) {
    const std::string folder = std::string(GROVE_TEST_BINARY_DIR) + "/models/check_prompts";
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/prompts.jsonl")
        << "{\"prompt\": \"1 + 2 =\"}\n{\"prompt\": [{\"role\": \"system\", "
           "\"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"2 + 2 =\"}]}\n";
    std::ofstream(folder + "/grove.toml") << "[model]\npath = \"" << kModel
                                          << "\"\n[data]\nsource = \"prompts.jsonl\"\n[[rewards]]\nplugin = \"format\"\n";
    auto r = run_grove("check " + folder + "/grove.toml");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_CONTAINS(r.out, ": 2 prompts render as grove train renders them (conversations: 1)");
    EXPECT_EQ(r.out.find("holds no config.json"), std::string::npos) << r.out;  // the model is there
    r = run_grove("check " + folder + "/grove.toml --set model.chat_template=mistral");
    EXPECT_EQ(r.exit_code, 5) << r.out;
    EXPECT_CONTAINS(r.out, "prompts.jsonl:2: mistral chat template: conversation roles must alternate");
}

// `grove check` on a mixture of experts names its routing and the load-balancing loss's weight (the
// checkpoint's, or router_aux_loss_coef), and refuses that key for a dense model as grove train does.
TEST(CliModel, CheckNamesTheExpertsAndRefusesALoadBalancingWeightWithoutThem) {
    const std::string folder = std::string(GROVE_TEST_BINARY_DIR) + "/models/check_experts";
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/prompts.jsonl") << "{\"prompt\": \"1 + 2 =\"}\n";
    std::ofstream(folder + "/grove.toml") << "[model]\npath = \"" << GROVE_TEST_BINARY_DIR
                                          << "/models/tiny/qwen3_moe_experts\"\n[data]\nsource = \"prompts.jsonl\"\n"
                                             "[[rewards]]\nplugin = \"format\"\n";
    auto r = run_grove("check " + folder + "/grove.toml");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_CONTAINS(r.out,
                    "# mixture of experts: Qwen3MoeForCausalLM, 2 of 8 experts per token; load-balancing loss "
                    "weight 0.001");
    r = run_grove("check " + folder + "/grove.toml --set loss.router_aux_loss_coef=0.25");
    EXPECT_CONTAINS(r.out, "load-balancing loss weight 0.25");
    r = run_grove("check " + folder + "/grove.toml --set loss.router_aux_loss_coef=0.25 --set model.path=\"" + kModel + "\"");
    EXPECT_EQ(r.exit_code, 3) << r.out;
    EXPECT_CONTAINS(r.out, "has no experts, so there is no load-balancing loss to weight");
}

// `grove generate --environment`: whole episodes, the environment's parts marked; the wrong kind of
// plugin is refused with exit code 4 (plugin failure) naming the option.
TEST(CliModel, GenerateRunsEpisodesWithAnEnvironment) {
    auto r = run_grove("generate --model " + kModel + " --prompt 'What is 2 + 2?' --n 4 --environment " +
                       GROVE_TEST_SCRIPTED_ENV_PLUGIN + " --environment-config 'stop = \"e\"' --max-turns 3 " +
                       "--max-new-tokens 30 --json --device cpu");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::istringstream lines(r.out);
    int64_t episodes = 0, observed = 0;
    for (std::string line; std::getline(lines, line); ++episodes) {
        auto row = nlohmann::json::parse(line);
        const auto& mask = row["env_mask"];
        ASSERT_EQ(mask.size(), row["completion_ids"].size());
        EXPECT_LE(int64_t(mask.size()), 30);
        int64_t environment_turns = 0;
        for (const auto& turn : row["turns"])
            if (turn["role"] == "environment") {
                EXPECT_EQ(turn["text"], " ok");
                ++environment_turns;
            }
        EXPECT_EQ(environment_turns, row["tool_calls"].get<int64_t>());
        observed += environment_turns > 0;
    }
    EXPECT_EQ(episodes, 4);
    EXPECT_GT(observed, 0);

    auto wrong = run_grove("generate --model " + kModel + " --prompt x --environment format --device cpu");
    EXPECT_EQ(wrong.exit_code, 4) << wrong.out;
    EXPECT_NE(wrong.out.find("--environment: plugin 'format'"), std::string::npos) << wrong.out;
}
