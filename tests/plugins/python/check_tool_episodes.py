"""A model that calls tools trains as TRL 1.16 trains it: the episodes Grove samples with a TRL
environment (the tool call, the tool's answer, the model's next turn) are TRL's token for token,
and the optimizer step on them is TRL's.

The tiny test checkpoints call no tools, so this script first teaches a copy of one (with plain
torch, here) to answer "Count to N." with a Hermes call of Counter's `add` tool and, after the
tool's result, with "Done.". Then, on that checkpoint, with greedy sampling (top_k = 1) so that
both sample the same turns:
- TRL's GRPOTrainer (under transformers 5, which its environment_factory needs) trains one step with
  environment_factory=Counter (whose get_reward() is a reward column), a reward that tells a group's
  two rows apart, and an entropy bonus, recording the episodes its tool loop built (prompt ids,
  completion ids, tool_mask);
- `grove train` runs the equivalent manifest with logging.save_rollouts.
And again with an environment that owns its data (CountToOne, whose reset() writes the prompt):
TRL without a train_dataset, Grove without data.source, each on its placeholder prompts; and with a
completion budget the tool's answer would overrun, which TRL's tool loop drops, ending the episode
after the call; and with no environment class at all, the same tools as plain functions (TRL's
tools=[add, echo_prompt], Grove's `tools = ["add", "echo_prompt"]`).
Grove's episodes must be TRL's (ids and which tokens the environment wrote), its rewards and tool
metrics TRL's, and its loss, entropy, gradient norm and updated weights TRL's within float rounding.
A group's rows are the same episode, so their opposite advantages cancel in the gradient: the
entropy bonus over the tokens the model wrote (not the tool's) is what the step learns from.

usage: check_tool_episodes.py GROVE MODEL_DIR WORK_DIR
"""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(sys.prefix, "transformers5-site"))  # TRL's environment_factory needs transformers 5

import torch  # noqa: E402  (after the path above)

TARGETS = [1, 2]
CALL = '<tool_call>\n{"name": "add", "arguments": {"amount": 1}}\n</tool_call>'
ANSWER = "Done."
END = "<|im_end|>"
# rows 2k and 2k + 1 are one prompt's group; a reward that tells them apart gives each an advantage
REWARDS = '''
def alternating(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]
'''
# Adam's first step moves a weight by lr * g / (|g| + eps): with eps = 1 that is about lr * g, so the
# weights after the step compare the gradients element by element, not only their signs
LEARNING_RATE = 0.1
ADAM_EPSILON = 1.0
WHOLE_EPISODE = 192  # max_completion_length for the whole episode (~130 tokens)
CALL_ONLY = 96  # the call (~70 tokens) fits, its answer does not: TRL drops a tool result that would overrun
ENTROPY_COEF = 0.1


def conversation(target):
    return [{"role": "user", "content": f"Count to {target}."}]


def qwen2_5_tokenizer(model):
    import transformers
    import trl

    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5.jinja")) as f:
        tokenizer.chat_template = f.read()  # the tiny checkpoint's own template writes no tools
    return tokenizer


def episode_pieces(tokenizer, target):
    """One taught episode as (token ids, trained?) pieces: the prompt with Counter's tools, the call,
    the tool's answer as Qwen2.5's template writes it, and the closing turn."""
    from environments import Counter

    counter = Counter()
    tools = [counter.add, counter.echo_prompt]
    messages = conversation(target)
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"amount": 1}}}]}

    def render(conversation, generation_prompt):
        return tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)

    before = render(messages + [call], False)
    after = render(messages + [call, {"role": "tool", "name": "add", "content": "1"}], True)
    assert before.endswith(CALL + END + "\n") and after.startswith(before), (before, after)
    tool_turn = after[len(before) - 1:]  # from the newline after the model's <|im_end|>
    texts = [(render(messages, True), False), (CALL + END, True), (tool_turn, False), (ANSWER + END, True)]
    return [(tokenizer(text, add_special_tokens=False)["input_ids"], trained) for text, trained in texts]


