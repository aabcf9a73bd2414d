"""Grove's device checks: correctness of the CUDA path against transformers, then measurements side by
side with transformers and TRL. Run through run.sh, which sets the library path; writes report.md and
report.json. Every check records its figures; a failed check is reported and the others still run.

    python3 check.py --bundle DIR [--cpu] [--out DIR] [--only a,b] [--skip a,b]

Sections: environment, correctness, training, distributed, generation, step, trace.
"""
import argparse
import glob
import importlib.util
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import torch

SECTIONS = ["environment", "correctness", "training", "distributed", "generation", "step", "trace"]
TINY = ["llama_gqa", "llama3_rope", "qwen2_tied", "qwen3_qknorm", "mistral_mha", "phi3_longrope", "phi3_partial",
        "mistral_window", "qwen2_window", "smollm3_nope", "gemma2_softcap", "gemma3_window", "gemma3_vision", "olmo2_post_norm",
        "olmo3_window", "qwen3_moe_experts", "mixtral_experts", "olmoe_experts",
        "qwen2_moe_shared"]
RANDOM_SHAPES = ["smollm2-135m", "qwen2.5-0.5b"]


class CheckFailed(AssertionError):
    """A failed section that still carries the figures it measured, for the report."""

    def __init__(self, message, figures):
        super().__init__(message)
        self.figures = figures


class Context:
    def __init__(self, args):
        self.bundle = os.path.abspath(args.bundle)
        self.device = "cpu" if args.cpu else "cuda"
        self.cpu_rehearsal = args.cpu
        self.work = tempfile.mkdtemp(prefix="grove-device-")
        self.grove_path = os.path.join(self.bundle, "bin", "grove")

    def model(self, name):
        return os.path.join(self.bundle, "models", "tiny", name)

    def grove(self, *args, timeout=600):
        run = subprocess.run([self.grove_path, *map(str, args)], capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0:
            raise AssertionError(f"grove {' '.join(map(str, args))} exited {run.returncode}:\n{run.stderr[-2500:]}")
        return run.stdout


# ---------------------------------------------------------------------------------------------- environment
def environment(ctx):
    figures = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
               "grove": ctx.grove("--version").strip(), "bundle_commit": open(os.path.join(ctx.bundle, "COMMIT")).read().strip()}
    try:
        import transformers
        figures["transformers"] = transformers.__version__
        import trl
        figures["trl"] = trl.__version__
    except ImportError as e:
        figures["import_error"] = str(e)
    if ctx.device == "cuda":
        assert torch.cuda.is_available(), "torch sees no CUDA device"
        props = torch.cuda.get_device_properties(0)
        figures.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                       multiprocessors=props.multi_processor_count)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True)
        figures["driver"] = smi.stdout.strip() or smi.stderr.strip()
        figures["copy_bandwidth_gb_s"] = round(copy_bandwidth() / 1e9)
    out = ctx.grove("generate", "--model", ctx.model("llama_gqa"), "--prompt", "Hello", "--max-new-tokens", 4, "--json",
                    "--device", ctx.device)
    assert json.loads(out.splitlines()[0])["completion_ids"], "grove generated nothing on " + ctx.device
    figures["grove_generates_on"] = ctx.device
    return figures


def copy_bandwidth():
    """Device-to-device copy, bytes read plus bytes written per second: the decode roofline's memory speed."""
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / 20
    return 2 * a.numel() / seconds


# ---------------------------------------------------------------------------------------------- correctness
def reference_rows(folder):
    """The left-padded reference batch as unpadded (prompt, greedy completion) rows, and its log-probs."""
    from safetensors.torch import load_file
    ref = load_file(os.path.join(folder, "reference.safetensors"))
    rows = []
    for b in range(ref["input_ids"].shape[0]):
        prompt = ref["input_ids"][b][ref["attention_mask"][b].bool()].tolist()
        rows.append({"prompt_ids": prompt, "completion_ids": ref["greedy"][b].tolist()})
    return rows, ref["logprobs"]


def grove_logprobs(ctx, folder, rows, temperature, dtype):
    path = os.path.join(ctx.work, "rows.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = ctx.grove("logprobs", "--model", folder, "--input", path, "--temperature", temperature, "--device", ctx.device,
                    "--dtype", dtype)
    return torch.tensor([json.loads(line)["logprobs"] for line in out.splitlines()])


