"""GRPO step time with a tool, Grove vs TRL: multi-turn episodes with a calculator, one run.

    .venv/bin/python bench/multiturn.py [--steps 4] [--generations 8] [--prompts 2] [--max-completion 48]
                                        [--sft-steps 250]

Both trainers need a model that calls the tool, so the script first makes one the way Grove's
tool-use warm start does: a sentencepiece tokenizer and a 4-layer, 128-wide Llama trained with
`grove sft` on builtin:multiplication's reference episodes (`<calc>a * b</calc>`, the calculator's
`<result>`, `<answer>`). Then, on the same prompts (that dataset's training rows, rendered as text):
- Grove: `grove train` with `[environment] plugin = "calculator"`, max_turns 3;
- TRL 1.16: GRPOTrainer with a `rollout_func` that runs the same protocol with transformers'
  `generate` (a turn stops at `</calc>` or EOS; the call is evaluated; `<result>…</result>` is
  appended with env_mask 0), which is how a TRL user writes a custom multi-turn environment on
  transformers 4.x (TRL's own tool loop needs transformers >= 5).
Both: beta 0, one iteration, float32 on the CPU, temperature 1, the same exact-answer reward. Prints
seconds per step (mean over the steps after the first) for both, the ratio, and both sides' tool calls
per episode and model tokens per episode (env_mask 1), so the two ran comparable episodes.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GROVE = os.path.join(ROOT, "build", "bin", "grove")
SYMBOLS = ["<calc>", "</calc>", "<result>", "</result>", "<answer>", "</answer>"]


def make_tool_model(work, sft_steps):
    """A small Llama warm-started on tool-using episodes (examples of `grove sft` with turns)."""
    def grove(*args):
        subprocess.run([GROVE, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    symbols = [a for s in SYMBOLS for a in ("--symbol", s)]
    grove("tokenizer", "train", "--input", "builtin:multiplication", "--out", f"{work}/tokenizer", "--vocab-size", "512",
          *symbols)
    grove("init-model", f"{work}/base", "--tokenizer", f"{work}/tokenizer", "--hidden", "128", "--layers", "4", "--heads",
          "4", "--kv-heads", "2", "--intermediate", "384", "--seed", "1")
    with open(f"{work}/sft.toml", "w") as f:
        f.write(f"""[model]