def teach_tool_calls(base, out, work_limit=600):
    """A copy of `base` trained until its greedy turns are the taught ones with a margin, saved as
    `base` is (its config with a longer context, the tokenizer, safetensors weights)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(base, out)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    config["max_position_embeddings"] = 4096  # a prompt with tools is ~1k tokens of the tiny vocabulary
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tokenizer = qwen2_5_tokenizer(out)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    rows = []
    for target in TARGETS:
        pieces = episode_pieces(tokenizer, target)
        ids = torch.tensor([i for piece, _ in pieces for i in piece])
        trained = torch.tensor([t for piece, t in pieces for _ in piece])
        rows.append((ids[:-1], ids[1:], trained[1:]))  # predict token k + 1 from tokens up to k
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(work_limit):
        optimizer.zero_grad()
        loss, margins = 0.0, []
        for inputs, labels, trained in rows:
            logits = model(inputs[None]).logits[0][trained]
            wanted = labels[trained]
            loss = loss + torch.nn.functional.cross_entropy(logits, wanted)
            best_other = logits.scatter(1, wanted[:, None], float("-inf")).max(1).values
            margins.append((logits.gather(1, wanted[:, None])[:, 0] - best_other).min().item())
        if min(margins) > 3.0:  # every taught token wins by e^3 at least: greedy sampling follows it in both
            break
        loss.backward()
        optimizer.step()
    assert min(margins) > 3.0, f"the tiny model did not learn the tool episode in {work_limit} steps (margin {min(margins)})"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "model.safetensors"))
    print(f"taught the tool call in {step} steps: loss {loss.item() / len(rows):.3f}, smallest margin {min(margins):.2f}")
    return [[i for piece, _ in episode_pieces(tokenizer, t) for i in piece] for t in TARGETS]


# (the environment class or None, the module's functions as TRL's standalone tools, the module, the
# dataset's rows or None where the environment writes the prompts, max_completion_length)
DATASET = [{"prompt": conversation(t), "target": t} for t in TARGETS]
CASES = [("Counter", [], "environments", DATASET, WHOLE_EPISODE), ("CountToOne", [], "self_prompting", None, WHOLE_EPISODE),
         ("Counter", [], "environments", DATASET, CALL_ONLY),
         (None, ["add", "echo_prompt"], "counting_tools", DATASET, WHOLE_EPISODE)]


def trl_run(model, work, environment, functions, module, rows, budget):
    """TRL's episodes {prompt ids: (completion ids, tool_mask)} (each the same for both of a group's
    rows), its logged metrics and its weights after one step."""
    import importlib

    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    namespace = {}
    exec(REWARDS, namespace)
    episodes = []
    original_generate = GRPOTrainer._generate

    def recording_generate(self, prompts):
        result = original_generate(self, prompts)
        episodes.extend(zip(result[0], result[1], result[2], strict=True))
        return result

    GRPOTrainer._generate = recording_generate
    args = GRPOConfig(output_dir=os.path.join(work, f"trl-{environment or module}-{budget}"), num_generations=2, per_device_train_batch_size=2 * len(TARGETS),
                      max_completion_length=budget, top_k=1, learning_rate=LEARNING_RATE, adam_epsilon=ADAM_EPSILON,
                      lr_scheduler_type="constant", entropy_coef=ENTROPY_COEF, max_steps=1, report_to="none", use_cpu=True, bf16=False,
                      logging_steps=1, save_strategy="no", seed=3)
    trainer = GRPOTrainer(model=model, reward_funcs=[namespace["alternating"]], args=args,
                          train_dataset=Dataset.from_list(rows) if rows else None, processing_class=qwen2_5_tokenizer(model),
                          environment_factory=getattr(importlib.import_module(module), environment) if environment else None,
                          tools=[getattr(importlib.import_module(module), f) for f in functions])
    trainer.train()
    GRPOTrainer._generate = original_generate
    metrics = next(entry for entry in trainer.state.log_history if "reward" in entry)
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    print(f"TRL {trl.__version__}: {len(episodes)} episodes, metrics {json.dumps(metrics)}")
    return {tuple(p): (list(c), list(m)) for p, c, m in episodes}, metrics, weights


def grove_run(grove, model, work, environment, functions, module, rows, budget):
    run = os.path.join(work, f"grove-{environment or module}-{budget}")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    with open(os.path.join(run, "rewards.py"), "w") as f:
        f.write(REWARDS)
    data = ""
    if rows:
        with open(os.path.join(run, "prompts.jsonl"), "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        data = '[data]\nsource = "prompts.jsonl"\n'
    with open(os.path.join(run, "grove.toml"), "w") as f:
        f.write(f'''[model]
path = "{model}"
chat_template = "chatml"
{data}[generation]
num_generations = 2
max_completion_length = {budget}
top_k = 1
[train]
per_device_train_batch_size = {2 * len(TARGETS)}
max_steps = 1
learning_rate = {LEARNING_RATE}
adam_epsilon = {ADAM_EPSILON}
lr_scheduler_type = "constant"
mixed_precision = "no"
[loss]
entropy_coef = {ENTROPY_COEF}
[output]
dir = "out"
[logging]
save_rollouts = true
[[rewards]]
plugin = "python"
config = {{ module = "rewards.py", function = "alternating" }}
[environment]
plugin = "python_environment"
config = {{ module = "{HERE}/{module}.py", {f'class = "{environment}", ' if environment else ""}tools = {json.dumps(functions)} }}
''')
    out = subprocess.run([grove, "train", os.path.join(run, "grove.toml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f][-1]
    with open(os.path.join(run, "out", "rollouts.jsonl")) as f:
        rollouts = [json.loads(line) for line in f]
    return rollouts, metrics, os.path.join(run, "out", "checkpoint-1")


def check_episodes(trl_episodes, rollouts, taught, budget):
    """Each Grove row is TRL's episode for its prompt, and both are the taught one (with the short
    budget, up to the call: the tool's answer dropped)."""
    assert len(rollouts) == 2 * len(TARGETS), f"Grove saved {len(rollouts)} rows"
    for row in rollouts:
        prompt = tuple(row["prompt_ids"])
        assert prompt in trl_episodes, f"Grove's prompt {row['prompt_ids']} is none of TRL's {list(trl_episodes)}"
        completion, tool_mask = trl_episodes[prompt]
        assert row["completion_ids"] == completion, (
            f"for prompt ...{row['prompt_ids'][-12:]}\nGrove's completion {row['completion_ids']}\nTRL's completion   {completion}")
        assert row["env_mask"] == tool_mask, f"Grove's env_mask {row['env_mask']}\nTRL's tool_mask  {tool_mask}"
        if budget == WHOLE_EPISODE:
            assert list(prompt) + completion in taught, "the episode is not the taught one: the model did not call its tool"
        else:
            assert any(t[:len(prompt) + len(completion)] == list(prompt) + completion for t in taught) and \
                all(tool_mask), "with the short budget, the episode is not the taught call alone"


