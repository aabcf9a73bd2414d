"""The catalogue of bad inputs (docs/bad-inputs.md): mistakes users make and files damaged on their
way, what Grove says about each, and a check that it still says so. Every case runs the real
`grove` in a folder of its own and asserts the exit code and a part of the message; the document
shows the whole message, so it is regenerated when a message changes.

    .venv/bin/python tests/bad_inputs/catalogue.py GROVE TINY_MODEL WORK_DIR --check docs/bad-inputs.md
    .venv/bin/python tests/bad_inputs/catalogue.py GROVE TINY_MODEL WORK_DIR --write docs/bad-inputs.md
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))
from make_seeds import write_tiny_llama_gguf  # noqa: E402

import gguf  # noqa: E402

GROVE, TINY_MODEL, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
MODE, DOC = sys.argv[4], sys.argv[5]
BUILD_PREFIX = os.path.dirname(os.path.dirname(GROVE))

CASES = []


def case(area, what, command, exit_code, says, setup=None):
    CASES.append(dict(area=area, what=what, command=command, exit_code=exit_code, says=says, setup=setup))


# ---- helpers that make the inputs ---------------------------------------------------------------
def write(path, text, mode="w"):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, mode) as f:
        f.write(text)


def manifest(extra="", model="model", data='source = "prompts.jsonl"', rewards='[[rewards]]\nplugin = "format"\n'):
    return f'[model]\npath = "{model}"\nchat_template = "none"\n[data]\n{data}\n{rewards}' \
           f'[generation]\nnum_generations = 2\nmax_completion_length = 4\n' \
           f'[train]\nmax_steps = 1\nper_device_train_batch_size = 2\n[output]\ndir = "out"\n{extra}'


def run_folder(extra="", prompts=None, **kw):
    """A folder with a copy of the tiny model, a prompts file and a manifest."""
    def setup(d):
        shutil.copytree(TINY_MODEL, os.path.join(d, "model"))
        rows = prompts if prompts is not None else "".join(json.dumps({"prompt": f"{i} + 2 ="}) + "\n" for i in range(4))
        write(os.path.join(d, "prompts.jsonl"), rows)
        write(os.path.join(d, "grove.toml"), manifest(extra, **kw))
    return setup


def with_model(change):
    """A copy of the tiny model, changed by change(folder)."""
    def setup(d):
        shutil.copytree(TINY_MODEL, os.path.join(d, "model"))
        change(os.path.join(d, "model"))
    return setup


def both(*setups):
    def setup(d):
        for s in setups:
            s(d)
    return setup


def safetensors_file(header, data=b""):
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


def gguf_file(**kw):
    return lambda d: write_tiny_llama_gguf(os.path.join(d, "model.gguf"), **kw)


def edit_json(path, change):
    with open(path) as f:
        j = json.load(f)
    change(j)
    write(path, json.dumps(j))


def trained(steps=2, extra=""):
    """A run folder trained for `steps` steps with a checkpoint after each."""
    def setup(d):
        run_folder()(d)
        subprocess.run(f"{GROVE} train grove.toml --set train.max_steps={steps} --set output.save_steps=1 {extra}",
                       shell=True, cwd=d, check=True, capture_output=True)
    return setup


def _rewrite_architecture(d):
    path = f"{d}/model.gguf"
    write_tiny_llama_gguf(path)
    with open(path, "rb") as f:
        data = f.read()
    write(path, data.replace(b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llama",
                             b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00gpt2x"), "wb")


def _flip_last_byte(path):
    with open(path, "r+b") as f:
        f.seek(-5, 2)
        b = f.read(1)
        f.seek(-5, 2)
        f.write(bytes([b[0] ^ 0xFF]))


T = gguf.GGUFValueType
TRAIN = "train grove.toml"

# ---- the manifest: grove check and grove train ----------------------------------------------------
case("manifest", "a string left open", "check grove.toml", 3, "grove.toml:2:14: error: invalid TOML",
     lambda d: write(f"{d}/grove.toml", '[model]\npath = "model\n'))
case("manifest", "a key with an accent, unquoted", "check grove.toml", 3, "a non-ASCII character outside a string",
     lambda d: write(f"{d}/grove.toml", manifest("[train]\nmax_stéps = 3\n")))
case("manifest", "a misspelt key", "check grove.toml", 3, "did you mean",
     lambda d: write(f"{d}/grove.toml", manifest().replace("max_steps = 1", "max_steps = 1\nlearnin_rate = 1e-6")))
case("manifest", "a number given as a string", "check grove.toml", 3, "learning_rate",
     lambda d: write(f"{d}/grove.toml", manifest().replace("max_steps = 1", 'max_steps = 1\nlearning_rate = "high"')))
case("manifest", "num_generations = 1 (no group to compare within)", "check grove.toml", 3, "num_generations",
     lambda d: write(f"{d}/grove.toml", manifest().replace("num_generations = 2", "num_generations = 1")))
case("manifest", "no model path", "check grove.toml", 3, "missing required key model.path",
     lambda d: write(f"{d}/grove.toml", '[data]\nsource = "p.jsonl"\n[[rewards]]\nplugin = "format"\n'))
case("manifest", "no training prompts at all", "check grove.toml", 3, "missing data.source",
     lambda d: write(f"{d}/grove.toml", '[model]\npath = "model"\n[[rewards]]\nplugin = "format"\n'))
case("manifest", "an environment writing the prompts, and no max_steps", "check grove.toml", 3, "set train.max_steps",
     lambda d: write(f"{d}/grove.toml", '[model]\npath = "model"\n[environment]\nplugin = "python_environment"\n'))
case("manifest", "a batch that cannot hold whole groups", "check grove.toml", 3, "cannot hold whole groups",
     lambda d: write(f"{d}/grove.toml", manifest().replace("num_generations = 2", "num_generations = 3")))
case("manifest", "a batch size of 10^18", "check grove.toml", 3, "per_device_train_batch_size",
     lambda d: write(f"{d}/grove.toml", manifest().replace("per_device_train_batch_size = 2",
                                                           "per_device_train_batch_size = 1000000000000000000")))
case("manifest", "generation_batch_size and steps_per_generation that disagree", "check grove.toml", 3, "disagree",
     lambda d: write(f"{d}/grove.toml", manifest().replace("max_steps = 1", "max_steps = 1\ngeneration_batch_size = 8\n"
                                                           "steps_per_generation = 3")))
case("manifest", "a scheduler name with a typo", "check grove.toml", 3, "cosine",
     lambda d: write(f"{d}/grove.toml", manifest().replace("max_steps = 1", 'max_steps = 1\nlr_scheduler_type = "cosin"')))
case("manifest", "cosine_with_min_lr without its floor", "check grove.toml --set train.lr_scheduler_type=\"cosine_with_min_lr\"",
     3, "set it (e.g. 0.1), or use \"cosine\"", run_folder())
case("manifest", "warmup_stable_decay without the length of its decay",
     "check grove.toml --set train.lr_scheduler_type=\"warmup_stable_decay\"", 3, "set it, e.g. num_decay_steps = 100",
     run_folder())
case("manifest", "min_lr_rate with a schedule that has no floor", "check grove.toml --set train.min_lr_rate=0.1", 3,
     "set that schedule, or remove min_lr_rate", run_folder())
case("manifest", "a report_to integration Grove does not write (TRL's wandb)", "check grove.toml", 3,
     'use one of "none", "tensorboard"', run_folder('[logging]\nreport_to = "wandb"\n'))
case("manifest", "an unknown --set key", "check grove.toml --set train.learnin_rate=1", 3, "learnin_rate",
     run_folder())
case("manifest", "sync_ref_model without a reference (beta = 0)", "check grove.toml", 3, "set loss.beta > 0",
     run_folder('[loss]\nsync_ref_model = true\n'))
case("manifest", "sync_ref_model with LoRA", "check grove.toml", 3, "use plugin = \"full\", or remove sync_ref_model",
     run_folder('[loss]\nsync_ref_model = true\nbeta = 0.1\n[adapter]\nplugin = "lora"\n'))
case("manifest", "a LoRA initialisation that rewrites the base weights (PEFT's init_lora_weights=\"pissa\")",
     "check grove.toml", 3, "is not available",
     run_folder('[adapter]\nplugin = "lora"\nconfig = { init_lora_weights = "pissa" }\n'))
case("manifest", "LoRA target_modules as one regular expression (PEFT's string form)", "check grove.toml", 3,
     "target_modules_regex",
     run_folder('[adapter]\nplugin = "lora"\nconfig = { target_modules = \'.*\\.q_proj\' }\n'))
case("manifest", "LoRA modules_to_save naming a module the model does not have", "train grove.toml", 3,
     "ends the name of no module",
     run_folder('[adapter]\nplugin = "lora"\nmodules_to_save = ["lm_heads"]\n'))
case("manifest", "LoRA trainable_token_indices with an id beyond the vocabulary", "train grove.toml", 3,
     "is no token of this model",
     run_folder('[adapter]\nplugin = "lora"\ntrainable_token_indices = [3, 100000]\n'))
case("manifest", "enable_thinking = false for a template without that switch",
     "check grove.toml --set model.enable_thinking=false", 3, "has no thinking switch", run_folder())
case("manifest", "train.eval_steps without held-out prompts", "check grove.toml --set train.eval_steps=10", 3,
     "set data.eval_source", run_folder())
case("manifest", "a save_steps that is neither whole nor a fraction below 1 (transformers' reading)",
     "check grove.toml --set output.save_steps=2.5", 3, "is neither a whole number of optimizer steps", run_folder())
case("manifest", "eval_steps with eval_strategy = \"epoch\" (it would do nothing)",
     "check grove.toml --set train.eval_strategy='\"epoch\"' --set train.eval_steps=4", 3,
     "remove eval_steps, or set eval_strategy", run_folder())
case("manifest", "save_strategy = \"best\" without metric_for_best_model (nothing to compare)",
     "check grove.toml --set output.save_strategy='\"best\"' --set train.eval_steps=1 "
     "--set data.eval_source='\"prompts.jsonl\"'", 3, "which is unset: set it", run_folder())
case("manifest", "load_best_model_at_end with save_steps not a multiple of eval_steps (transformers refuses it too)",
     "check grove.toml --set train.load_best_model_at_end=true --set train.eval_steps=3 --set output.save_steps=4 "
     "--set data.eval_source='\"prompts.jsonl\"'", 3, "is not a multiple of train.eval_steps", run_folder())
case("manifest", "early_stopping_patience without metric_for_best_model (EarlyStoppingCallback asserts it too)",
     "check grove.toml --set train.early_stopping_patience=3 --set train.eval_steps=1 "
     "--set data.eval_source='\"prompts.jsonl\"'", 3, "train.early_stopping_patience stops the run when", run_folder())
case("manifest", "load_best_model_at_end in grove train with its default metric, loss (GRPO's evaluation has no eval_loss)",
     "train grove.toml --set train.load_best_model_at_end=true --set train.eval_steps=1 --set output.save_steps=1 "
     "--set data.eval_source='\"prompts.jsonl\"'", 3, "the run's evaluation logs no eval_loss", run_folder())
case("manifest", "router_aux_loss_coef for a model without experts (no load-balancing loss to weight)",
     "check grove.toml --set loss.router_aux_loss_coef=0.01", 3, "has no experts, so there is no load-balancing loss to weight",
     run_folder())
case("plugins", "an unknown reward plugin", "check grove.toml", 4, "no plugin named 'formt'",
     lambda d: write(f"{d}/grove.toml", manifest(rewards='[[rewards]]\nplugin = "formt"\n')))
case("plugins", "an unknown adapter plugin", "check grove.toml", 4, "[adapter]: no plugin named 'lorra'",
     lambda d: write(f"{d}/grove.toml", manifest('[adapter]\nplugin = "lorra"\n')))
case("plugins", "an unknown reduction plugin", "check grove.toml", 4, "[reduction]: no plugin named 'dapo2'",
     lambda d: write(f"{d}/grove.toml", manifest('[reduction]\nplugin = "dapo2"\n')))
case("plugins", "a reward plugin's misspelt configuration key", "check grove.toml", 3, "patern",
     lambda d: write(f"{d}/grove.toml", manifest(rewards='[[rewards]]\nplugin = "format"\nconfig = { patern = "x" }\n')))
case("plugins", "a plugin path that does not exist", "check grove.toml", 4, "missing.so",
     lambda d: write(f"{d}/grove.toml", manifest(rewards='[[rewards]]\nplugin = "./missing.so"\n')))
case("plugins", "a plugin file that is not a shared library", "check grove.toml", 4, "garbage.so",
     lambda d: (write(f"{d}/garbage.so", "not an ELF file"),
                write(f"{d}/grove.toml", manifest(rewards='[[rewards]]\nplugin = "./garbage.so"\n'))))
case("plugins", "a Python reward taking TRL's environments in a run without an environment", "check grove.toml", 3,
     "config.function: error: plugin 'python'",
     lambda d: (write(f"{d}/rewards.py", "def solved(environments, **kwargs):\n    return [e.solved for e in environments]\n"),
                write(f"{d}/grove.toml", manifest(rewards='[[rewards]]\nplugin = "python"\n'
                                                          'config = { module = "rewards.py", function = "solved" }\n'))))

MISBEHAVING = os.path.join(BUILD_PREFIX, "tests/core/test-plugins/misbehaving/libmisbehaving.so")
case("plugins", "a reward plugin that segfaults, in a worker process", TRAIN, 4,
     "crashed with signal 11 (Segmentation fault) while scoring the batch of step 0",
     run_folder(rewards=f'[[rewards]]\nplugin = "{MISBEHAVING}"\nisolation = "process"\nconfig = {{ behaviour = "segfault" }}\n'))
case("plugins", "a reward plugin that hangs, in a worker process with a timeout", TRAIN, 4, "did not answer within its timeout",
     run_folder(rewards=f'[[rewards]]\nplugin = "{MISBEHAVING}"\nisolation = "process"\ntimeout = 1\n'
                        'config = { behaviour = "hang" }\n'))
case("plugins", "a reward plugin that returns an error", TRAIN, 4, "the judge is unreachable",
     run_folder(rewards=f'[[rewards]]\nplugin = "{MISBEHAVING}"\nconfig = {{ behaviour = "fail" }}\n'))
case("plugins", "an environment plugin that segfaults, in a worker process", TRAIN, 4,
     "environment plugin 'misbehaving_env'",
     run_folder(f'[environment]\nplugin = "{MISBEHAVING}"\nisolation = "process"\nreward_weight = 1.0\n'
                'config = { behaviour = "segfault" }\n'))
case("plugins", "timeout without a worker process", "check grove.toml", 3, "add isolation = \"process\"",
     run_folder(rewards='[[rewards]]\nplugin = "format"\ntimeout = 5\n'))

# ---- datasets and rollouts: grove train ------------------------------------------------------------
case("data", "the dataset file is missing", TRAIN, 5, "missing.jsonl: cannot read",
     run_folder(data='source = "missing.jsonl"'))
case("data", "a line that is not JSON", TRAIN, 5, "prompts.jsonl:2",
     run_folder(prompts='{"prompt": "a"}\n{"prompt": "b"\n'))
case("data", "a row without the prompt column", TRAIN, 5, "prompts.jsonl:1",
     run_folder(prompts='{"question": "a"}\n'))
case("data", "a chat message without content", TRAIN, 5, "prompts.jsonl:1: chat messages need string \"role\" and \"content\"",
     run_folder(prompts='{"prompt": [{"role": "user"}]}\n'))
case("data", "a chat message with tool calls, which the checkpoint's template does not write", TRAIN, 5,
     "prompts.jsonl:1: a message has \"tool_calls\", which Grove writes only as Qwen2.5's and Qwen3's",
     run_folder(prompts='{"prompt": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "", '
                        '"tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {}}}]}]}\n'))
case("data", "a conversation the chat template refuses (Mistral's: no system role)", TRAIN + " --set model.chat_template=mistral",
     5, "prompts.jsonl:2: mistral chat template: conversation roles must alternate",
     run_folder(prompts='{"prompt": "1 + 2 ="}\n{"prompt": [{"role": "system", "content": "Be brief."}, '
                        '{"role": "user", "content": "2 + 2 ="}]}\n'))
case("data", "a prompt that is a number", TRAIN, 5, "\"prompt\" must be text or a list of messages",
     run_folder(prompts='{"prompt": 5}\n'))
case("data", "an empty dataset", TRAIN, 5, "prompts.jsonl",
     run_folder(prompts=''))
SFT = "sft grove.toml"
case("data", "an SFT row in none of TRL's formats (prompt + completion, messages, text)", SFT, 5,
     "prompts.jsonl:1: the row has none of TRL's SFT formats",
     run_folder(prompts='{"question": "1 + 2 =", "answer": "3"}\n'))
case("data", "an SFT completion given as messages after a text prompt", SFT, 5,
     "prompts.jsonl:1: the completion is chat messages but the prompt is text",
     run_folder(prompts='{"prompt": "1 + 2 =", "completion": [{"role": "assistant", "content": "3"}]}\n'))
case("data", "SFT rows whose prompts fill sft.max_length, so no completion token is left", SFT + " --set sft.max_length=2", 5,
     "no example has a trained token within sft.max_length = 2 tokens",
     run_folder(prompts='{"prompt": "12 + 34 + 56 =", "completion": " 102"}\n'))
case("data", "SFT padding_free without packing, which would not cut examples to max_length", SFT + " --set sft.padding_free=true",
     3, "sft.padding_free without sft.packing", run_folder())
case("data", "SFT assistant_only_loss on rows that are no conversations", SFT + " --set sft.assistant_only_loss=true", 5,
     "prompts.jsonl:1: sft.assistant_only_loss trains the assistant turns of conversation rows", run_folder())
case("data", "SFT assistant_only_loss with a chat template TRL has no training template for",
     SFT + " --set sft.assistant_only_loss=true", 5, "for the chatml, qwen3, qwen3_instruct, llama3 and gemma families, not for the",
     run_folder(prompts='{"messages": [{"role": "user", "content": "1 + 2 ="}, {"role": "assistant", "content": "3"}]}\n'))
case("data", "an SFT conversation with tools, under a chat template that cannot show them", SFT, 5,
     "prompts.jsonl:1: the conversation has tools (an environment's, or the row's \"tools\" column), which Grove",
     run_folder(prompts='{"messages": [{"role": "user", "content": "1 + 2 ="}, {"role": "assistant", "content": "3"}], '
                        '"tools": [{"type": "function", "function": {"name": "add"}}]}\n'))
case("data", "a tokenized SFT row with a token id beyond the tokenizer's vocabulary", SFT, 5,
     "prompts.jsonl:1: input_ids[1] = 100000 is not a token of this tokenizer",
     run_folder(prompts='{"input_ids": [5, 100000, 7]}\n'))
case("data", "a tokenized SFT row whose labels are other tokens than its input_ids", SFT, 5,
     "prompts.jsonl:1: labels[2] is 9, neither -100 nor input_ids[2]",
     run_folder(prompts='{"input_ids": [5, 6, 7], "labels": [-100, 6, 9]}\n'))
case("data", "a tokenized SFT row whose mask is shorter than its input_ids", SFT, 5,
     "prompts.jsonl:1: \"completion_mask\" must be a list of integers, one per token of input_ids (3)",
     run_folder(prompts='{"input_ids": [5, 6, 7], "completion_mask": [0, 1]}\n'))
case("data", "SFT eval_packing without packing, which TRL would evaluate in padded batches across examples",
     SFT + " --set sft.eval_packing=true", 3, "sft.eval_packing = true without sft.packing", run_folder())
case("data", "SFT packing with no max_length to pack to", SFT + " --set sft.packing=true --set sft.max_length=0", 3,
     "sft.packing needs sft.max_length", run_folder())
ROLLOUTS = 'source = "prompts.jsonl"\n[rollouts]\npath = "rollouts.jsonl"'
case("data", "a rollout row that is a number", TRAIN, 5, "rollouts.jsonl:1: a rollout is a JSON object",
     both(run_folder(data=ROLLOUTS), lambda d: write(f"{d}/rollouts.jsonl", "5\n")))
case("data", "a rollout token id outside the vocabulary", TRAIN, 5, "outside the vocabulary",
     both(run_folder(data=ROLLOUTS),
          lambda d: write(f"{d}/rollouts.jsonl", '{"prompt_ids": [1, 2], "completion_ids": [99999999]}\n' * 2)))
case("data", "a rollout token id written as 1e300", TRAIN, 5, "is not an integer",
     both(run_folder(data=ROLLOUTS),
          lambda d: write(f"{d}/rollouts.jsonl", '{"prompt_ids": [1e300], "completion_ids": [3]}\n' * 2)))
case("data", "an env_mask of the wrong length", TRAIN, 5, "env_mask has 1 values for 2 completion tokens",
     both(run_folder(data=ROLLOUTS),
          lambda d: write(f"{d}/rollouts.jsonl", '{"prompt_ids": [1], "completion_ids": [3, 4], "env_mask": [1]}\n' * 2)))
case("data", "rollouts that do not form whole groups", TRAIN, 5, "do not form whole groups",
     both(run_folder(data=ROLLOUTS), lambda d: write(f"{d}/rollouts.jsonl", '{"prompt_ids": [1], "completion_ids": [3]}\n')))
case("data", "a rollout reward the manifest does not have", TRAIN, 5, "is not one of the manifest's rewards",
     both(run_folder(data=ROLLOUTS), lambda d: write(
         f"{d}/rollouts.jsonl", '{"prompt_ids": [1], "completion_ids": [3], "rewards": {"acc": 1}}\n' * 2)))

# ---- model folders: grove logprobs / generate -----------------------------------------------------
LOGPROBS = "logprobs --model model --input in.jsonl"
IDS = lambda d: write(f"{d}/in.jsonl", '{"prompt_ids": [1, 2], "completion_ids": [3]}\n')  # noqa: E731
case("model", "the model folder does not exist", "logprobs --model nowhere --input in.jsonl", 5, "nowhere", IDS)
case("model", "model.path names a Hub model the local Hugging Face cache does not hold", TRAIN, 5, "hf download ID",
     run_folder(model="Qwen/Qwen2.5-0.5B-Instruct"))
case("model", "config.json is missing", LOGPROBS, 5, "config.json",
     both(with_model(lambda m: os.remove(f"{m}/config.json")), IDS))
case("model", "config.json is not JSON", LOGPROBS, 5, "config.json",
     both(with_model(lambda m: write(f"{m}/config.json", "{")), IDS))
case("model", "an architecture Grove does not support", LOGPROBS, 5, "unsupported model",
     both(with_model(lambda m: edit_json(f"{m}/config.json", lambda j: j.update(architectures=["GPT2LMHeadModel"],
                                                                                model_type="gpt2"))), IDS))
case("model", "an OLMo 3 config with sliding_window null, which transformers' Olmo3 cannot run", LOGPROBS, 5,
     "sliding_window is null or 0",
     both(with_model(lambda m: edit_json(f"{m}/config.json", lambda j: j.update(
         architectures=["Olmo3ForCausalLM"], model_type="olmo3", sliding_window=None))), IDS))
case("model", "a Gemma 2 config whose attention soft-cap is not positive", LOGPROBS, 5,
     "attn_logit_softcapping must be positive or null",
     both(with_model(lambda m: edit_json(f"{m}/config.json", lambda j: j.update(
         architectures=["Gemma2ForCausalLM"], model_type="gemma2", attn_logit_softcapping=0.0))), IDS))
case("model", "a Gemma 3 config that sets a logit soft-cap (Gemma 2's; transformers' Gemma 3 never caps attention)",
     LOGPROBS, 5, "attn_logit_softcapping is set: Grove soft-caps Gemma 2's logits, not Gemma 3's",
     both(with_model(lambda m: edit_json(f"{m}/config.json", lambda j: j.update(
         architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", attn_logit_softcapping=50.0))), IDS))
case("model", "a Mixtral config with router_jitter_noise (training noise Grove's router does not add)", LOGPROBS, 5,
     "router_jitter_noise is not 0",
     both(with_model(lambda m: edit_json(f"{m}/config.json", lambda j: j.update(
         architectures=["MixtralForCausalLM"], model_type="mixtral", router_jitter_noise=0.01))), IDS))
case("model", "a Qwen3-MoE config that routes each token to more experts than it has", LOGPROBS, 5,
     "num_experts_per_tok (8) must be between 1 and the number of experts (4)",
     both(with_model(lambda m: edit_json(f"{m}/config.json", lambda j: j.update(
         architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4, num_experts_per_tok=8))), IDS))
case("model", "prompt + completion past a longrope checkpoint's original_max_position_embeddings (long factors, "
     "which Grove does not apply)",
     "generate --model model --prompt 'What is 2 + 2? What is 3 + 3?' --max-new-tokens 16", 5,
     "original_max_position_embeddings (16)",
     with_model(lambda m: edit_json(f"{m}/config.json", lambda j: j.update(
         original_max_position_embeddings=16,
         rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8}))))
case("model", "a size written as 1e300 in config.json", LOGPROBS, 5, "is not an integer",
     both(with_model(lambda m: edit_json(f"{m}/config.json", lambda j: j.update(hidden_size=1e300))), IDS))
case("model", "tokenizer.json that is not JSON, for a command that never tokenizes", LOGPROBS, 5, "tokenizer.json",
     both(with_model(lambda m: write(f"{m}/tokenizer.json", "not json{")), IDS))
case("model", "model.safetensors cut short", LOGPROBS, 5, "model.safetensors",
     both(with_model(lambda m: os.truncate(f"{m}/model.safetensors", 1000)), IDS))
case("model", "a safetensors header that claims more bytes than the file", LOGPROBS, 5, "model.safetensors",
     both(with_model(lambda m: write(f"{m}/model.safetensors", struct.pack("<Q", 10**12) + b"{}", "wb")), IDS))
case("model", "a tensor whose shape x dtype size overflows 64 bits", LOGPROBS, 5, "shape overflows",
     both(with_model(lambda m: write(f"{m}/model.safetensors", safetensors_file(
         {"t": {"dtype": "F64", "shape": [2**61, 4], "data_offsets": [0, 0]}}), "wb")), IDS))
case("model", "a weight missing from the checkpoint", LOGPROBS, 5, "missing tensor",
     both(with_model(lambda m: write(f"{m}/model.safetensors", safetensors_file(
         {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "wb")), IDS))
case("model", "a negative added-token id in tokenizer.json", "generate --model model --prompt hi --max-new-tokens 1", 5,
     "added_tokens[0].id: -3 is out of range",
     with_model(lambda m: edit_json(f"{m}/tokenizer.json", lambda j: j.update(
         added_tokens=[{"id": -3, "content": "<x>", "special": True}]))))
case("model", "a token id of 9e18 in tokenizer.json", "generate --model model --prompt hi --max-new-tokens 1", 5,
     "is out of range",
     with_model(lambda m: edit_json(f"{m}/tokenizer.json", lambda j: j["model"]["vocab"].update({"zz": 9 * 10**18}))))
case("model", "a tokenizer model type Grove does not implement", "generate --model model --prompt hi --max-new-tokens 1",
     5, "is not supported",
     with_model(lambda m: edit_json(f"{m}/tokenizer.json", lambda j: j["model"].update(type="WordPiece"))))
case("model", "an eos_token that is not in the vocabulary", "generate --model model --prompt hi --max-new-tokens 1", 5,
     "is not in the vocabulary",
     with_model(lambda m: write(f"{m}/tokenizer_config.json", json.dumps({"eos_token": "<|no such token|>"}))))

# ---- GGUF files: grove convert gguf ---------------------------------------------------------------
CONVERT = "convert gguf model.gguf out"
case("gguf", "a file that is not GGUF", CONVERT, 5, "does not start with the magic 'GGUF'",
     lambda d: write(f"{d}/model.gguf", "PK\x03\x04 a zip file" + " " * 40))
case("gguf", "a GGUF cut short", CONVERT, 5, "runs past the end of the file",
     lambda d: (gguf_file()(d), os.truncate(f"{d}/model.gguf", 2000)))
case("gguf", "a head count of zero", CONVERT, 5, "llama.attention.head_count\": 0 is out of range",
     gguf_file(metadata={"llama.attention.head_count": (0, T.UINT32)}))
case("gguf", "a one-dimensional attention weight", CONVERT, 5, "blk.0.attn_q.weight\" has shape [32]",
     gguf_file(shapes={"blk.0.attn_q.weight": (32,)}))
case("gguf", "general.alignment written as a string", CONVERT, 5, "general.alignment: \"32\" is not an integer",
     gguf_file(metadata={"general.alignment": ("32", T.STRING)}))
case("gguf", "a BOS token id outside the vocabulary", CONVERT, 5, "tokenizer.ggml.bos_token_id\" (a token id): 5000",
     gguf_file(metadata={"tokenizer.ggml.bos_token_id": (5000, T.UINT32)}))
case("gguf", "a model that is not a llama", CONVERT, 5, "is not supported (supported: llama)",
     lambda d: _rewrite_architecture(d))
case("gguf", "a layer's tensors missing", CONVERT, 5, "missing tensor \"blk.0.ffn_down.weight\"",
     gguf_file(skip=("blk.0.ffn_down.weight",)))


# ---- runs, checkpoints and resume: grove train ------------------------------------------------------
case("runs", "an output folder that already holds a run", TRAIN, 2, "already holds a run",
     both(run_folder(), lambda d: write(f"{d}/out/metrics.jsonl", '{"step": 1}\n')))
case("runs", "an output folder that cannot be written", TRAIN + " --set 'output.dir=\"/proc/grove-out\"'", 1,
     "is not writable", run_folder())
case("runs", "a checkpoint with one flipped byte", TRAIN + " --resume --set train.max_steps=3", 5,
     "does not match the checksum",
     lambda d: (trained()(d), _flip_last_byte(f"{d}/out/checkpoint-2/optimizer.safetensors")))
case("runs", "a checkpoint file cut short", TRAIN + " --resume --set train.max_steps=3", 5, "bytes where",
     lambda d: (trained()(d), os.truncate(f"{d}/out/checkpoint-2/trainable.safetensors", 100)))
case("runs", "a checkpoint file deleted", TRAIN + " --resume --set train.max_steps=3", 5, "is missing",
     lambda d: (trained()(d), os.remove(f"{d}/out/checkpoint-2/optimizer.safetensors")))
case("runs", "trainer_state.json cut short", TRAIN + " --resume --set train.max_steps=3", 5, "is not valid JSON",
     lambda d: (trained()(d), write(f"{d}/out/checkpoint-2/trainer_state.json", '{"global_step": 2, "mic')))
case("runs", "a resume from a checkpoint that holds only the model (output.save_only_model)",
     TRAIN + " --resume out/checkpoint-2 --set train.max_steps=4", 2, "holds only the model",
     trained(3, "--set output.save_only_model=true"))
case("runs", "a checkpoint resumed on another model", TRAIN + " --resume --set train.max_steps=3", 5,
     "the checkpoint was written for another model",
     lambda d: (trained()(d), shutil.rmtree(f"{d}/model"),
                shutil.copytree(os.path.join(os.path.dirname(TINY_MODEL), "mistral_mha"), f"{d}/model")))
case("runs", "--resume with a folder that is no checkpoint", TRAIN + " --resume prompts.jsonl", 5, "not a checkpoint",
     run_folder())
case("runs", "--overwrite of a folder that holds the model being trained", TRAIN + " --overwrite --set 'output.dir=\".\"'", 2,
     "--overwrite would delete", both(run_folder(), lambda d: write(f"{d}/metrics.jsonl", '{"step": 1}\n')))
case("runs", "NCCL between processes with the model on the CPU",
     TRAIN + " --nproc 2 --set 'train.ddp_backend=\"nccl\"' --set 'model.device=\"cpu\"'", 3, "runs between GPUs",
     run_folder())

# ---- the command line ----------------------------------------------------------------------------
case("command line", "an unknown command", "trian grove.toml", 2, "trian", None)
case("command line", "an unknown option", "train grove.toml --resumee", 2, "resumee", run_folder())
case("command line", "a --set without '='", "check grove.toml --set train.max_steps", 2, "expected section.key=value",
     run_folder())
case("command line", "a manifest that does not exist", "check nowhere.toml", 3, "nowhere.toml", None)


# ---- running them --------------------------------------------------------------------------------
EMPTY_HUB_CACHE = os.path.join(WORK, "empty-hub-cache")


def message(text, folder):
    lines = [l for l in text.splitlines() if l.strip()]
    start = next((i for i, l in enumerate(lines) if l.startswith("grove: ") and "training" not in l[:16]), None)
    shown = lines[start:] if start is not None else lines[-1:]
    if len(shown) > 5:  # a usage text after the message
        shown = shown[:2] + ["..."]
    joined = "\n".join(shown).replace(EMPTY_HUB_CACHE, "~/.cache/huggingface/hub").replace(folder + "/", "").replace(folder, ".").replace(BUILD_PREFIX, "<prefix>")
    return re.sub(r"(\.tmp-[\w.-]+?)-\d+", r"\1-<pid>", joined)


def run_case(index, c):
    folder = os.path.join(WORK, f"case-{index:02d}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if c["setup"]:
        c["setup"](folder)
    # an empty Hugging Face cache, shown in the messages as the default's spelling on any machine
    r = subprocess.run(f"{GROVE} {c['command']}", shell=True, cwd=folder, capture_output=True, text=True,
                       errors="replace", timeout=300, env=dict(os.environ, HF_HUB_CACHE=EMPTY_HUB_CACHE))
    said = message(r.stderr, folder)
    problems = []
    if r.returncode != c["exit_code"]:
        problems.append(f"exit code {r.returncode}, expected {c['exit_code']}")
    if c["says"] not in said:
        problems.append(f"the message lacks {c['says']!r}")
    if "internal error" in said:
        problems.append("an internal error")
    return said, r.returncode, problems


def markdown(results):
    out = ["# Bad inputs: what Grove says", "",
           "Each row is a mistake or a damaged file, the command that meets it, the exit code and the message,",
           "as `grove` prints them (folders shortened to `.`). Every row is a test: `bad_inputs_catalogue` runs",
           "the command and checks the exit code and the message (tests/bad_inputs/catalogue.py; regenerate",
           "this file with the command at its top after changing a message). Exit codes: docs/cli.md.", "",
           f"{len(results)} cases."]
    area = None
    for c, said, code in results:
        if c["area"] != area:
            area = c["area"]
            out += ["", f"## {area}", "", "| input | command | exit | Grove says |", "|---|---|---|---|"]
        cell = said.replace("|", "\\|").replace("\n", "<br>")
        command = c["command"].replace("|", "\\|")
        out.append(f"| {c['what']} | `grove {command}` | {code} | {cell} |")
    return "\n".join(out)


def main():
    os.makedirs(WORK, exist_ok=True)
    results, failures = [], 0
    for i, c in enumerate(CASES):
        said, code, problems = run_case(i, c)
        results.append((c, said, code))
        if problems:
            failures += 1
            print(f"FAIL  {c['area']}: {c['what']}: {'; '.join(problems)}\n      said: {said}")
        else:
            print(f"ok    {c['area']}: {c['what']}")
    text = markdown(results) + "\n"
    if MODE == "--write":
        write(DOC, text)
    elif MODE == "--check":
        with open(DOC) as f:
            if f.read() != text:
                failures += 1
                print(f"FAIL  {DOC} differs from the messages Grove prints now; regenerate it with --write")
    print(f"{len(CASES) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
