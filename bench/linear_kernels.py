"""Where the 135M-shape decode step's matrix time goes: torch's plain F.linear vs oneDNN's pre-packed
linear (what Grove's generate() used for large weights before its own decode kernels), on this
machine, one run.

    .venv/bin/python bench/linear_kernels.py [--batch 16]

Part 1 times one decode step's worth of products with SmolLM2-135M's 211 distinct weight matrices
(30 layers x q, k, v, o, gate, up, down, plus the 49152-word head), each streamed from memory as in the
real model. Part 2 times single products with the weight hot in cache, to show the per-call cost that
makes packing lose on small weights.
"""
import argparse
import json
import time

import torch

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def per_call_ms(fn, repeats):
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    B = args.batch
    pack = lambda w: torch.ops.mkldnn._reorder_linear_weight(w, B)
    packed_linear = lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    with torch.no_grad():
        layers = [[torch.randn(o, i) * 0.02 for o, i in LAYER] for _ in range(30)]
        head = torch.randn(49152, 576) * 0.02
        x, y = torch.randn(B, 576), torch.randn(B, 1536)

        def step(weights, head_weight, linear, inner):
            for layer in weights:
                for w, i in layer:
                    linear(y if i == 1536 else x, w)
            linear(x, head_weight)

        plain = [[(w, w.shape[1]) for w in layer] for layer in layers]
        packed = [[(pack(w), w.shape[1]) for w in layer] for layer in layers]
        packed_head = pack(head)
        result = {"batch": B, "torch_threads": torch.get_num_threads(),
                  "decode_step_ms_plain": round(per_call_ms(lambda: step(plain, head, torch.nn.functional.linear, 1), 10), 1),
                  "decode_step_ms_packed": round(per_call_ms(lambda: step(packed, packed_head, packed_linear, 1), 10), 1),
                  "single_product_us": {}}
        for o, i in [(64, 64), (192, 64), (576, 576), (1536, 576), (49152, 576)]:
            w, v = torch.randn(o, i), torch.randn(B, 1, i)
            pw = pack(w)
            repeats = 20 if o * i > 10**7 else 500
            result["single_product_us"][f"{o}x{i}"] = {
                "plain": round(per_call_ms(lambda: torch.nn.functional.linear(v, w), repeats) * 1e3, 1),
                "packed": round(per_call_ms(lambda: packed_linear(v, pw), repeats) * 1e3, 1)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
