"""Generation throughput, Grove vs transformers, same model, machine, batch and lengths, one run.

    .venv/bin/python bench/generate.py [--batch 16] [--prompt-len 32] [--new-tokens 128] [--dtype float32]
                                       [--device cpu] [--shape smollm2-135m|tiny] [--repeats 3]

Builds a randomly initialised checkpoint of the chosen shape (SmolLM2-135M's by default: 30 layers,
hidden 576, 9 heads / 3 KV heads, vocabulary 49152, tied embeddings), then times
transformers' generate (sampling, KV cache, min_new_tokens = max_new_tokens so no row stops early)
and build/bin/grove_bench_generate on the same prompts' shape, alternately, --repeats times. Prints
tokens/s for both in each pair, the pairs' ratios and their median.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192, rms_norm_eps=1e-5),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=1024),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--repeats", type=int, default=3, help="transformers / Grove pairs, run alternately")
    parser.add_argument("--grove", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin",
                                                       "grove_bench_generate"))
    args = parser.parse_args()

    torch.manual_seed(0)
    folder = tempfile.mkdtemp(prefix="grove-bench-")
    config = LlamaConfig(**SHAPES[args.shape], bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = model.to(args.device, dtype)

    ids = torch.randint(4, config.vocab_size, (args.batch, args.prompt_len), device=args.device)
    with torch.no_grad():
        model.generate(input_ids=ids[:1], attention_mask=torch.ones_like(ids[:1]), do_sample=True, max_new_tokens=2,
                       pad_token_id=0)  # warm-up

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

    def grove_tokens_per_second():
        result = subprocess.run([args.grove, folder, str(args.batch), str(args.prompt_len), str(args.new_tokens),
                                 args.dtype, args.device], capture_output=True, text=True, check=True)
        return json.loads(result.stdout)["tokens_per_second"]

    # the two alternate, so a slow spell of a shared machine falls on both; each pair gives a ratio
    pairs = []
    for _ in range(args.repeats):
        hf = transformers_tokens_per_second()
        pairs.append((hf, grove_tokens_per_second()))
    ratios = [g / h for h, g in pairs]
    print(json.dumps({"shape": args.shape, "batch": args.batch, "prompt_len": args.prompt_len,
                      "new_tokens": args.new_tokens, "dtype": args.dtype, "device": args.device,
                      "torch_threads": torch.get_num_threads(),
                      "transformers_tokens_per_second": [round(h, 1) for h, _ in pairs],
                      "grove_tokens_per_second": [round(g, 1) for _, g in pairs],
                      "ratios": [round(r, 2) for r in ratios],
                      "median_ratio": round(statistics.median(ratios), 2)}))


if __name__ == "__main__":
    main()