def check_metrics(trl, grove, environment):
    """The logged values TRL and Grove both define, as TRL 1.16 logs them."""
    keys = ["reward", "reward_std", "rewards/alternating/mean", "completions/mean_length", "tools/call_frequency",
            "tools/failure_frequency", "loss", "grad_norm", "entropy"] + ([f"rewards/{environment}/mean"] if environment else [])
    for key in keys:
        assert key in trl and key in grove, f"{key}: TRL logged {sorted(trl)}, Grove {sorted(grove)}"
        assert abs(trl[key] - grove[key]) <= 1e-5 * max(1.0, abs(trl[key])), f"{key}: TRL {trl[key]}, Grove {grove[key]}"
    assert trl["grad_norm"] > 1e-3, f"TRL's step had no gradient ({trl['grad_norm']}): the weights below prove nothing"


def check_weights(trl_weights, checkpoint, base):
    from safetensors.torch import load_file

    grove = load_file(os.path.join(checkpoint, "model.safetensors"))
    before = load_file(os.path.join(base, "model.safetensors"))
    worst = max((grove[k] - trl_weights[k]).abs().max().item() for k in before)
    moved = max((trl_weights[k] - before[k]).abs().max().item() for k in before)
    assert moved > 1e-5, f"TRL's step moved no weight ({moved})"
    assert worst < 1e-3 * moved, f"Grove's weights after the step differ from TRL's by up to {worst} (the step moved them {moved})"
    return worst, moved


def main():
    grove, base, work = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "tool_caller")
    taught = teach_tool_calls(base, model)
    for environment, functions, module, rows, budget in CASES:
        trl_episodes, trl_metrics, trl_weights = trl_run(model, work, environment, functions, module, rows, budget)
        rollouts, metrics, checkpoint = grove_run(grove, model, work, environment, functions, module, rows, budget)
        check_episodes(trl_episodes, rollouts, taught, budget)
        check_metrics(trl_metrics, metrics, environment)
        worst, moved = check_weights(trl_weights, checkpoint, model)
        report(environment or f"tools={functions}", rows, budget, rollouts, metrics, trl_metrics, worst, moved)


def report(environment, rows, budget, rollouts, metrics, trl_metrics, worst, moved):
    tool_tokens = sum(m == 0 for row in rollouts for m in row["env_mask"])
    prompts = "the dataset's prompts" if rows else "prompts the environment wrote (no dataset)"
    prompts += f", max_completion_length {budget}"
    print(f"{environment}, {prompts}: Grove's {len(rollouts)} episodes are TRL's token for token ({tool_tokens} tokens written by the tool); "
          f"loss {metrics['loss']:.6g} (TRL {trl_metrics['loss']:.6g}), grad_norm {metrics['grad_norm']:.6g} "
          f"(TRL {trl_metrics['grad_norm']:.6g}); the weights moved up to {moved:.3g} and differ from TRL's by {worst:.3g}")


if __name__ == "__main__":
    main()