def olmo3_rope_theta_as_written(folder, config):
    """transformers 5's Olmo3Config gives the sliding layers its class default rope_theta (500000), not the
    config.json's: its convert_rope_params_to_dict pops rope_theta for the full layers, so the second pop
    finds nothing. transformers 4.57 and OLMo 3's design rotate both layer types at the file's rope_theta.
    Puts the file's rope_theta back; returns what was corrected, or None."""
    written = json.load(open(os.path.join(folder, "config.json"))).get("rope_theta")
    per_layer_type = getattr(config, "rope_parameters", None)
    if config.model_type != "olmo3" or written is None or not isinstance(per_layer_type, dict):
        return None
    corrected = {}
    for layer_type, params in per_layer_type.items():
        if isinstance(params, dict) and params.get("rope_theta") != written:
            corrected[layer_type] = f"rope_theta {params.get('rope_theta')} -> {written}"
            params["rope_theta"] = written
    return corrected or None


def transformers_logprobs(ctx, folder, rows, temperature, dtype, corrections=None):
    """The same log-probs from transformers on this device (TRL's recipe: logits / T, log_softmax, gather).
    A correction made to transformers' reading of the config is recorded in `corrections`."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(folder)
    corrected = olmo3_rope_theta_as_written(folder, config)
    if corrected and corrections is not None:
        corrections.update(corrected)
    # Gemma 2: transformers' SDPA leaves out the attention's soft-capping; its eager attention applies it
    eager = {"attn_implementation": "eager"} if "gemma2" in folder else {}
    model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=dtype, **eager).to(ctx.device).eval()
    out = []
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["prompt_ids"] + r["completion_ids"]], device=ctx.device)
            logits = model(input_ids=ids).logits.float()[0, len(r["prompt_ids"]) - 1:-1] / temperature
            target = torch.tensor(r["completion_ids"], device=ctx.device)
            out.append(torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0].cpu())
    return torch.stack(out)


def correctness(ctx):
    figures = {}
    failures = []
    for name in TINY:
        folder = ctx.model(name)
        rows, reference = reference_rows(folder)
        temperature = json.load(open(os.path.join(folder, "reference.json")))["temperature"]
        corrections = {}
        grove32 = grove_logprobs(ctx, folder, rows, temperature, "float32")
        hf32 = transformers_logprobs(ctx, folder, rows, temperature, torch.float32, corrections)
        grove16 = grove_logprobs(ctx, folder, rows, temperature, "bfloat16")
        hf16 = transformers_logprobs(ctx, folder, rows, temperature, torch.bfloat16)
        f = {"float32_vs_cpu_reference": (grove32 - reference).abs().max().item(),
             "float32_vs_transformers_here": (grove32 - hf32).abs().max().item(),
             "bfloat16_vs_float32_reference": (grove16 - reference).abs().max().item(),
             "transformers_bfloat16_vs_float32_reference": (hf16 - reference).abs().max().item()}
        figures[name] = {k: float(f"{v:.3g}") for k, v in f.items()}
        if corrections:
            figures[name]["transformers_here_config_corrected"] = corrections
        if max(f["float32_vs_cpu_reference"], f["float32_vs_transformers_here"]) > 1e-4:
            failures.append(f"{name}: float32 log-probs differ by more than 1e-4")
        # stated bf16 tolerance: Grove's bf16 error is at most twice transformers' own bf16 error, plus 0.02
        if f["bfloat16_vs_float32_reference"] > 2 * f["transformers_bfloat16_vs_float32_reference"] + 0.02:
            failures.append(f"{name}: bfloat16 log-probs are off by more than twice transformers' bf16 error + 0.02")
    # greedy text generation through the CLI, as transformers generated it (tokenizer and chat template included)
    folder = ctx.model("llama_gqa")
    cli_ref = json.load(open(os.path.join(folder, "reference.json")))
    for kind, extra in [("plain", []), ("chat", ["--chat"])]:
        out = json.loads(ctx.grove("generate", "--model", folder, "--prompt", "What is 2 + 2?", *extra, "--greedy",
                                   "--max-new-tokens", 6, "--json", "--device", ctx.device))
        same = out["prompt_ids"] == cli_ref[kind]["prompt_ids"] and out["completion_ids"] == cli_ref[kind]["completion_ids"]
        figures[f"greedy_{kind}_identical"] = same
        if not same:
            failures.append(f"greedy {kind}: {out['completion_ids']} != transformers' {cli_ref[kind]['completion_ids']}")
    failures += episodes_match_the_cpu(ctx, figures)
    failures += graphs_match_the_eager_loop(ctx, figures)
    if failures:
        raise CheckFailed("; ".join(failures), figures)
    return figures


def episodes_match_the_cpu(ctx, figures):
    """Multi-turn episodes (KV-cache continuation, stop strings, observations) on the device, greedy float32,
    token for token as on the CPU. The calculator's tags are characters the random tiny model writes, so
    its episodes do have several turns."""
    failures = []
    prompts = os.path.join(ctx.work, "episode-prompts.jsonl")
    with open(prompts, "w") as f:
        for text in ["What is 2 + 2?", "Tell me a story about", "x"]:
            f.write(json.dumps({"prompt": text}) + "\n")
    for name in ["llama_gqa"]:  # the tiny checkpoint that has a tokenizer
        episodes = {}
        for device in ["cpu", ctx.device]:
            out = ctx.grove("generate", "--model", ctx.model(name), "--input", prompts, "--greedy", "--max-new-tokens", 60,
                            "--environment", "calculator", "--environment-config", 'open_tag="2"\nclose_tag="h"',
                            "--max-turns", 4, "--json", "--device", device)
            episodes[device] = [json.loads(line) for line in out.splitlines()]
        same = all(a["completion_ids"] == b["completion_ids"] and a["env_mask"] == b["env_mask"]
                   for a, b in zip(episodes["cpu"], episodes[ctx.device]))
        figures[f"episodes_{name}_identical_to_cpu"] = same
        figures[f"episodes_{name}_model_turns"] = [e["model_turns"] for e in episodes[ctx.device]]
        if not same:
            failures.append(f"episodes {name}: the device's episodes differ from the CPU's")
    return failures


def graphs_match_the_eager_loop(ctx, figures):
    """The CUDA graph engine generates what the eager decode loop generates: 24 prompts of different
    lengths (Llama; greedy also Qwen3 and Gemma 3's sliding layer), greedy and sampled (top-k;
    repetition penalty; top-p with min-p), float32 and bf16. In
    float32 token for token. In bf16 the engine's fused kernels round differently from ATen's ops
    (the order of float sums), so a row may part from the eager loop's where two tokens are nearly
    tied; up to there their log-probabilities must agree, and where greedy rows part, the two tokens
    must be near-ties. Then the engine's options against its default, over 120 tokens (rows end at
    EOS, so the batch moves to smaller buckets; rows_ending_before_120 counts them, and the split
    needs more columns than one 64-column key tile): sampling captured in the graph
    (--capture-sampling) must change nothing; attention without the split of its columns
    (--no-split-attention) sums in another order, so it is held to the bf16 rule in both dtypes."""
    # (on the CPU every engine is the eager loop: the rehearsal checks the flags and this code)
    failures = []
    prompts = os.path.join(ctx.work, "engine-prompts.jsonl")
    with open(prompts, "w") as f:
        for text in ["What is 2 + 2?", "Tell me a story about", "x", "The capital of France is", "1 2 3 4 5 6 7 8 9",
                     "Once upon a time there", "a b", "Hello"] * 3:
            f.write(json.dumps({"prompt": text}) + "\n")

    def generate(flags, dtype, engine, tokens=40, model="llama_gqa"):
        out = ctx.grove("generate", "--model", ctx.model(model), "--input", prompts, *flags, "--max-new-tokens",
                        tokens, "--json", "--device", ctx.device, "--dtype", dtype, *engine)
        return [json.loads(line) for line in out.splitlines()]

    # Qwen3's per-head q/k norms in the engine's step, and Gemma 3's sliding layer (4 columns: masked
    # columns before visible ones, beside the left padding), greedy; the sampling modes run on llama_gqa below
    for name, model in [("qwen3", "qwen3_qknorm"), ("gemma3_window", "gemma3_window")]:
        for dtype in ["float32", "bfloat16"]:
            graphs, eager = (generate(["--greedy"], dtype, engine, model=model) for engine in [[], ["--no-cuda-graphs"]])
            key = f"{name}_graphs_vs_eager_greedy_{dtype}"
            if dtype == "float32":
                failures += rows_identical(graphs, eager, key, f"{name} graphs vs eager (greedy, float32)", figures)
            else:
                failures += rows_agree_until_they_part(graphs, eager, key, True, figures)

    modes = {"greedy": ["--greedy"], "top_k": ["--temperature", 1.3, "--top-k", 50, "--seed", 3],
             "repetition_penalty": ["--temperature", 1.0, "--repetition-penalty", 1.3, "--seed", 4],
             "top_p_min_p": ["--temperature", 1.1, "--top-p", 0.9, "--min-p", 0.05, "--seed", 5]}
    for mode, flags in modes.items():
        for dtype in ["float32", "bfloat16"]:
            graphs, eager = (generate(flags, dtype, engine) for engine in [[], ["--no-cuda-graphs"]])
            key = f"graphs_vs_eager_{mode}_{dtype}"
            if dtype == "float32":
                failures += rows_identical(graphs, eager, key, f"graphs vs eager ({mode}, {dtype})", figures)
            else:
                failures += rows_agree_until_they_part(graphs, eager, key, mode == "greedy", figures)
            # the options over 120 tokens, in which rows end at EOS and the batch moves to smaller buckets
            graphs, captured, unsplit = (generate(flags, dtype, engine, tokens=120)
                                         for engine in [[], ["--capture-sampling"], ["--no-split-attention"]])
            figures[f"rows_ending_before_120_{mode}_{dtype}"] = sum(len(r["completion_ids"]) < 120 for r in graphs)
            failures += captured_sampling_changes_nothing(captured, graphs, f"{mode}_{dtype}", figures)
            failures += rows_agree_until_they_part(unsplit, graphs, f"unsplit_vs_graphs_{mode}_{dtype}", mode == "greedy",
                                                   figures)
    return failures


def rows_identical(rows, reference, key, what, figures):
    """Two engines' rows token for token (float32, where nothing may differ)."""
    same = sum(a["completion_ids"] == b["completion_ids"] for a, b in zip(rows, reference))
    figures[f"{key}_rows_identical"] = f"{same}/{len(rows)}"
    return [] if same == len(rows) else [f"{what}: {len(rows) - same} rows differ"]


