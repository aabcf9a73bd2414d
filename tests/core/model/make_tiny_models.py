"""Creates tiny random Hugging Face checkpoints with transformers and the reference outputs Grove's
model tests compare against (logits, greedy generation, log-probabilities). Everything here is
computed by transformers, never by Grove.

    .venv/bin/python tests/core/model/make_tiny_models.py OUT_DIR
"""
import contextlib
import copy
import datetime
import json
import os
import subprocess
import sys
import tempfile

import torch
import trl
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from trl.data_utils import apply_chat_template
from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, Gemma2Config, Gemma3Config,
                          Gemma3TextConfig, LlamaConfig, MistralConfig, MixtralConfig, Olmo2Config, Olmo3Config, OlmoeConfig,
                          Phi3Config, Qwen2Config, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig, SmolLM3Config)

OUT = sys.argv[1]
COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
              max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    # grouped-query attention, untied head
    "llama_gqa": LlamaConfig(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                             rope_theta=10000.0, **COMMON),
    # Llama 3 rope scaling, one KV head (multi-query), several EOS ids
    "llama3_rope": LlamaConfig(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                               rope_theta=500000.0,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                               **{**COMMON, "eos_token_id": [2, 3]}),
    # Qwen2: q/k/v biases, tied embeddings
    "qwen2_tied": Qwen2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                              rope_theta=1000000.0, use_sliding_window=False, **COMMON),
    # Qwen3: q_norm / k_norm on each head, head_dim (24) not hidden_size / heads (16), o_proj bias
    "qwen3_qknorm": Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=24, attention_bias=True,
                                tie_word_embeddings=True, rope_theta=1000000.0, use_sliding_window=False, **COMMON),
    # Mistral: plain multi-head attention
    "mistral_mha": MistralConfig(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                 sliding_window=None, **COMMON),
    # Phi-3.5 style: fused qkv_proj and gate_up_proj, longrope (short factors below
    # original_max_position_embeddings, cos and sin scaled by sqrt(1 + ln 4 / ln 64)), a sliding window
    # longer than any sequence here
    "phi3_longrope": Phi3Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                pad_token_id=0, sliding_window=96, original_max_position_embeddings=64,
                                rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                                              "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]},
                                **COMMON),
    # Phi-4-mini style: a partial rotary embedding (12 of each head's 16 dimensions), tied embeddings
    "phi3_partial": Phi3Config(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True, pad_token_id=0,
                               partial_rotary_factor=0.75, sliding_window=None, rope_theta=250000.0, **COMMON),
    # Mistral v0.1 style: a sliding window (each query sees itself and 3 tokens before it) shorter than
    # the sequences here; linear rotary scaling
    "mistral_window": MistralConfig(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                    sliding_window=4, rope_scaling={"rope_type": "linear", "factor": 2.0}, **COMMON),
    # Qwen2 with use_sliding_window: a window of 3 on layer 1 only (from max_window_layers = 1 on); yarn
    # as Qwen2.5's long-context configs set it (factor 4 over the original length)
    "qwen2_window": Qwen2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                rope_theta=1000000.0, use_sliding_window=True, sliding_window=3, max_window_layers=1,
                                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
                                **COMMON),
    # SmolLM3: layer 1 is NoPE (no rotary embedding: every 2nd layer here, every 4th in SmolLM3-3B),
    # and under use_sliding_window SmolLM3's rule puts the window (4) on the NoPE layers
    "smollm3_nope": SmolLM3Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                  pad_token_id=0, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=4,
                                  **COMMON),
    # Gemma 3's text model: (1 + w) norms, four per layer, q/k norms, GeGLU, embeddings scaled by
    # sqrt(hidden_size 48), one KV head (as gemma-3-1b), head_dim 24 and queries scaled by
    # query_pre_attn_scalar 20 (neither hidden_size / heads); layer 0 slides (window 4) and rotates
    # with the local base, layer 1 sees everything and rotates with rope_theta under linear scaling
    # (as gemma-3-4b's global layers)
    "gemma3_window": Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=24, query_pre_attn_scalar=20,
                                      tie_word_embeddings=True, pad_token_id=0, sliding_window=4, sliding_window_pattern=2,
                                      rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                      rope_scaling={"rope_type": "linear", "factor": 8.0},
                                      # Gemma's ids; sqrt(48) rounds in bfloat16, as sqrt(1152) does for gemma-3-1b
                                      **{**COMMON, "bos_token_id": 2, "eos_token_id": 1, "hidden_size": 48}),
    # Gemma 2: Gemma 3's norms, GeGLU, embedding scale and query scale (query_pre_attn_scalar 20),
    # without q/k norms; the attention scores soft-capped at 1 and the final logits at 2 (gemma-2's 50
    # and 30 cap scores of its own scale; these caps are small enough to bend this model's), layer 0
    # sliding (window 4) as Gemma2Config's rule has it
    "gemma2_softcap": Gemma2Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=20,
                                   attn_logit_softcapping=1.0, final_logit_softcapping=2.0, sliding_window=4,
                                   tie_word_embeddings=True, pad_token_id=0,
                                   **{**COMMON, "bos_token_id": 2, "eos_token_id": 1}),
    # Gemma 3 4B and larger: the text model (as above, global layer first) under text_config beside a
    # vision tower and projector, which Grove keeps as they are
    "gemma3_vision": Gemma3Config(
        text_config=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                         sliding_window=4, layer_types=["full_attention", "sliding_attention"],
                         rope_scaling={"rope_type": "linear", "factor": 8.0}, pad_token_id=0,
                         **{**COMMON, "bos_token_id": 2, "eos_token_id": 1}),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                           patch_size=8),
        mm_tokens_per_image=4, boi_token_index=300, eoi_token_index=301, image_token_index=302, eos_token_id=[1, 319]),
    # OLMo 2: no norm before the attention or the MLP, a norm after each (before the residual add), q
    # and k normed over the whole projection, every norm scaled in float32 before the cast
    "olmo2_post_norm": Olmo2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                   pad_token_id=0, **COMMON),
    # OLMo 3: OLMo 2's layers, layer 0 sliding (window 4) and rotating without scaling, layer 1 seeing
    # everything under yarn (as OLMo 3's long-context configs scale their full layers)
    "olmo3_window": Olmo3Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                pad_token_id=0, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
                                **COMMON),
    # Qwen3-MoE: layer 0 routes each token to 2 of 8 experts (their probabilities renormalized, as
    # Qwen3-30B-A3B's norm_topk_prob), layer 1 is dense (mlp_only_layers); Qwen3's q/k norms
    "qwen3_moe_experts": Qwen3MoeConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                                        num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
                                        mlp_only_layers=[1], tie_word_embeddings=False, use_sliding_window=False,
                                        **COMMON),
    # Mixtral: every layer routes each token to 2 of 4 experts (w1, w3, w2), a sliding window of 4
    "mixtral_experts": MixtralConfig(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, sliding_window=4, tie_word_embeddings=False,
                                     **{**COMMON, "intermediate_size": 48}),
    # OLMoE: Llama's norms before the attention and the MLP, q and k normed over the whole projection,
    # every layer routing each token to 2 of 4 experts without renormalizing (OLMoE-1B-7B's 8 of 64)
    "olmoe_experts": OlmoeConfig(num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                 norm_topk_prob=False, tie_word_embeddings=False, pad_token_id=0,
                                 **{**COMMON, "intermediate_size": 48}),
    # Qwen2-MoE: q/k/v biases; layer 1 sparse (decoder_sparse_step 2), routing each token to 2 of 4
    # experts plus a shared expert scaled by its sigmoid gate; layer 0 dense
    "qwen2_moe_shared": Qwen2MoeConfig(num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                       moe_intermediate_size=32, shared_expert_intermediate_size=48, decoder_sparse_step=2,
                                       norm_topk_prob=False, tie_word_embeddings=False, use_sliding_window=False, **COMMON),
}


