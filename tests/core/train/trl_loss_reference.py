"""TRL's GRPOTrainer._compute_loss on fixed rollouts: the loss and gradient norm Grove must reproduce.

    .venv/bin/python tests/core/train/trl_loss_reference.py OUT_DIR

Writes OUT_DIR/model (a tiny random Llama), OUT_DIR/rollouts.safetensors (prompt/completion ids and
masks, advantages, old and reference log-probs) and OUT_DIR/cases.json (one entry per configuration
with TRL's loss and grad_norm). Everything numeric here is computed by TRL and transformers.
"""
import json
import os
import sys
import tempfile
import warnings

import torch
from datasets import Dataset
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from tiny_llama import save_tiny_llama

warnings.filterwarnings("ignore")
OUT = sys.argv[1]
TEMPERATURE = 0.7
CASES = [
    dict(name="grpo", loss_type="grpo"),
    dict(name="bnpo", loss_type="bnpo"),
    dict(name="dr_grpo", loss_type="dr_grpo"),
    dict(name="dapo", loss_type="dapo"),
    dict(name="dapo_epsilon_high", loss_type="dapo", epsilon_high=0.28, off_policy=True),
    dict(name="grpo_delta", loss_type="grpo", delta=1.1, off_policy=True),
    dict(name="dapo_beta", loss_type="dapo", beta=0.1, with_ref=True),
    dict(name="grpo_sequence", loss_type="grpo", importance_sampling_level="sequence", off_policy=True),
    dict(name="dapo_second_iteration", loss_type="dapo", num_iterations=2, off_policy=True, beta=0.04, with_ref=True),
    dict(name="dapo_beta_bias_corrected", loss_type="dapo", beta=0.1, with_ref=True, off_policy=True,
         use_bias_correction_kl=True),
    # a row with no loss tokens (mask_truncated_completions): TRL's sequence-level clip ratios count it
    dict(name="grpo_sequence_masked_row", loss_type="grpo", importance_sampling_level="sequence", off_policy=True,
         masked_row=1),
    # multi-turn rows: tokens an environment wrote are context, not loss (TRL's tool_mask, from env_mask)
    dict(name="grpo_env_mask", loss_type="grpo", env_mask=True, off_policy=True),
    dict(name="bnpo_env_mask", loss_type="bnpo", env_mask=True),
    dict(name="dr_grpo_env_mask", loss_type="dr_grpo", env_mask=True),
    dict(name="dapo_beta_env_mask", loss_type="dapo", beta=0.1, with_ref=True, off_policy=True, env_mask=True),
    dict(name="grpo_sequence_env_mask", loss_type="grpo", importance_sampling_level="sequence", off_policy=True,
         env_mask=True),
    # TRL's other loss types are a Grove reduction with an objective plugin: cispo = dapo's normaliser with
    # the cispo objective (epsilon_high is its cap: 1.1 caps some of these ratios), sapo = grpo's with sapo
    dict(name="cispo", loss_type="cispo", reduction="dapo", objective="cispo", epsilon_high=1.1, off_policy=True),
    dict(name="cispo_beta_bias_corrected", loss_type="cispo", reduction="dapo", objective="cispo", epsilon_high=1.1,
         off_policy=True, beta=0.1, with_ref=True, use_bias_correction_kl=True),
    dict(name="cispo_sequence", loss_type="cispo", reduction="dapo", objective="cispo", epsilon_high=0.98,
         importance_sampling_level="sequence", off_policy=True),
    dict(name="luspo", loss_type="luspo", importance_sampling_level="sequence", off_policy=True),
    dict(name="luspo_beta_masked_row", loss_type="luspo", importance_sampling_level="sequence", off_policy=True,
         beta=0.1, with_ref=True, masked_row=1),
    dict(name="sapo", loss_type="sapo", reduction="grpo", objective="sapo", off_policy=True),
    dict(name="sapo_beta_sequence", loss_type="sapo", reduction="grpo", objective="sapo", off_policy=True, beta=0.1,
         with_ref=True, importance_sampling_level="sequence"),
]
# what TRL's _compute_loss appends to its logged metrics for one micro-batch
LOGGED = ["kl", "entropy", "clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean", "clip_ratio/high_max",
          "clip_ratio/region_mean", "cispo_clip_ratio"]