def rows_agree_until_they_part(rows, reference, key, greedy, figures):
    """Two engines' rows that may part where two tokens are nearly tied: until a row parts, its
    log-probabilities agree within BF16_ENGINE_LOGPROB_TOLERANCE; where greedy rows part, the two
    tokens' log-probabilities are that close too."""
    failures = []
    same = sum(a["completion_ids"] == b["completion_ids"] for a, b in zip(rows, reference))
    figures[f"{key}_rows_identical"] = f"{same}/{len(rows)}"
    before, where_parted, shared = 0.0, 0.0, []
    for a, b in zip(rows, reference):
        ids_a, ids_b = a["completion_ids"], b["completion_ids"]
        common = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
        shared.append(common)
        for i in range(common):
            before = max(before, abs(a["logprobs"][i] - b["logprobs"][i]))
        if common < min(len(ids_a), len(ids_b)):
            where_parted = max(where_parted, abs(a["logprobs"][common] - b["logprobs"][common]))
    figures[f"{key}_mean_tokens_before_parting"] = round(sum(shared) / len(shared), 1)
    figures[f"{key}_max_logprob_diff_before_parting"] = round(before, 4)
    if before > BF16_ENGINE_LOGPROB_TOLERANCE:
        failures.append(f"{key}: log-probs differ by {before:.4f} on shared tokens")
    if greedy:
        figures[f"{key}_max_logprob_gap_where_rows_part"] = round(where_parted, 4)
        if where_parted > BF16_ENGINE_LOGPROB_TOLERANCE:
            failures.append(f"{key}: rows part at tokens {where_parted:.4f} apart in log-prob")
    return failures


