"""Generation throughput, Grove vs transformers, same model, machine, batch and lengths, one run.

    .venv/bin/python bench/generate.py [--batch 16] [--prompt-len 32] [--new-tokens 128] [--dtype float32]
                                       [--device cpu]
                                       [--shape smollm2-135m|qwen2.5-0.5b|qwen3-0.6b|gemma3-270m|gemma3-1b|
                                                qwen3-moe-mini|gemma2-mini|tiny]
                                       [--repeats 3]

Builds a randomly initialised checkpoint of the chosen shape (SmolLM2-135M's by default: 30 layers,
hidden 576, 9 heads / 3 KV heads, vocabulary 49152, tied embeddings; Qwen2.5-0.5B's: 24 layers, hidden
896, 14 heads / 2 KV heads, q/k/v biases, vocabulary 151936, tied; Qwen3-0.6B's: 28 layers, hidden 1024,
16 heads / 8 KV heads of 128, q/k norms, vocabulary 151936, tied; Gemma 3 1B's: 26 layers, hidden 1152,
4 heads / 1 KV head of 256, four norms per layer, GeGLU, 5 of every 6 layers sliding over 512 tokens,
vocabulary 262144, tied; Gemma 3 270M's: 18 layers, hidden 640, otherwise as 1B's; qwen3-moe-mini:
Qwen3-30B-A3B's proportions on 8 layers of 64 experts of 384, 8 per token, hidden 1024; gemma2-mini:
Gemma 2 2B's layers on 6 of its 26, hidden 2304, 8 heads / 4 KV heads of 256, attention scores capped
at 50 and logits at 30, every other layer sliding over 4096 tokens, vocabulary 256000, tied), then times
transformers' generate (sampling, KV cache, min_new_tokens = max_new_tokens so no row stops early)
and build/bin/grove_bench_generate on the same prompts' shape, alternately, --repeats times. Prints
tokens/s for both in each pair, the pairs' ratios and their median; on CUDA also both sides' peak
allocated memory (the caching allocator's, as torch.cuda.max_memory_allocated counts it) and the bytes
one decode step must read at least (weights once, plus the KV cache), for a roofline.
"""
import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