# What leaving out a mechanism would change: the config edits that turn it off, per checkpoint. The
# script prints how far transformers' logits then move, which docs/models.md quotes; the tests'
# tolerance is 1e-4.
WITHOUT = {
    "mistral_window": {"the window": {"sliding_window": None}, "linear scaling": {"rope_scaling": None}},
    "qwen2_window": {"the window": {"layer_types": ["full_attention"] * 2}, "yarn": {"rope_scaling": None}},
    "smollm3_nope": {"the window": {"layer_types": ["full_attention"] * 2}, "NoPE": {"no_rope_layers": [1, 1]}},
    "olmo3_window": {"the window": {"sliding_window": 256}, "yarn on the full layer": {"rope_scaling": None}},
    "qwen3_moe_experts": {"renormalized top-2": {"norm_topk_prob": False}, "the second expert": {"num_experts_per_tok": 1}},
    "mixtral_experts": {"the second expert": {"num_experts_per_tok": 1}, "the window": {"sliding_window": None}},
    "olmoe_experts": {"the second expert": {"num_experts_per_tok": 1}, "unrenormalized top-2": {"norm_topk_prob": True}},
    "qwen2_moe_shared": {"the second expert": {"num_experts_per_tok": 1}},
    "gemma2_softcap": {"the attention's soft-capping": {"attn_logit_softcapping": None},
                       "the final soft-capping": {"final_logit_softcapping": None}, "the window": {"sliding_window": 256}},
    "gemma3_window": {"the window": {"sliding_window": 256}, "the local rotary base": {"rope_local_base_freq": 1000000.0},
                      "linear scaling": {"rope_scaling": {"rope_type": "default"}}},
}