def main():
    os.makedirs(OUT, exist_ok=True)
    folder = save_tiny_llama(os.path.join(OUT, "model"))
    # TRL needs a processing class; the rollouts below are token ids, so any 128-word vocabulary does
    word_level = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, pad_token="t0", bos_token="t1", eos_token="t2")

    # 2 prompts x 2 generations; prompts left-padded, completions right-padded with varied lengths
    g = torch.Generator().manual_seed(1)
    B, P, C = 4, 5, 6
    prompt_ids = torch.randint(3, 128, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[2:, :2] = 0
    prompt_ids[2:, :2] = 0
    completion_ids = torch.randint(3, 128, (B, C), generator=g)
    lengths = [6, 3, 5, 1]
    completion_mask = torch.zeros(B, C, dtype=torch.long)
    for b, n in enumerate(lengths):
        completion_mask[b, :n] = 1
        completion_ids[b, n:] = 0
    advantages = torch.tensor([0.7071, -0.7071, 1.2, -0.3])
    # TRL's env_mask convention: 1 = the model wrote the token, 0 = the environment did (padding: 1)
    env_mask = torch.ones(B, C, dtype=torch.long)
    env_mask[0, 2:4] = 0
    env_mask[2, 1] = 0
    # old and reference log-probs: the model's own, shifted per token, so ratios leave [1-eps, 1+eps]
    noise_old = (torch.rand(B, C, generator=g) - 0.5) * 0.6
    noise_ref = (torch.rand(B, C, generator=g) - 0.5) * 0.8

    results = []
    for case in CASES:
        args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=B, num_generations=2,
                          max_completion_length=C, temperature=TEMPERATURE, loss_type=case["loss_type"],
                          beta=case.get("beta", 0.0), epsilon=0.2, epsilon_high=case.get("epsilon_high"),
                          delta=case.get("delta"), importance_sampling_level=case.get("importance_sampling_level", "token"),
                          num_iterations=case.get("num_iterations", 1),
                          # TRL's default before 1.10 (later TRL defaults to True)
                          use_bias_correction_kl=case.get("use_bias_correction_kl", False), report_to="none", use_cpu=True, bf16=False,
                          gradient_checkpointing=False, logging_steps=1)
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(folder), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=args, processing_class=tokenizer, train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}))
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()
        if not results:  # the model's own log-probs, once: old and reference log-probs derive from them
            with torch.no_grad():
                logps = trainer._get_per_token_logps_and_entropies(
                    trainer.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), C)[0]
        case_mask = completion_mask.clone()
        if "masked_row" in case:
            case_mask[case["masked_row"]] = 0
        inputs = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                      completion_mask=case_mask, advantages=advantages,
                      num_items_in_batch=case_mask.sum())
        if case.get("env_mask"):  # as _generate_and_score_completions hands a rollout_func's env_mask on
            inputs["tool_mask"] = env_mask
            inputs["num_items_in_batch"] = (case_mask * env_mask).sum()
        if case.get("off_policy"):
            inputs["old_per_token_logps"] = logps + noise_old
        if case.get("with_ref"):
            inputs["ref_per_token_logps"] = logps + noise_ref
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in trainer.model.parameters() if p.grad is not None]).item()
        logged = {k: trainer._metrics["train"][k][-1] for k in LOGGED if trainer._metrics["train"].get(k)}
        results.append({**case, "loss": loss.item(), "grad_norm": grad_norm, "logged": logged})
    save_file({"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
               "completion_mask": completion_mask, "advantages": advantages, "env_mask": env_mask,
               "old_logps": (logps + noise_old).contiguous(), "ref_logps": (logps + noise_ref).contiguous(),
               "trl_logps": logps.contiguous()},
              os.path.join(OUT, "rollouts.safetensors"))
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"temperature": TEMPERATURE, "max_completion_length": C, "cases": results}, f, indent=1)
    print(f"TRL reference losses written to {OUT}")


if __name__ == "__main__":
    main()