path = "{work}/base"
chat_template = "plain"
[data]
source = "builtin:multiplication"
completion_column = "episode"
[[rewards]]
plugin = "correctness"
[train]
per_device_train_batch_size = 32
learning_rate = 3e-3
warmup_steps = 20
lr_scheduler_type = "cosine"
max_steps = {sft_steps}
seed = 1
[output]
dir = "{work}/model"
""")
    grove("sft", f"{work}/sft.toml", "--overwrite")
    return f"{work}/model"


def evaluate_call(body):
    """The calculator plugin's arithmetic for the bench's calls: numbers, + - * / and parentheses."""
    if not re.fullmatch(r"[0-9+\-*/(). ]+", body):
        raise ValueError("not an expression")
    value = eval(body, {"__builtins__": {}})  # the pattern admits arithmetic only
    return str(int(value)) if float(value).is_integer() else f"{value:.10g}"


def trl_side(args):
    """Child process: TRL's GRPOTrainer with a calculator rollout_func; prints per-step seconds as JSON."""
    import torch
    from datasets import Dataset
    from transformers import StoppingCriteria, StoppingCriteriaList, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    torch.set_num_threads(os.cpu_count() or 1)
    rows = [json.loads(line) for line in open(args.data)]
    calls = []

    class StopAtCall(StoppingCriteria):  # per row: the turn's text reached </calc>
        def __init__(self, tokenizer, start):
            self.tokenizer, self.start = tokenizer, start

        def __call__(self, input_ids, scores, **kwargs):
            tails = self.tokenizer.batch_decode(input_ids[:, max(self.start, input_ids.shape[1] - 8):])
            return torch.tensor(["</calc>" in t for t in tails], device=input_ids.device)

    def calculator_rollout(prompts, trainer):
        tokenizer, model = trainer.processing_class, trainer.model
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completions, env_mask = [[] for _ in prompts], [[] for _ in prompts]
        running, episode_calls = list(range(len(prompts))), 0
        for turn in range(3):
            if not running:
                break
            histories = [prompt_ids[i] + completions[i] for i in running]
            width = max(len(h) for h in histories)
            input_ids = torch.tensor([[pad] * (width - len(h)) + h for h in histories])
            attention = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories])
            room = [args.max_completion - len(completions[i]) for i in running]
            with torch.no_grad():
                out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max(room),
                                     do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad,
                                     eos_token_id=eos, stopping_criteria=StoppingCriteriaList([StopAtCall(tokenizer, width)]))
            still = []
            for k, i in enumerate(running):
                new = out[k, width:].tolist()[:room[k]]
                if eos in new:
                    new = new[:new.index(eos) + 1]
                text = tokenizer.decode(new)
                if "</calc>" in text:  # cut after the token that completes the call
                    n = next(n for n in range(1, len(new) + 1) if "</calc>" in tokenizer.decode(new[:n]))
                    new, text = new[:n], tokenizer.decode(new[:n])
                completions[i] += new
                env_mask[i] += [1] * len(new)
                call = re.search(r"<calc>(.*?)</calc>", text)
                if turn == 2 or len(completions[i]) >= args.max_completion or not call:
                    continue
                episode_calls += 1
                try:
                    answer = evaluate_call(call.group(1))
                except Exception as e:  # noqa: BLE001 - an error observation, as the plugin gives
                    answer = f"error: {e}"
                observation = tokenizer(f"<result>{answer}</result>", add_special_tokens=False)["input_ids"]
                observation = observation[:args.max_completion - len(completions[i])]
                completions[i] += observation
                env_mask[i] += [0] * len(observation)
                if len(completions[i]) < args.max_completion:
                    still.append(i)
            running = still
        calls.append(episode_calls / len(prompts))
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": None, "env_mask": env_mask}

    def exact(completions, answer, **kwargs):
        found = [re.findall(r"<answer>(.*?)</answer>", c) for c in completions]
        return [1.0 if f and f[-1].strip() == a else 0.0 for f, a in zip(found, answer)]

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

    config = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.generations * args.prompts,
                        num_generations=args.generations, max_completion_length=args.max_completion, max_steps=args.steps,
                        learning_rate=1e-6, beta=0.0, use_cpu=True, gradient_checkpointing=False, logging_steps=1,
                        report_to="none", save_strategy="no", temperature=1.0, seed=7)
    trainer = GRPOTrainer(model=args.model, reward_funcs=exact, args=config, train_dataset=Dataset.from_list(rows),
                          rollout_func=calculator_rollout, callbacks=[Timer()])
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    print(json.dumps({"step_seconds": times, "tool_calls_per_episode": calls, "mean_length": lengths}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-completion", type=int, default=48)
    parser.add_argument("--sft-steps", type=int, default=250)
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step, which includes warm-up, is not timed)")
    if args.side == "trl":
        return trl_side(args)

    work = tempfile.mkdtemp(prefix="grove-multiturn-")
    model = make_tool_model(work, args.sft_steps)
    # the prompts both sides see: builtin:multiplication's rows as the plain template renders them
    system = "Use the calculator: write <calc>expression</calc>, read its <result>, then give only the number inside " \
             "<answer></answer>."
    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w") as f:
        for a, b in ((317 + (37 * k) % 683, 401 + (53 * k) % 599) for k in range(64)):
            f.write(json.dumps({"prompt": f"{system}\nWhat is {a} * {b}?\n", "answer": str(a * b)}) + "\n")
    manifest = os.path.join(work, "grove.toml")
    with open(manifest, "w") as f:
        f.write(f"""[model]
path = "{model}"
chat_template = "none"
[data]
source = "{data}"
[environment]
plugin = "calculator"
max_turns = 3
[generation]
num_generations = {args.generations}
max_completion_length = {args.max_completion}
[[rewards]]
plugin = "correctness"
config = {{ reference_column = "answer" }}
[train]
per_device_train_batch_size = {args.generations * args.prompts}
learning_rate = 1e-6
max_steps = {args.steps}
seed = 7
[output]
dir = "{os.path.join(work, 'grove-run')}"
save_steps = 100000
""")
    subprocess.run([GROVE, "train", manifest, "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(work, "grove-run", "metrics.jsonl")) as f:
        grove_metrics = [json.loads(line) for line in f]
    mean = lambda xs: sum(xs[1:]) / max(1, len(xs) - 1)  # the first step includes warm-up
    grove_seconds = mean([m["step_time"] for m in grove_metrics])
    grove_calls = mean([m["tools/call_frequency"] for m in grove_metrics])
    grove_length = mean([m["completions/mean_length"] for m in grove_metrics])
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--side", "trl", "--model", model, "--data", data,
                          "--steps", str(args.steps), "--generations", str(args.generations), "--prompts",
                          str(args.prompts), "--max-completion", str(args.max_completion)],
                         check=True, capture_output=True, text=True).stdout
    trl = json.loads(out.strip().splitlines()[-1])
    trl_seconds = mean(trl["step_seconds"])
    print(json.dumps({"num_generations": args.generations, "prompts_per_step": args.prompts,
                      "max_completion_length": args.max_completion, "steps": args.steps, "sft_steps": args.sft_steps,
                      "grove_seconds_per_step": round(grove_seconds, 3), "trl_seconds_per_step": round(trl_seconds, 3),
                      "throughput_ratio": round(trl_seconds / grove_seconds, 2),
                      "grove_tool_calls_per_episode": round(grove_calls, 2),
                      "trl_tool_calls_per_episode": round(mean(trl["tool_calls_per_episode"]), 2),
                      "grove_mean_model_tokens": round(grove_length, 1), "trl_mean_model_tokens": round(mean(trl["mean_length"]), 1)}))


if __name__ == "__main__":
    main()