SHAPES = {
    "smollm2-135m": dict(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192, rms_norm_eps=1e-5),
    "qwen2.5-0.5b": dict(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                         rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen3-0.6b": dict(family="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       rope_theta=1000000.0, max_position_embeddings=40960, rms_norm_eps=1e-6),
    "gemma3-270m": dict(family="gemma3", vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                        sliding_window=512, sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6),
    "gemma3-1b": dict(family="gemma3", vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                      sliding_window=512, sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                      tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6),
    # no released Qwen3-MoE fits this machine (the smallest, Qwen3-30B-A3B, has 48 layers of 128
    # experts): its proportions on fewer layers and experts, each token through 8 experts of 384
    "qwen3-moe-mini": dict(family="qwen3_moe", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                           moe_intermediate_size=384, num_experts=64, num_experts_per_tok=8, norm_topk_prob=True,
                           num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                           tie_word_embeddings=False, rope_theta=1000000.0, max_position_embeddings=40960,
                           rms_norm_eps=1e-6),
    # Gemma 2 2B's layers (2.6B parameters do not train in float32 on this machine's 24 GB), 6 of 26
    "gemma2-mini": dict(family="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=6,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                        sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                        tie_word_embeddings=True, max_position_embeddings=8192, rms_norm_eps=1e-6),
    "tiny": dict(family="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=1024),
}


def model_config(name):
    shape = dict(SHAPES[name])
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config,
                    "gemma2": Gemma2Config, "gemma3": Gemma3TextConfig, "qwen3_moe": Qwen3MoeConfig}[shape.pop("family")]
    return config_class(**shape, bos_token_id=1, eos_token_id=2)


def peer_attention(config):
    """transformers' attention for the peer: eager for Gemma 2, whose SDPA leaves out the soft-capping
    Grove computes (so both sides compute the same model), its default otherwise."""
    return "eager" if getattr(config, "attn_logit_softcapping", None) else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    engine_help = ("Grove's decode engine on CUDA: graphs (the default), eager, or the graph engine with changes "
                   "joined by '+': captured (sampling in the graph), unsplit (no split attention), unfused (a GEMM "
                   "per linear)")
    parser.add_argument("--engine", default="graphs", help=engine_help)
    parser.add_argument("--also-engine", help="a second engine timed in each pair too (reported as also_engine_*)")
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--repeats", type=int, default=3, help="transformers / Grove pairs, run alternately")
    parser.add_argument("--grove", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin",
                                                       "grove_bench_generate"))
    args = parser.parse_args()

    torch.manual_seed(0)
    folder = tempfile.mkdtemp(prefix="grove-bench-")
    atexit.register(shutil.rmtree, folder, True)  # a random checkpoint of gigabytes
    config = model_config(args.shape)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=peer_attention(config)).eval()
    model.save_pretrained(folder)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = model.to(args.device, dtype)

    ids = torch.randint(4, config.vocab_size, (args.batch, args.prompt_len), device=args.device)
    with torch.no_grad():
        # warm-up at the timed batch size: the first call at a new size pays for kernel and allocator set-up
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=8,
                       min_new_tokens=8, pad_token_id=0, eos_token_id=None)

    def transformers_tokens_per_second():
        with torch.no_grad():
            if args.device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 top_k=0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 pad_token_id=0, eos_token_id=None)
            if args.device != "cpu":
                torch.cuda.synchronize()
            return (out.shape[1] - args.prompt_len) * args.batch / (time.perf_counter() - start)

    def grove_tokens_per_second(engine):
        result = subprocess.run([args.grove, folder, str(args.batch), str(args.prompt_len), str(args.new_tokens),
                                 args.dtype, args.device, engine], capture_output=True, text=True, check=True)
        return json.loads(result.stdout)

    # the two alternate, so a slow spell of a shared machine falls on both; each pair gives a ratio
    on_gpu = args.device != "cpu"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    pairs, grove_peaks, also = [], [], []
    for _ in range(args.repeats):
        hf = transformers_tokens_per_second()
        grove = grove_tokens_per_second(args.engine)
        pairs.append((hf, grove["tokens_per_second"]))
        grove_peaks.append(grove.get("peak_allocated_mib", 0.0))
        if args.also_engine:
            also.append(grove_tokens_per_second(args.also_engine)["tokens_per_second"])
    ratios = [g / h for h, g in pairs]
    if args.also_engine:
        also = {"also_engine": args.also_engine, "also_engine_tokens_per_second": [round(g, 1) for g in also],
                "also_engine_ratios": [round(g / h, 2) for (h, _), g in zip(pairs, also)]}
    memory = {}
    if on_gpu:
        element = 2 if args.dtype == "bfloat16" else 4
        head_dim = config.hidden_size // config.num_attention_heads
        mean_context = args.prompt_len + args.new_tokens / 2
        memory = {"transformers_peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20),
                  "grove_peak_allocated_mib": round(max(grove_peaks)),
                  # one decode step reads every weight once (a tied table once, as the output layer) and
                  # each row's keys and values; the embedding lookup reads only B rows
                  "weight_bytes": sum(p.numel() for p in model.parameters()) * element,
                  "kv_bytes_per_step_mean": round(args.batch * config.num_hidden_layers * 2 * config.num_key_value_heads
                                                  * head_dim * mean_context * element)}
    print(json.dumps({"shape": args.shape, "batch": args.batch, "prompt_len": args.prompt_len,
                      "new_tokens": args.new_tokens, "dtype": args.dtype, "device": args.device, "grove_engine": args.engine,
                      "torch_threads": torch.get_num_threads(),
                      "transformers_tokens_per_second": [round(h, 1) for h, _ in pairs],
                      "grove_tokens_per_second": [round(g, 1) for _, g in pairs],
                      "ratios": [round(r, 2) for r in ratios],
                      "median_ratio": round(statistics.median(ratios), 2), **(also or {}), **memory}))


if __name__ == "__main__":
    main()