def print_sensitivity(name, config, model, ids, mask, positions, logits):
    for mechanism, edits in WITHOUT.get(name, {}).items():
        altered = copy.deepcopy(config)
        for key, value in edits.items():
            setattr(altered, key, value)
        with torch.random.fork_rng():  # the other checkpoints' random weights stay as they are
            other = AutoModelForCausalLM.from_config(altered, attn_implementation="eager").eval()
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            moved = other(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float() - logits
        print(f"{name}: without {mechanism}, transformers' logits move by "
              f"{moved.abs().amax(-1)[mask.bool()].max().item():.2g}")


def bfloat16_logprobs(folder, ids, mask, completion, temperature):
    """The completion's log-probabilities under transformers' own bf16 model (as from_pretrained gives
    it: SDPA attention, but eager for Gemma 2, whose SDPA leaves out the attention's soft-capping),
    row by row without padding: where each product rounds is the architecture's."""
    eager = "gemma2" in folder
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                                 **({"attn_implementation": "eager"} if eager else {})).eval()
    # Gemma 2's final soft-capping as TRL's fused head applies it (GRPO's log-probabilities): on the
    # float32 logits, where transformers' forward caps the bf16 ones
    cap = getattr(model.config, "final_logit_softcapping", None)
    model.config.final_logit_softcapping = None
    rows = []
    with torch.no_grad():
        for b in range(ids.shape[0]):
            prompt = ids[b][mask[b].bool()]
            logits = model(input_ids=torch.cat([prompt, completion[b]])[None]).logits.float()[0, len(prompt) - 1:-1]
            if cap:
                logits = cap * torch.tanh(logits / cap)
            rows.append(torch.log_softmax(logits / temperature, -1).gather(-1, completion[b][:, None])[:, 0])
    return torch.stack(rows).contiguous()