def captured_sampling_changes_nothing(captured, graphs, case, figures):
    """Sampling captured in the decode step's graph runs the same kernels on the same values as
    sampling after each replay: the same tokens, and the same log-probabilities up to 1e-5."""
    same = sum(a["completion_ids"] == b["completion_ids"] for a, b in zip(captured, graphs))
    figures[f"captured_vs_graphs_{case}_rows_identical"] = f"{same}/{len(graphs)}"
    if same != len(graphs):
        return [f"sampling captured in the graph ({case}): {len(graphs) - same} rows differ from the graph engine's"]
    gap = max((abs(x - y) for a, b in zip(captured, graphs) for x, y in zip(a["logprobs"], b["logprobs"])), default=0.0)
    figures[f"captured_vs_graphs_{case}_max_logprob_diff"] = gap
    return [f"sampling captured in the graph ({case}): log-probs differ by {gap}"] if gap > 1e-5 else []


# bf16 log-probabilities of the same tokens from the graph engine and the eager loop (different
# rounding, see graphs_match_the_eager_loop)
BF16_ENGINE_LOGPROB_TOLERANCE = 0.1


# ---------------------------------------------------------------------------------------------- training
def write_run(ctx, name, body, rows=None):
    """A run folder with 12 text prompts (and optional rollouts), its manifest returned."""
    folder = os.path.join(ctx.work, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with open(os.path.join(folder, "prompts.jsonl"), "w") as f:
        for i in range(12):
            f.write(json.dumps({"prompt": f"What is {i} + 2?"}) + "\n")
    if rows is not None:
        with open(os.path.join(folder, "rollouts.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    manifest = os.path.join(folder, "grove.toml")
    with open(manifest, "w") as f:
        f.write(f'[model]\npath = "{ctx.model("llama_gqa")}"\nchat_template = "none"\n'
                '[data]\nsource = "prompts.jsonl"\n[output]\ndir = "out"\nsave_steps = 1000\n'
                '[logging]\nlogging_steps = 1\n' + body)
    return manifest


def fixed_rollouts(groups=4, per_group=4, seed=0):
    """Groups of random completions with spread rewards, so a replayed step has work to do."""
    rng = random.Random(seed)
    rows = []
    for g in range(groups):
        prompt = [1] + [rng.randrange(4, 320) for _ in range(5 + g)]
        for _ in range(per_group):
            rows.append({"prompt_ids": prompt, "completion_ids": [rng.randrange(4, 320) for _ in range(rng.randrange(3, 9))],
                         "rewards": {"format": rng.random()}})
    return rows


def load_checkpoint(folder):
    from safetensors.torch import load_file
    tensors = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        if not path.endswith("optimizer.safetensors"):
            tensors.update({f"{os.path.basename(path)}:{k}": v.float() for k, v in load_file(path).items()})
    assert tensors, f"no weights in {folder}"
    return tensors


def max_difference(a, b):
    assert a.keys() == b.keys(), f"different tensors: {sorted(a.keys() ^ b.keys())[:5]}"
    return max((a[k] - b[k]).abs().max().item() for k in a)


def metrics(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def replay_body(adapter="", per_device=8, train=""):
    """Manifest sections for two float32 optimizer steps with KL on fixed_rollouts()."""
    return ('[generation]\nnum_generations = 4\nmax_completion_length = 8\n'
            '[[rewards]]\nplugin = "format"\nconfig = { pattern = "x", full_match = false }\n'
            f'{adapter}[loss]\nbeta = 0.04\n[train]\nper_device_train_batch_size = {per_device}\nlearning_rate = 1e-3\n'
            f'max_steps = 2\nmixed_precision = "no"\nseed = 3\n{train}[rollouts]\npath = "rollouts.jsonl"\n')


def replayed_step(ctx, name, adapter):
    """Two optimizer steps on fixed rollouts (float32, KL on) on the CPU and on this device: same update."""
    body = replay_body(adapter)
    result = {}
    for device in ["cpu", ctx.device]:
        manifest = write_run(ctx, f"{name}-{device}", body, fixed_rollouts())
        ctx.grove("train", manifest, "--set", f'model.device="{device}"', "--set", "output.save_steps=2", "--overwrite")
        out = os.path.join(os.path.dirname(manifest), "out")
        result[device] = (load_checkpoint(os.path.join(out, "checkpoint-2")), metrics(out))
    (w_cpu, m_cpu), (w_dev, m_dev) = result["cpu"], result[ctx.device]
    figures = {"max_weight_difference": float(f"{max_difference(w_cpu, w_dev):.3g}"),
               "loss_cpu": [m["loss"] for m in m_cpu], "loss_device": [m["loss"] for m in m_dev]}
    figures["max_loss_difference"] = float(f"{max(abs(a - b) for a, b in zip(figures['loss_cpu'], figures['loss_device'])):.3g}")
    assert figures["max_weight_difference"] <= 1e-4, f"{name}: weights after 2 steps differ by more than 1e-4"
    assert figures["max_loss_difference"] <= 1e-4, f"{name}: losses differ by more than 1e-4"
    return figures


def learns_in_bf16(ctx):
    """Generation on the device, bf16 autocast: the share of low token ids (a reward the model can learn) rises."""
    body = ('[generation]\nnum_generations = 8\nmax_completion_length = 6\n'
            f'[[rewards]]\nplugin = "{os.path.join(ctx.bundle, "test-plugins", "liblow_ids.so")}"\nconfig = {{ below = 64 }}\n'
            '[train]\nper_device_train_batch_size = 16\nlearning_rate = 0.02\nlr_scheduler_type = "constant"\n'
            'max_steps = 30\nseed = 3\nmixed_precision = "bf16"\n')
    manifest = write_run(ctx, "learn", body)
    ctx.grove("train", manifest, "--set", f'model.device="{ctx.device}"', "--overwrite")
    rewards = [m["reward"] for m in metrics(os.path.join(os.path.dirname(manifest), "out"))]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, f"reward did not rise by 0.3: first 5 steps {first:.3f}, last 5 {last:.3f}"
    return {"reward_first5": round(first, 3), "reward_last5": round(last, 3)}


def resume_is_exact(ctx):
    """4 steps straight, against 2 steps then a resume to 4, on the device (generation included): identical."""
    body = ('[generation]\nnum_generations = 4\nmax_completion_length = 6\n'
            '[[rewards]]\nplugin = "format"\nconfig = { pattern = "[aeiou]", full_match = false }\n'
            '[train]\nper_device_train_batch_size = 8\nlearning_rate = 0.01\nmax_steps = 4\nseed = 5\n')
    manifest = write_run(ctx, "resume", body)
    common = ["--set", f'model.device="{ctx.device}"', "--set", "output.save_steps=2"]
    ctx.grove("train", manifest, *common, "--overwrite")
    out = os.path.join(os.path.dirname(manifest), "out")
    straight = load_checkpoint(os.path.join(out, "checkpoint-4"))
    shutil.rmtree(os.path.join(out, "checkpoint-4"))
    ctx.grove("train", manifest, *common, "--resume", os.path.join(out, "checkpoint-2"))
    resumed = load_checkpoint(os.path.join(out, "checkpoint-4"))
    difference = max_difference(straight, resumed)
    assert difference == 0.0, f"resumed weights differ from the straight run's by {difference:.3g}"
    return {"max_weight_difference": difference}


def run_checks(checks):
    """A section of (name, check) pairs: each check reports on its own; the section fails if any did."""
    figures, failures = {}, []
    for name, check in checks:
        try:
            figures[name] = check()
        except Exception as e:
            figures[name] = {"error": str(e)[-1500:]}
            failures.append(name)
    if failures:
        raise CheckFailed("failed: " + ", ".join(failures), figures)
    return figures


def training(ctx):
    return run_checks([("full_step_cpu_vs_device", lambda: replayed_step(ctx, "full", "")),
                       ("lora_step_cpu_vs_device",
                        lambda: replayed_step(ctx, "lora", '[adapter]\nplugin = "lora"\nconfig = { r = 4, alpha = 8 }\n')),
                       ("bf16_autocast_learns", lambda: learns_in_bf16(ctx)),
                       ("resume_bit_exact", lambda: resume_is_exact(ctx))])


# ---------------------------------------------------------------------------------------------- distributed
def collectives(ctx):
    """test_distributed: placement rules, then every collective on Gloo (CPU, and 2 ranks sharing the GPU) and NCCL."""
    run = subprocess.run([os.path.join(ctx.bundle, "bin", "test_distributed")], capture_output=True, text=True, timeout=300)
    outcome = {}  # test name -> OK or SKIPPED, from gtest's per-test lines
    for match in re.finditer(r"^\[\s+(OK|SKIPPED)\s+\] (\w+\.\w+)", run.stdout, re.M):
        outcome[match.group(2)] = match.group(1)
    figures = {"passed": sorted(t for t, o in outcome.items() if o == "OK"),
               "skipped": sorted(t for t, o in outcome.items() if o == "SKIPPED")}
    assert run.returncode == 0, f"test_distributed exited {run.returncode}:\n{(run.stdout + run.stderr)[-2500:]}"
    if not ctx.cpu_rehearsal:
        assert "Collectives.NcclOnOneGpu" in figures["passed"], "the NCCL collectives did not run on the GPU"
    return figures


def ranks_run(ctx, name, nproc, backend, sharded=False):
    """Two replayed float32 steps on fixed rollouts with nproc ranks (per-rank batch 8 / nproc)."""
    train = f'ddp_backend = "{backend}"\nshard_optimizer_state = {str(sharded).lower()}\n'
    body = replay_body(per_device=8 // nproc, train=train)
    manifest = write_run(ctx, name, body, fixed_rollouts())
    run = subprocess.run([ctx.grove_path, "train", manifest, "--nproc", str(nproc), "--set", f'model.device="{ctx.device}"',
                          "--set", "output.save_steps=2", "--overwrite"], capture_output=True, text=True, timeout=300)
    out = os.path.join(os.path.dirname(manifest), "out")
    return run, out


def checkpoints_differ(run_a, run_b):
    """The largest weight difference between two runs' checkpoint-2, to 3 significant digits."""
    a, b = (load_checkpoint(os.path.join(run, "checkpoint-2")) for run in (run_a, run_b))
    return float(f"{max_difference(a, b):.3g}")


def ranks_match_one_process(ctx):
    """--nproc 2 (auto backend: Gloo when the ranks share one GPU, NCCL with a GPU each) against one process;
    with the optimizer state sharded (ZeRO stage 1), the unsharded two ranks' weights exactly."""
    one, one_out = ranks_run(ctx, "ranks1", 1, "auto")
    two, two_out = ranks_run(ctx, "ranks2", 2, "auto")
    sharded, sharded_out = ranks_run(ctx, "ranks2sharded", 2, "auto", sharded=True)
    for run in (one, two, sharded):
        assert run.returncode == 0, f"grove train exited {run.returncode}:\n{run.stderr[-2500:]}"
    used = [l for l in two.stderr.splitlines() if "processes over" in l]
    figures = {"backend_line": used[0].rsplit(", ", 1)[-1] if used else None,
               "max_weight_difference": checkpoints_differ(one_out, two_out),
               "loss_one_process": [m["loss"] for m in metrics(one_out)], "loss_two_ranks": [m["loss"] for m in metrics(two_out)]}
    figures["sharded_max_weight_difference"] = checkpoints_differ(two_out, sharded_out)
    assert figures["backend_line"], "grove did not say which backend its ranks use"
    assert figures["sharded_max_weight_difference"] == 0.0, "the sharded optimizer's update differs from the unsharded"
    assert figures["max_weight_difference"] <= 1e-5, "2 ranks' weights after 2 steps differ from one process's by more than 1e-5"
    return figures


def nccl_two_ranks(ctx):
    """NCCL with 2 ranks: the same update as one process when there are 2 GPUs; refused, with the reason, on one."""
    gpus = torch.cuda.device_count() if ctx.device == "cuda" else 0
    run, out = ranks_run(ctx, "nccl2", 2, "nccl")
    figures = {"gpus": gpus, "exit": run.returncode}
    if gpus >= 2:
        assert run.returncode == 0, f"grove train over NCCL exited {run.returncode}:\n{run.stderr[-2500:]}"
        one, one_out = ranks_run(ctx, "nccl1", 1, "auto")
        figures["max_weight_difference"] = checkpoints_differ(one_out, out)
        assert figures["max_weight_difference"] <= 1e-5, "NCCL ranks differ from one process by more than 1e-5"
    else:  # NCCL refuses two ranks on one device; Grove must say so (on the CPU, before any rank starts)
        expected = "one GPU per process" if gpus == 1 else "runs between GPUs"
        figures["refusal"] = next((line for line in run.stderr.splitlines() if expected in line), "")
        assert run.returncode != 0 and expected in run.stderr, f"expected a refusal naming '{expected}':\n{run.stderr[-2500:]}"
    return figures


def distributed(ctx):
    return run_checks([("collectives", lambda: collectives(ctx)),
                       ("two_ranks_equal_one_process", lambda: ranks_match_one_process(ctx)),
                       ("nccl_two_ranks", lambda: nccl_two_ranks(ctx))])


# ---------------------------------------------------------------------------------------------- measurement
def bench(ctx, script, *args, timeout=240):
    run = subprocess.run([sys.executable, os.path.join(ctx.bundle, script), *map(str, args)], capture_output=True,
                         text=True, timeout=timeout)
    if run.returncode != 0:
        raise AssertionError(f"{script} {' '.join(map(str, args))} exited {run.returncode}:\n{run.stderr[-2500:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def generation(ctx, bandwidth):
    grove_bench = os.path.join(ctx.bundle, "bin", "grove_bench_generate")
    if ctx.cpu_rehearsal:  # the same path at a shape a CPU finishes in seconds
        cases = [("tiny", 4, "float32")]
    else:
        cases = [(shape, batch, "bfloat16") for shape in RANDOM_SHAPES for batch in (64, 512)]
    figures = {}
    for shape, batch, dtype in cases:
        # the default engine, and beside it the one it replaced on 2026-11-27 (a GEMM per linear, one
        # attention block per KV head and row), so the report says what the change gained
        r = bench(ctx, "generate.py", "--shape", shape, "--batch", batch, "--dtype", dtype, "--device", ctx.device,
                  "--new-tokens", 128, "--repeats", 2, "--grove", grove_bench, "--also-engine", "unfused+unsplit")
        if bandwidth:
            # the fastest a decode step can be: its bytes at the measured copy speed
            step_bytes = r["weight_bytes"] + r["kv_bytes_per_step_mean"]
            roofline = batch / (step_bytes / bandwidth)
            r["roofline_tokens_per_second"] = round(roofline)
            r["grove_share_of_roofline"] = round(max(r["grove_tokens_per_second"]) / roofline, 3)
            r["also_engine_share_of_roofline"] = round(max(r["also_engine_tokens_per_second"]) / roofline, 3)
        figures[f"{shape}_batch{batch}_{dtype}"] = r
    return figures


def step(ctx):
    """A GRPO step, Grove against TRL (bench/step.py): 8 prompts x 8 completions of up to 128 tokens on a GPU."""
    if ctx.cpu_rehearsal:
        cases, sizes = ["tiny"], ["--steps", 3]
    else:
        cases, sizes = list(RANDOM_SHAPES), ["--steps", 5, "--prompts", 8, "--max-completion", 128]
    return {shape: bench(ctx, "step.py", "--shape", shape, *sizes, "--device", ctx.device, "--grove", ctx.grove_path)
            for shape in cases}


def bundle_module(ctx, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ctx.bundle, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trace(ctx):
    """Where a decode step's time goes: one timed generation (prompts of 32, 128 new tokens, the
    default engine) under the profiler (GROVE_BENCH_TRACE) at Qwen2.5-0.5B's shape in bf16, batch 64
    and 512; per decode step the span, the GPU's busy and idle time, and the kernels by total time."""
    from transformers import AutoModelForCausalLM
    shapes, summary = bundle_module(ctx, "generate"), bundle_module(ctx, "trace_kernels").kernel_summary
    cases = [("tiny", 4, "float32")] if ctx.cpu_rehearsal else [("qwen2.5-0.5b", b, "bfloat16") for b in (64, 512)]
    figures, new_tokens = {}, 128
    for shape, batch, dtype in cases:
        folder = tempfile.mkdtemp(dir=ctx.work)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(shapes.model_config(shape)).save_pretrained(folder)
        trace_file = os.path.join(folder, "trace.json")
        run = subprocess.run([os.path.join(ctx.bundle, "bin", "grove_bench_generate"), folder, str(batch), "32",
                              str(new_tokens), dtype, ctx.device], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, GROVE_BENCH_TRACE=trace_file))
        if run.returncode != 0:
            raise AssertionError(f"grove_bench_generate exited {run.returncode}:\n{run.stderr[-2500:]}")
        r = summary(trace_file, 12)
        per_step = {"span_ms": r["span_ms"] / new_tokens, "busy_ms": r["busy_ms"] / new_tokens,
                    "idle_ms": (r["span_ms"] - r["busy_ms"]) / new_tokens, "kernels": r["kernels"] / new_tokens}
        figures[f"{shape}_batch{batch}_{dtype}"] = {
            "tokens_per_second": json.loads(run.stdout.strip().splitlines()[-1])["tokens_per_second"],
            "per_decode_step": {k: round(v, 3) for k, v in per_step.items()}, "top_kernels": r["top"]}
    return figures


# ---------------------------------------------------------------------------------------------- report
def write_report(out, results, ctx):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"device": ctx.device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "sections": results}, f,
                  indent=1)
    lines = [f"# Grove device report ({ctx.device}, {time.strftime('%Y-%m-%d', time.gmtime())})", ""]
    for name, r in results.items():
        lines += [f"## {name}: {r['status']} ({r['seconds']} s)", ""]
        if r.get("error"):
            lines += ["```", r["error"], "```", ""]
        lines += ["```json", json.dumps(r.get("figures", {}), indent=1), "```", ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU")
    parser.add_argument("--out", default=os.environ.get("OUT") or "device-report")
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--skip", default="")
    args = parser.parse_args()
    ctx = Context(args)
    chosen = [s for s in args.only.split(",") if s and s not in args.skip.split(",")]
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        sys.exit(f"check.py: unknown section(s) {sorted(unknown)}; sections are {SECTIONS}")
    results, bandwidth = {}, None
    for name in chosen:
        start = time.time()
        print(f"== {name}", flush=True)
        try:
            if name == "generation":
                figures = generation(ctx, bandwidth)
            else:
                figures = globals()[name](ctx)
            if name == "environment":
                bandwidth = figures.get("copy_bandwidth_gb_s", 0) * 1e9 or None
            results[name] = {"status": "pass", "figures": figures}
        except Exception as e:
            results[name] = {"status": "FAIL", "error": f"{e}\n{traceback.format_exc()[-1500:]}",
                             "figures": getattr(e, "figures", {})}
        results[name]["seconds"] = round(time.time() - start, 1)
        print(json.dumps(results[name], indent=1)[:4000], flush=True)
        write_report(args.out, results, ctx)  # after every section: a timeout still leaves a report
    failed = [n for n, r in results.items() if r["status"] != "pass"]
    print(f"report: {os.path.join(args.out, 'report.md')}; " + (f"FAILED: {failed}" if failed else "all passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
