"""SFT step time, Grove vs TRL: same model, rows, batch, lengths, machine, one run.

    .venv/bin/python bench/sft.py [--shape tiny|smollm2-135m|qwen2.5-0.5b|gemma3-270m|qwen3-moe-mini|gemma2-mini]
                                  [--steps 5] [--batch 8] [--completion-words 120] [--device cpu|cuda] [--skip-trl]

The models are bench/step.py's (random weights at the shape, a byte-level tokenizer trained up to
the full vocabulary). The rows are prompt-completion text, a short question and a completion of
about --completion-words random words, so both trainers tokenize, train on the completion only and
append the EOS token the same way (grove sft prepares rows as TRL's SFTTrainer does). Both: full
fine-tuning, AdamW, learning rate 2e-5, no gradient checkpointing, max_length 1024, no packing;
float32 on the CPU, float32 weights under bf16 autocast on CUDA. Prints seconds per step (mean over
the steps after the first), both peak RSS, and the throughput ratio (TRL's time / Grove's).
"""
import argparse
import atexit
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step import GROVE, RANDOM_SHAPES, make_model, rss_and_output  # noqa: E402


def trl_side(args):
    """Child process: TRL's SFTTrainer for args.steps steps; prints per-step seconds as JSON."""
    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer
    from generate import peer_attention
    torch.set_num_threads(os.cpu_count() or 1)
    on_gpu = args.device != "cpu"
    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            if on_gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.start)

    config = SFTConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.batch, max_steps=args.steps,
                       learning_rate=2e-5, use_cpu=not on_gpu, bf16=on_gpu, gradient_checkpointing=False,
                       logging_steps=1, report_to="none", save_strategy="no", seed=7, max_length=1024)
    model = AutoModelForCausalLM.from_pretrained(args.model,
                                                 attn_implementation=peer_attention(AutoConfig.from_pretrained(args.model)))
    rows = [json.loads(line) for line in open(args.data)]
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                         processing_class=AutoTokenizer.from_pretrained(args.model), callbacks=[Timer()])
    trainer.train()
    print(json.dumps({"step_seconds": times, "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else 0.0}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="tiny", choices=["tiny", *RANDOM_SHAPES])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--grove", default=GROVE, help="the grove program")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--completion-words", type=int, default=120)
    parser.add_argument("--skip-trl", action="store_true", help="time Grove only")
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "trl":
        return trl_side(args)

    work = tempfile.mkdtemp(prefix="grove-sft-bench-")
    atexit.register(shutil.rmtree, work, True)  # the model and Grove's final folder: gigabytes
    model = os.path.join(work, "model")
    make_model(model, args.shape)
    rng = random.Random(0)
    data = os.path.join(work, "rows.jsonl")
    with open(data, "w") as f:
        for i in range(args.batch * args.steps):
            words = " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randrange(3, 8)))
                             for _ in range(args.completion_words))
            f.write(json.dumps({"prompt": f"What is {i} + {i}? ", "completion": words}) + "\n")
    manifest = os.path.join(work, "sft.toml")
    with open(manifest, "w") as f:
        f.write(f"""[model]
path = "{model}"
device = "{args.device}"
chat_template = "none"
[data]
source = "{data}"
[train]
per_device_train_batch_size = {args.batch}
learning_rate = 2e-5
max_steps = {args.steps}
seed = 7
[output]
dir = "{os.path.join(work, 'grove-run')}"
save_steps = 100000
""")
    grove_rss, _, _ = rss_and_output([args.grove, "sft", manifest, "--overwrite"])
    with open(os.path.join(work, "grove-run", "metrics.jsonl")) as f:
        grove_metrics = [json.loads(line) for line in f]
    mean = lambda xs: sum(xs[1:]) / max(1, len(xs) - 1)  # the first step includes warm-up
    g = mean([m["step_time"] for m in grove_metrics])
    tokens = grove_metrics[-1]["num_tokens"] / len(grove_metrics)
    result = {"shape": args.shape, "device": args.device, "batch": args.batch, "steps": args.steps,
              "tokens_per_step": round(tokens), "grove_seconds_per_step": round(g, 3), "grove_peak_rss_mib": round(grove_rss)}
    if not args.skip_trl:
        trl_rss, out, _ = rss_and_output([sys.executable, os.path.abspath(__file__), "--side", "trl", "--model", model,
                                          "--data", data, "--steps", str(args.steps), "--batch", str(args.batch),
                                          "--device", args.device])
        t = mean(json.loads(out.strip().splitlines()[-1])["step_seconds"])
        result.update({"trl_seconds_per_step": round(t, 3), "throughput_ratio": round(t / g, 2),
                       "trl_peak_rss_mib": round(trl_rss)})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