def left_padded_batch():
    g = torch.Generator().manual_seed(0)
    lengths = [7, 5, 3]
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, T - n:] = torch.randint(4, COMMON["vocab_size"], (n,), generator=g)
        mask[b, T - n:] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def save_tokenizer(folder):
    """A byte-level BPE tokenizer sized to the tiny vocabulary, so the CLI can be tested on text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=COMMON["vocab_size"], special_tokens=["<pad>", "<s>", "<|im_end|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["What is 2 + 2? The answer is 4.", "Hello world, hello there."] * 50, trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|im_end|>",
                   "pad_token": "<pad>",
                   "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                                    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
                                    "{{ '<|im_start|>assistant\\n' }}{% endif %}"}, f)


# Mistral-7B-Instruct's template: [INST] turns after the BOS, roles alternating user/assistant
MISTRAL_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
                    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
                    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
                    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")


@contextlib.contextmanager
def sentencepiece_model(line, vocab_size, *options):
    """A sentencepiece BPE model (byte fallback) trained on `line` repeated, with spm_train's extra
    options, in a temporary folder: yields the model's path."""
    with tempfile.TemporaryDirectory() as work:
        corpus = os.path.join(work, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(line * 50)
        subprocess.run(["spm_train", f"--input={corpus}", f"--model_prefix={work}/tokenizer", f"--vocab_size={vocab_size}",
                        "--model_type=bpe", "--byte_fallback=true", "--minloglevel=2", *options],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield os.path.join(work, "tokenizer.model")


def save_sentencepiece_style_tokenizer(folder):
    """A sentencepiece BPE model (byte fallback) sized to the tiny vocabulary, converted to tokenizer.json
    by transformers as Mistral's and Llama 2's checkpoints ship it (LlamaTokenizerFast, legacy), with
    both files in the folder, as theirs have."""
    from transformers import LlamaTokenizerFast
    with sentencepiece_model("What is 2 + 2? The answer is 4.\nHello world, hello there. [INST] [/INST]\n",
                             COMMON["vocab_size"]) as model:
        tokenizer = LlamaTokenizerFast(vocab_file=model, legacy=True, add_prefix_space=True, from_slow=True)
        tokenizer.chat_template = MISTRAL_TEMPLATE
        tokenizer.save_pretrained(folder)


PHI3_MARKERS = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]


def save_phi3_tokenizer(folder):
    """Phi-3.5-mini-instruct's tokenizer, sized to the tiny vocabulary: a sentencepiece BPE model
    (byte fallback) converted by transformers with legacy=False (Metaspace, prepending to the first
    text only), its chat markers added as special tokens that strip the whitespace after them (as
    Phi-3's do) to fill the vocabulary, <|endoftext|> as EOS, and Phi-3.5's template as TRL ships it."""
    from tokenizers import AddedToken
    from transformers import LlamaTokenizerFast
    with sentencepiece_model("What is 2 + 2? The answer is 4.\nHello world, hello there. You are terse.\n",
                             COMMON["vocab_size"] - len(PHI3_MARKERS)) as model:
        tokenizer = LlamaTokenizerFast(vocab_file=model, legacy=False, from_slow=True)
    tokenizer.add_special_tokens({"additional_special_tokens": [
        AddedToken(marker, rstrip=marker != "<|endoftext|>", normalized=False, special=True) for marker in PHI3_MARKERS]})
    tokenizer.eos_token = "<|endoftext|>"
    tokenizer.pad_token = "<|endoftext|>"
    assert len(tokenizer) == COMMON["vocab_size"], len(tokenizer)
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "phi3_5.jinja")) as f:
        tokenizer.chat_template = f.read()
    tokenizer.save_pretrained(folder)


def save_smollm3_tokenizer(folder):
    """The tiny byte-level tokenizer with SmolLM3-3B's chat template (tests/core/text/smollm3.jinja)."""
    save_tokenizer(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "text", "smollm3.jinja")) as f:
        tokenizer.chat_template = f.read()
    tokenizer.save_pretrained(folder)


def save_gemma_tokenizer(folder):
    """Gemma's tokenizer, sized to the tiny vocabulary: a sentencepiece BPE model (byte fallback, no
    dummy prefix, <pad> <eos> <bos> <unk> as ids 0-3) converted by transformers (GemmaTokenizerFast),
    the turn markers added as special tokens, and Gemma 3's template as TRL ships it."""
    from transformers import GemmaTokenizerFast
    markers = ["<start_of_turn>", "<end_of_turn>"]
    with sentencepiece_model("What is 2 + 2? The answer is 4.\nHello world, hello there. user model\n",
                             COMMON["vocab_size"] - len(markers), "--add_dummy_prefix=false", "--split_digits=true",
                             "--pad_id=0", "--eos_id=1", "--bos_id=2", "--unk_id=3", "--pad_piece=<pad>",
                             "--eos_piece=<eos>", "--bos_piece=<bos>") as model:
        tokenizer = GemmaTokenizerFast(vocab_file=model, from_slow=True)
    tokenizer.add_special_tokens({"additional_special_tokens": markers})
    assert len(tokenizer) == COMMON["vocab_size"], len(tokenizer)
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "gemma3.jinja")) as f:
        tokenizer.chat_template = f.read()
    tokenizer.save_pretrained(folder)


