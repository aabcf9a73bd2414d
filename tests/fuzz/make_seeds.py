"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): small valid inputs of each
format, made by the reference implementations (safetensors, gguf, tokenizers) where one exists, so
the fuzzers start from what real files look like.

    .venv/bin/python tests/fuzz/make_seeds.py
"""
import glob
import json
import os
import shutil

import gguf
import numpy as np
from safetensors.numpy import save
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")
rng = np.random.default_rng(0)


def write(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def tiny_tokenizer(vocab_size=300):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["What is 37 + 48? The answer is 85.", "Hello world, hello there."] * 20,
                            trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                                        "<|im_end|>"],
                                                show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def safetensors_seeds():
    write("safetensors", "f32_and_bf16", save({"a": rng.standard_normal((2, 3)).astype(np.float32),
                                               "b": np.arange(4, dtype=np.int64)}, metadata={"format": "pt"}))
    write("safetensors", "empty_tensor", save({"e": np.zeros((0, 4), np.float16), "s": np.ones((), np.uint8)}))


def write_tiny_llama_gguf(path, metadata=None, shapes=None, skip=()):
    """A Llama of width 32 (a Q8_0 row is 32 values) with every key and tensor the converter reads.
    metadata: {key: (value, GGUFValueType)} added or replacing; shapes: {tensor: shape} replacing;
    skip: keys and tensors left out. The bad-input catalogue (tests/bad_inputs) damages it this way."""
    tok = tiny_tokenizer(270)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    hidden, ff, heads, kv_heads, n = 32, 32, 2, 1, len(tokens)
    T = gguf.GGUFValueType
    keys = {"llama.context_length": (64, T.UINT32), "llama.embedding_length": (hidden, T.UINT32),
            "llama.feed_forward_length": (ff, T.UINT32), "llama.block_count": (1, T.UINT32),
            "llama.attention.head_count": (heads, T.UINT32), "llama.attention.head_count_kv": (kv_heads, T.UINT32),
            "llama.attention.layer_norm_rms_epsilon": (1e-5, T.FLOAT32), "llama.rope.freq_base": (10000.0, T.FLOAT32),
            "tokenizer.ggml.model": ("gpt2", T.STRING), "tokenizer.ggml.pre": ("smollm", T.STRING),
            "tokenizer.ggml.tokens": (tokens, T.ARRAY), "tokenizer.ggml.token_type": ([1] * n, T.ARRAY),
            "tokenizer.ggml.merges": (merges, T.ARRAY), "tokenizer.ggml.bos_token_id": (0, T.UINT32),
            "tokenizer.ggml.eos_token_id": (0, T.UINT32)}
    keys.update(metadata or {})
    w = gguf.GGUFWriter(path, "llama")
    for key, (value, kind) in keys.items():
        if key not in skip:
            w.add_key_value(key, value, kind, sub_type=T.STRING if kind == T.ARRAY and isinstance(value[0], str) else
                            (T.INT32 if kind == T.ARRAY else None))
    head = hidden // heads
    tensor_shapes = {"token_embd.weight": (n, hidden), "output_norm.weight": (hidden,), "output.weight": (n, hidden),
                     "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
                     "blk.0.attn_q.weight": (hidden, hidden), "blk.0.attn_k.weight": (kv_heads * head, hidden),
                     "blk.0.attn_v.weight": (kv_heads * head, hidden), "blk.0.attn_output.weight": (hidden, hidden),
                     "blk.0.ffn_gate.weight": (ff, hidden), "blk.0.ffn_up.weight": (ff, hidden),
                     "blk.0.ffn_down.weight": (hidden, ff)}
    tensor_shapes.update(shapes or {})
    for name, shape in tensor_shapes.items():
        if name in skip:
            continue
        t = rng.standard_normal(shape).astype(np.float32)
        if name == "blk.0.ffn_up.weight" and shape[-1] % 32 == 0:  # one quantized tensor reaches the dequantizers
            w.add_tensor(name, gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, t.astype(np.float16) if len(shape) == 2 else t)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def gguf_seeds():
    path = os.path.join(CORPUS, "tiny.gguf")
    write_tiny_llama_gguf(path)
    with open(path, "rb") as f:
        write("gguf", "tiny_llama", f.read())
    os.remove(path)


def tokenizer_seeds():
    tok = tiny_tokenizer()
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{% endfor %}"}
    write("tokenizer", "byte_level_bpe", tok.to_str())
    write("tokenizer", "byte_level_bpe_with_config", tok.to_str() + "\0" + json.dumps(config))
    # made by tests/core/text/make_tokenizers.py when present
    for family in ("llama3_style", "qwen2_style", "sp_json_legacy", "sp_json_metaspace_first"):
        for f in glob.glob(os.path.join(ROOT, "build/tests/tokenizers/generated", family, "tokenizer.json")):
            shutil.copy(f, os.path.join(CORPUS, "tokenizer", family))


def manifest_seeds():
    for path in sorted(glob.glob(os.path.join(ROOT, "examples/*/grove.toml"))):
        with open(path) as f:
            text = f.read()
        write("manifest", os.path.basename(os.path.dirname(path)), text)
    write("manifest", "with_overrides", "[model]\npath = \"m\"\n\0training.learning_rate=1e-5\0generation.num_generations=4")


def jsonl_seeds():
    rows = [{"prompt": "What is 2+2?", "answer": "4"},
            {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "solution": "x"}]
    write("jsonl", "prompts", "".join(json.dumps(r) + "\n" for r in rows))
    rollouts = [{"prompt_ids": [72, 105], "completion_ids": [52, 256], "sampling_logprobs": [-0.5, -1.0],
                 "rewards": {"accuracy": 1.0}},
                {"prompt_ids": [72, 105], "completion_ids": [53], "env_mask": [1], "rewards": {"accuracy": None}},
                {"prompt": "Hi", "completion_ids": [1, 2, 3]}, {"prompt": "Hi", "completion_ids": [4]}]
    write("jsonl", "rollouts", "".join(json.dumps(r) + "\n" for r in rollouts))


def chat_template_seeds():
    conversation = [{"role": "system", "content": "You add."}, {"role": "user", "content": "2+2?"},
                    {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]
    tools = [{"type": "function", "function": {"name": "multiply", "description": "a*b",
              "parameters": {"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]}}}]
    write("chat_template", "conversation", json.dumps(conversation))
    write("chat_template", "with_tools", json.dumps(conversation[1:2]) + "\0" + json.dumps(tools))


if __name__ == "__main__":
    shutil.rmtree(CORPUS, ignore_errors=True)
    for make in (safetensors_seeds, gguf_seeds, tokenizer_seeds, manifest_seeds, jsonl_seeds, chat_template_seeds):
        make()
    for target in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, target))
        size = sum(os.path.getsize(os.path.join(CORPUS, target, f)) for f in files)
        print(f"{target}: {len(files)} seeds, {size} bytes")