def chat_reference(folder, model, names):
    """What transformers generates greedily for a question in the folder's own chat template (\"chat\")
    and in others (by name), and for the plain question."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    question = [{"role": "user", "content": "What is 2 + 2?"}]
    out = {}
    for name, text in [("plain", "What is 2 + 2?"),
                       *((name, tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True,
                                                              **kwargs)) for name, kwargs in names.items())]:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=(name == "plain")).input_ids
        with torch.no_grad():
            generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=6, min_new_tokens=6, pad_token_id=0, eos_token_id=None)
        out[name] = {"prompt_ids": ids[0].tolist(), "completion_ids": generated[0, ids.shape[1]:].tolist()}
    return out


def cli_reference(folder, model):
    """What transformers generates greedily for a text prompt: plain, with the chat template, and with
    Qwen3's template (as TRL ships it) and enable_thinking=False."""
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen3.jinja")) as f:
        qwen3 = f.read()
    return chat_reference(folder, model, {"chat": {}, "chat_qwen3_no_thinking": {"chat_template": qwen3,
                                                                                 "enable_thinking": False}})


# reward models: one score (num_labels = 1) from the last real token, as TRL's reward_funcs use them
REWARD_CONFIGS = {
    "llama_reward": LlamaConfig(num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0,
                                **COMMON),
    "qwen2_reward": Qwen2Config(num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0,
                                tie_word_embeddings=True, use_sliding_window=False, **COMMON),
    "qwen3_reward": Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_labels=1, pad_token_id=0,
                                tie_word_embeddings=True, use_sliding_window=False, **COMMON),
    "phi3_reward": Phi3Config(num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0,
                              tie_word_embeddings=False, **COMMON),
    "smollm3_reward": SmolLM3Config(num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0,
                                    no_rope_layer_interval=2, **COMMON),
    "gemma2_reward": Gemma2Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_labels=1, pad_token_id=0,
                                  attn_logit_softcapping=1.0, sliding_window=4, **COMMON),
    "gemma3_reward": Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=16, num_labels=1,
                                      pad_token_id=0, sliding_window=4, sliding_window_pattern=2, **COMMON),
    # mixtures of experts (OLMoE has no sequence classifier in transformers)
    "qwen3_moe_reward": Qwen3MoeConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                                       num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, num_labels=1,
                                       pad_token_id=0, use_sliding_window=False, **COMMON),
    "qwen2_moe_reward": Qwen2MoeConfig(num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                       moe_intermediate_size=32, shared_expert_intermediate_size=48, num_labels=1,
                                       pad_token_id=0, use_sliding_window=False, **COMMON),
    "mixtral_reward": MixtralConfig(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                    num_experts_per_tok=2, num_labels=1, pad_token_id=0,
                                    **{**COMMON, "intermediate_size": 48}),
}
REWARD_ROWS = [("What is 2 + 2?", " The answer is 4."), ("Hello", " world, hello there. Hello world, hello there."),
               ("What is 2 + 2?", " 5"), ("", "Hello"), ("Hello world", "")]
# conversational rows: TRL renders prompt + completion messages with the reward model's chat template
REWARD_CONVERSATIONS = [([{"role": "user", "content": "What is 2 + 2?"}], "The answer is 4."),
                        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
                         "Hello world, hello there.")]


def save_reward_model(name, config):
    """A tiny sequence classifier with the tiny tokenizer, and its scores of REWARD_ROWS as TRL computes
    them: prompt + completion, tokenized without special tokens, right-padded, logits[:, 0]."""
    folder = os.path.join(OUT, name)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = [p + c for p, c in REWARD_ROWS]
    inputs = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    inputs.pop("token_type_ids", None)  # this tiny tokenizer's, which Qwen2-MoE's forward refuses (Qwen's have none)
    with torch.no_grad():
        scores = model(**inputs).logits[:, 0]
    conversations = [apply_chat_template({"messages": p + [{"role": "assistant", "content": c}]}, tokenizer)["text"]
                     for p, c in REWARD_CONVERSATIONS]
    inputs = tokenizer(text=conversations, return_tensors="pt", padding=True, padding_side="right",
                       add_special_tokens=False)
    inputs.pop("token_type_ids", None)
    with torch.no_grad():
        conversation_scores = model(**inputs).logits[:, 0]
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"prompts": [p for p, _ in REWARD_ROWS], "completions": [c for _, c in REWARD_ROWS],
                   "scores": scores.tolist(),
                   "conversations": [{"prompt": p, "completion": c, "text": t}
                                     for (p, c), t in zip(REWARD_CONVERSATIONS, conversations)],
                   "conversation_scores": conversation_scores.tolist()}, f)


def float32_head_reference(name):
    """TRL's completion log-probabilities of a bfloat16 model, with cast_lm_head_to_fp32 and without,
    and the final hidden states the head saw (a hook on the backbone), so that Grove's output layer
    is compared on exactly TRL's inputs."""
    from datasets import Dataset
    from tokenizers import models as tokenizer_models
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer
    folder = os.path.join(OUT, name)
    word_level = Tokenizer(tokenizer_models.WordLevel({f"t{i}": i for i in range(COMMON["vocab_size"])}, unk_token="t0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, pad_token="t0", bos_token="t1", eos_token="t2")
    g = torch.Generator().manual_seed(5)
    B, P, C, temperature = 3, 4, 5, 0.7
    ids = torch.randint(4, COMMON["vocab_size"], (B, P + C), generator=g)
    out = {"input_ids": ids}
    for cast in (True, False):
        args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=B, num_generations=B,
                          max_completion_length=C, temperature=temperature, cast_lm_head_to_fp32=cast,
                          report_to="none", use_cpu=True, bf16=False, gradient_checkpointing=False)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        if model.base_model is model:  # Gemma3ForCausalLM: TRL 1.16's fused head needs the backbone there
            model.base_model_prefix = "model"
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                              processing_class=tokenizer, train_dataset=Dataset.from_dict({"prompt": ["a"]}))
        seen = {}
        trainer.model.model.register_forward_hook(lambda m, a, o: seen.update(hidden=o.last_hidden_state.detach()))
        with torch.no_grad():
            logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), C)[0]
        suffix = "cast" if cast else "plain"
        out["logps_" + suffix] = logps.float().contiguous()
        out["hidden_" + suffix] = seen["hidden"][:, P - 1:-1].contiguous()  # the positions that predict the completion
    out["targets"] = ids[:, P:].contiguous()
    save_file(out, os.path.join(folder, "float32_head.safetensors"))
    with open(os.path.join(folder, "float32_head.json"), "w") as f:
        json.dump({"temperature": temperature}, f)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(1234)
    ids, mask, positions = left_padded_batch()
    for name, config in CONFIGS.items():
        folder = os.path.join(OUT, name)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        with torch.no_grad():
            for p in model.parameters():  # larger weights than the default init, so logits differ visibly
                p.normal_(0.0, 0.08)
            # biases and norms too
            if name.startswith("phi3"):  # sharper attention: a wrong rotary embedding changes logits by > 1e-3
                for layer in model.model.layers:
                    layer.self_attn.qkv_proj.weight.normal_(0.0, 0.3)
            if name.startswith("olmo"):  # norms that keep the layers' outputs as large as their weights'
                for key, p in model.named_parameters():
                    if "norm" in key:
                        p.normal_(1.0, 0.2)
            if name.startswith("smollm3") or name in ("mistral_window", "qwen2_window", "olmo3_window"):  # so too for a NoPE
                # layer rotated by mistake, and for rotary scaling left out
                for layer in model.model.layers:
                    layer.self_attn.q_proj.weight.normal_(0.0, 0.3)
                    layer.self_attn.k_proj.weight.normal_(0.0, 0.3)
            if "moe" in name or name.endswith("_experts"):  # experts whose outputs, and routers whose choices, move the logits
                for key, p in model.named_parameters():
                    if ".experts." in key or ".shared_expert" in key or key.endswith(".gate.weight"):
                        p.normal_(0.0, 0.3)
        model.save_pretrained(folder, safe_serialization=True)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
            greedy = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                                    min_new_tokens=8, pad_token_id=0, eos_token_id=None)
            completion = greedy[:, ids.shape[1]:]
            full = torch.cat([ids, completion], 1)
            full_mask = torch.cat([mask, torch.ones_like(completion)], 1)
            # TRL's logprob recipe: logits / T, log_softmax, gather the next token
            temperature = 0.7
            out = model(input_ids=full, attention_mask=full_mask,
                        position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits.float()
            out = out[:, ids.shape[1] - 1:-1, :] / temperature
            logprobs = torch.log_softmax(out, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        print_sensitivity(name, config, model, ids, mask, positions, logits)
        save_file({"input_ids": ids, "attention_mask": mask, "position_ids": positions, "logits": logits.contiguous(),
                   "greedy": completion.contiguous(), "logprobs": logprobs.contiguous(),
                   "logprobs_bf16": bfloat16_logprobs(folder, ids, mask, completion, temperature)},
                  os.path.join(folder, "reference.safetensors"))
        extra = {}
        if name == "qwen3_qknorm":  # the device kit's graph engine check generates from text with it
            save_tokenizer(folder)
        if name == "phi3_longrope":  # a Phi-3.5 checkpoint's folder: Metaspace tokenizer.json, its template
            save_phi3_tokenizer(folder)
            extra = chat_reference(folder, model, {"chat": {}})
        if name == "smollm3_nope":  # SmolLM3's template writes today's date: the test skips on another day
            save_smollm3_tokenizer(folder)
            date = datetime.datetime.now().strftime("%d %B %Y")
            extra = chat_reference(folder, model, {"chat": {}, "chat_no_thinking": {"enable_thinking": False}})
            assert datetime.datetime.now().strftime("%d %B %Y") == date, "rendered at midnight: run again"
            extra["date"] = date
        if name == "gemma3_window":  # a Gemma 3 checkpoint's folder: its tokenizer.json and template
            save_gemma_tokenizer(folder)
            extra = chat_reference(folder, model, {"chat": {}})
        if name == "gemma3_vision":  # trained with LoRA from text prompts; its image processor's file
            save_gemma_tokenizer(folder)
            from transformers import Gemma3ImageProcessor
            Gemma3ImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)
        if name in ("gemma2_softcap", "olmo2_post_norm", "olmo3_window", "qwen3_moe_experts",
                    "qwen2_moe_shared"):  # the LoRA tests train them from text prompts
            save_tokenizer(folder)
        if name == "llama_gqa":
            save_tokenizer(folder)
            extra = cli_reference(folder, model)
        if name == "mistral_mha":  # a Mistral checkpoint's folder: tokenizer.json and .model, [INST] chat
            save_sentencepiece_style_tokenizer(folder)
            extra = chat_reference(folder, model, {"chat": {}})
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump({"temperature": temperature, **extra}, f)
    for name, config in REWARD_CONFIGS.items():
        save_reward_model(name, config)
    # an untied head, one tied to the embedding, and Gemma's tied ones, whose embeddings are scaled (and
    # Gemma 2's final logits soft-capped, which TRL's fused head does in float32)
    for name in ("llama_gqa", "qwen2_tied", "gemma2_softcap", "gemma3_window"):
        float32_head_reference(name)
    print(f"tiny models written to {OUT}")


if __name__ == "__main__":
    main()
