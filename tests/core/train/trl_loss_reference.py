"""TRL's GRPOTrainer._compute_loss on fixed rollouts: the loss and gradient norm Grove must reproduce.

    .venv/bin/python tests/core/train/trl_loss_reference.py OUT_DIR

Writes OUT_DIR/model (a tiny random Llama), OUT_DIR/gemma (a tiny Gemma 3, for the cases that name it),
OUT_DIR/rollouts.safetensors (prompt/completion ids and
masks, advantages, old and reference log-probs) and OUT_DIR/cases.json (one entry per configuration
with TRL's loss and grad_norm), and OUT_DIR/sft_cases.json (TRL's SFTTrainer on fixed batches: one
compute_loss, or one optimizer step of gradient accumulation; loss, grad_norm and logged metrics). Everything numeric here is computed by TRL and transformers.
"""
import inspect
import json
import math
import os
import sys
import tempfile
import textwrap
import warnings

import torch
from datasets import Dataset
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from tiny_llama import save_tiny_gemma, save_tiny_gemma2, save_tiny_llama, save_tiny_moe, save_tiny_olmo2

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
    # vespo = dapo's normaliser with the vespo objective
    dict(name="vespo", loss_type="vespo", reduction="dapo", objective="vespo", off_policy=True),
    dict(name="vespo_beta", loss_type="vespo", reduction="dapo", objective="vespo", off_policy=True, beta=0.1,
         with_ref=True),
    # the sampler-mismatch correction, every mode, bounds that clip or mask some ratios (one sampling log-prob is NaN)
    dict(name="grpo_token_truncate", loss_type="grpo", off_policy=True, sampling="token_truncate", clip_min=0.8,
         clip_max=1.25),
    dict(name="grpo_token_mask", loss_type="grpo", off_policy=True, sampling="token_mask", clip_min=0.8, clip_max=1.25),
    dict(name="dapo_sequence_truncate", loss_type="dapo", off_policy=True, sampling="sequence_truncate", clip_min=0.75,
         clip_max=1.0, beta=0.1, with_ref=True),
    dict(name="grpo_sequence_mask", loss_type="grpo", off_policy=True, sampling="sequence_mask", clip_min=0.75,
         clip_max=1.0),
    dict(name="vespo_token_mask", loss_type="vespo", reduction="dapo", objective="vespo", off_policy=True,
         sampling="token_mask", clip_min=0.8, clip_max=1.25),
    # the host's masks and the entropy bonus
    dict(name="grpo_top_entropy", loss_type="grpo", off_policy=True, top_entropy_quantile=0.5),
    dict(name="grpo_off_policy_mask", loss_type="grpo", off_policy=True, with_sampling=True,
         off_policy_mask_threshold=0.0),
    dict(name="dapo_entropy_coef", loss_type="dapo", off_policy=True, entropy_coef=0.05),
    dict(name="grpo_entropy_coef_top_entropy", loss_type="grpo", off_policy=True, entropy_coef=0.05,
         top_entropy_quantile=0.3, beta=0.1, with_ref=True),
    # adaptive: the first call applies no bonus (no entropy measured yet) and raises the coefficient; the
    # second applies it (entropy_target is above this model's entropy)
    dict(name="grpo_adaptive_entropy", loss_type="grpo", off_policy=True, entropy_coef=0.02, use_adaptive_entropy=True,
         entropy_target=100.0, calls=2),
]
# what TRL's _compute_loss appends to its logged metrics for one micro-batch
LOGGED = ["kl", "entropy", "clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean", "clip_ratio/high_max",
          "clip_ratio/region_mean", "cispo_clip_ratio", "vespo/phi_seq_mean", "aux_loss"]


def trl_sampling_ratio(trainer, old_per_token_logps, sampling_per_token_logps, completion_mask):
    """TRL's own importance-sampling block of _generate_and_score_completions, run as written."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = source.index("            if self.use_vllm and self.vllm_importance_sampling_correction:\n"
                         "                mask = completion_mask")
    end = source.index("# Compute the per-token log probabilities for the reference model", start)
    block = textwrap.dedent(source[start:end])
    scope = dict(self=trainer, torch=torch, math=math, old_per_token_logps=old_per_token_logps,
                 sampling_per_token_logps=sampling_per_token_logps, completion_mask=completion_mask, tool_mask=None)
    exec(block, scope)
    return scope["vllm_importance_sampling_ratio"]


# on-policy cases on other architectures: the tiny Gemma 3 (its loss and every weight's gradient
# through (1 + w) norms, scaled embeddings, GeGLU and the sliding layer) and the tiny OLMo 2 (norms
# after the attention and the MLP, q and k normed over the whole projection), and the tiny OLMo 3
# (OLMo 2's layers, a sliding one); the tiny Gemma 2, its attention scores and final logits soft-capped
# (TRL's fused head caps the logits; transformers' eager attention, which the case asks for, caps the
# scores)
ARCHITECTURE_CASES = [dict(name="gemma2_grpo", loss_type="grpo", model="gemma2"),
                      dict(name="gemma2_dapo", loss_type="dapo", model="gemma2"),
dict(name="gemma_grpo", loss_type="grpo", model="gemma"),
                      dict(name="gemma_dapo", loss_type="dapo", model="gemma"),
                      dict(name="gemma_dr_grpo", loss_type="dr_grpo", model="gemma"),
                      dict(name="olmo2_grpo", loss_type="grpo", model="olmo2"),
                      dict(name="olmo2_dapo", loss_type="dapo", model="olmo2"),
                      dict(name="olmo3_dapo", loss_type="dapo", model="olmo3"),
                      # mixtures of experts: TRL adds the routers' load-balancing loss, weighted by the
                      # config's coefficient (0.001) or by router_aux_loss_coef, large here so that its
                      # gradient moves the norm
                      dict(name="qwen3_moe_dapo", loss_type="dapo", model="qwen3_moe"),
                      dict(name="qwen3_moe_grpo_aux", loss_type="grpo", model="qwen3_moe", router_aux_loss_coef=0.5),
                      dict(name="mixtral_dr_grpo_aux", loss_type="dr_grpo", model="mixtral", router_aux_loss_coef=0.5),
                      dict(name="mixtral_no_aux", loss_type="dapo", model="mixtral", router_aux_loss_coef=0.0),
                      dict(name="olmoe_bnpo", loss_type="bnpo", model="olmoe"),
                      dict(name="qwen2_moe_grpo_aux", loss_type="grpo", model="qwen2_moe", router_aux_loss_coef=0.5)]


# One optimizer step of TRL's SFTTrainer on fixed rows (grove sft's loss), through
# Trainer.training_step, which scales each micro-batch's loss by the step's trained tokens
# (num_items_in_batch): the dense Llama, and mixtures of experts whose loss takes the load-balancing
# term (the config's coefficient, and 0.5); one micro-batch of all rows unless micro_batches says.
SFT_CASES = [dict(name="sft_llama", model="model"), dict(name="sft_qwen3_moe", model="qwen3_moe"),
             dict(name="sft_mixtral_aux", model="mixtral", router_aux_loss_coef=0.5),
             dict(name="sft_llama_accumulated", model="model", micro_batches=[[0, 1], [2, 3]]),
             dict(name="sft_mixtral_aux_accumulated", model="mixtral", router_aux_loss_coef=0.5,
                  micro_batches=[[2], [0, 1, 3]]),
             # bf16 Gemma 2: TRL's fused head caps the final logits after its cast to float32
             dict(name="sft_gemma2_bf16", model="gemma2", dtype="bfloat16"),
             # bf16 autocast (SFTConfig's bf16=True; grove sft's train.mixed_precision), one training_step
             dict(name="sft_llama_autocast", model="model", micro_batches=[[0, 1, 2, 3]], autocast=True),
             # packed rows (rows 0 and 1 in one, 2 and 3 in the other) in a padding-free batch
             dict(name="sft_llama_packed", model="model", packed=[[0, 1], [2, 3]]),
             # loss_type="dft": each token's -log p weighted by p (detached)
             dict(name="sft_llama_dft", model="model", loss_type="dft"),
             dict(name="sft_llama_dft_accumulated", model="model", loss_type="dft", micro_batches=[[0, 1], [2, 3]]),
             # NEFTune (transformers' hook on the embeddings; torch seeded before the step): padded rows of
             # different lengths, accumulated; packed rows in a padding-free batch; Gemma 3 (its embedding
             # module scales) and Gemma 2 (scaled after the hook's noise)
             dict(name="sft_llama_neftune", model="model", neftune_noise_alpha=5.0, micro_batches=[[0, 1], [2, 3]]),
             dict(name="sft_llama_neftune_packed", model="model", neftune_noise_alpha=5.0, packed=[[0, 1], [2, 3]]),
             dict(name="sft_gemma3_neftune", model="gemma", neftune_noise_alpha=5.0),
             dict(name="sft_gemma2_neftune", model="gemma2", neftune_noise_alpha=5.0)]
NEFTUNE_SEED = 1234
SFT_EVAL_CASES = [dict(name="sft_eval_llama", model="model"), dict(name="sft_eval_llama_dft", model="model", loss_type="dft"),
                  dict(name="sft_eval_mixtral_aux", model="mixtral", router_aux_loss_coef=0.5)]
# the last row continues its prompt with the tiny Llama's greedy tokens (sft_reference adds it), so
# that mean_token_accuracy is not 0 for every row of a random model; the second row is trained whole
# (a language-modeling row), so its first token counts unpacked and not in a padding-free batch
SFT_ROWS = [([5, 6, 7, 8, 9, 2], [0, 0, 1, 1, 1, 1]), ([10, 11, 12, 2], [1, 1, 1, 1]),
            ([40, 41, 42, 43, 44, 45, 46, 2], [0, 0, 0, 0, 1, 1, 1, 1])]
GREEDY_PROMPT = [20, 21, 22]


def sft_batch(all_rows, picked):
    """The rows `picked`, right-padded, with a label where the token is trained."""
    rows = [all_rows[i] for i in picked]
    T = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for b, (row, trained) in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row)
        mask[b, :len(row)] = 1
        labels[b, :len(row)] = torch.where(torch.tensor(trained) == 1, torch.tensor(row), -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def sft_reference(folders, tokenizer):
    from trl import SFTConfig, SFTTrainer
    llama = AutoModelForCausalLM.from_pretrained(folders["model"]).eval()
    with torch.no_grad():
        greedy = llama.generate(torch.tensor([GREEDY_PROMPT]), attention_mask=torch.ones(1, len(GREEDY_PROMPT), dtype=torch.long),
                                do_sample=False, max_new_tokens=5, min_new_tokens=5, pad_token_id=0, eos_token_id=None)
    rows = SFT_ROWS + [(greedy[0].tolist(), [0] * len(GREEDY_PROMPT) + [1] * 5)]
    # Trainer.evaluate on the rows in batches of 3 (the last of 1): eval_loss and the eval metrics; first,
    # since a bf16 trainer leaves accelerate's mixed precision on for the trainers made after it
    evaluations = []
    for case in SFT_EVAL_CASES:
        args = SFTConfig(output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False,
                         per_device_eval_batch_size=3, router_aux_loss_coef=case.get("router_aux_loss_coef"),
                         loss_type=case.get("loss_type", "nll"))
        trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(folders[case["model"]]), args=args,
                             processing_class=tokenizer, train_dataset=Dataset.from_dict({"text": ["t5 t6"]}))
        held_out = Dataset.from_list([{"input_ids": row, "labels": [t if m else -100 for t, m in zip(row, trained)]}
                                      for row, trained in rows])
        figures = trainer.evaluate(eval_dataset=held_out)
        evaluations.append({**case, "batch_size": 3,
                            "router_aux_loss_coef": trainer.router_aux_loss_coef if trainer.aux_loss_enabled else 0.0,
                            **{k: v for k, v in figures.items() if k in (
                                "eval_loss", "eval_entropy", "eval_mean_token_accuracy", "eval_aux_loss")}})
    results = []
    for case in SFT_CASES:
        micro_batches = case.get("micro_batches", [list(range(len(case.get("packed", rows))))])
        args = SFTConfig(output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=case.get("autocast", False),
                         per_device_train_batch_size=max(len(m) for m in micro_batches),
                         gradient_accumulation_steps=len(micro_batches), gradient_checkpointing=False,
                         router_aux_loss_coef=case.get("router_aux_loss_coef"), loss_type=case.get("loss_type", "nll"),
                         neftune_noise_alpha=case.get("neftune_noise_alpha"))
        model = AutoModelForCausalLM.from_pretrained(
            folders[case["model"]], dtype=getattr(torch, case.get("dtype", "float32")),
            **({"attn_implementation": "eager"} if case["model"] == "gemma2" else {}))  # the eager attention caps
        if model.base_model is model:  # Gemma3ForCausalLM: the backbone for TRL's fused head, as below
            model.base_model_prefix = "model"
        trainer = SFTTrainer(model=model, args=args,
                             processing_class=tokenizer, train_dataset=Dataset.from_dict({"text": ["t5 t6"]}))
        trainer.model.train()
        trainer.model.zero_grad()
        if "neftune_noise_alpha" in case:  # Trainer.train() would add the hook
            trainer.model = trainer._activate_neftune(trainer.model)
            torch.manual_seed(NEFTUNE_SEED)
        if "packed" in case:  # TRL's padding-free collator on packed rows, one training_step
            from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
            packed = [dict(input_ids=sum((rows[i][0] for i in row), []),
                           labels=sum(([t if m else -100 for t, m in zip(*rows[i])] for i in row), []),
                           seq_lengths=[len(rows[i][0]) for i in row]) for row in case["packed"]]
            batches = [DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(packed)]
            trainer.current_gradient_accumulation_steps = 1
            num_items = trainer._get_num_items_in_batch(batches, torch.device("cpu"))
            loss = trainer.training_step(trainer.model, batches[0], num_items)
        else:  # Trainer's inner loop for one optimizer step (num_items_in_batch counts labels before the shift)
            batches = [sft_batch(rows, m) for m in micro_batches]
            trainer.current_gradient_accumulation_steps = len(batches)
            num_items = trainer._get_num_items_in_batch(batches, torch.device("cpu"))
            assert num_items is not None, "Trainer should scale by the step's tokens"
            loss = sum(trainer.training_step(trainer.model, b, num_items) for b in batches)
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in trainer.model.parameters() if p.grad is not None])
        logged = {key: sum(values) / len(values) for key, values in trainer._metrics["train"].items() if values}
        results.append({"dtype": "float32", "autocast": False, "neftune_noise_alpha": 0.0, "seed": NEFTUNE_SEED, **case,
                        "micro_batches": micro_batches,
                        "router_aux_loss_coef": trainer.router_aux_loss_coef if trainer.aux_loss_enabled else 0.0,
                        "loss": float(loss), "grad_norm": grad_norm.item(), "aux_loss": logged.get("aux_loss"),
                        "entropy": logged["entropy"], "mean_token_accuracy": logged["mean_token_accuracy"]})
    return {"rows": [{"ids": row, "trained": trained} for row, trained in rows], "cases": results,
            "evaluations": evaluations}


def main():
    os.makedirs(OUT, exist_ok=True)
    folders = {"model": save_tiny_llama(os.path.join(OUT, "model")), "gemma": save_tiny_gemma(os.path.join(OUT, "gemma")),
               "gemma2": save_tiny_gemma2(os.path.join(OUT, "gemma2")),
               "olmo2": save_tiny_olmo2(os.path.join(OUT, "olmo2")),
               "olmo3": save_tiny_olmo2(os.path.join(OUT, "olmo3"), olmo3=True),
               "qwen3_moe": save_tiny_moe(os.path.join(OUT, "qwen3_moe")),
               "mixtral": save_tiny_moe(os.path.join(OUT, "mixtral"), "mixtral"),
               "olmoe": save_tiny_moe(os.path.join(OUT, "olmoe"), "olmoe"),
               "qwen2_moe": save_tiny_moe(os.path.join(OUT, "qwen2_moe"), "qwen2_moe")}
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
    noise_sampling = (torch.rand(B, C, generator=g) - 0.5) * 0.8
    noise_sampling[0, 1] = float("nan")  # a token the sampler could not score

    results = []
    for case in CASES + ARCHITECTURE_CASES:
        folder = folders[case.get("model", "model")]
        # the old, reference and sampler log-probs below are the Llama's
        assert folder == folders["model"] or not {"off_policy", "with_ref", "with_sampling", "sampling"} & case.keys()
        args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=B, num_generations=2,
                          max_completion_length=C, temperature=TEMPERATURE, loss_type=case["loss_type"],
                          beta=case.get("beta", 0.0), epsilon=0.2, epsilon_high=case.get("epsilon_high"),
                          delta=case.get("delta"), importance_sampling_level=case.get("importance_sampling_level", "token"),
                          num_iterations=case.get("num_iterations", 1),
                          # TRL's default before 1.10 (later TRL defaults to True)
                          use_bias_correction_kl=case.get("use_bias_correction_kl", False), report_to="none", use_cpu=True, bf16=False,
                          gradient_checkpointing=False, logging_steps=1,
                          top_entropy_quantile=case.get("top_entropy_quantile", 1.0),
                          off_policy_mask_threshold=case.get("off_policy_mask_threshold"),
                          entropy_coef=case.get("entropy_coef", 0.0),
                          use_adaptive_entropy=case.get("use_adaptive_entropy", False),
                          entropy_target=case.get("entropy_target", 0.2),
                          vllm_importance_sampling_mode=case.get("sampling", "sequence_mask"),
                          vllm_importance_sampling_clip_min=case.get("clip_min"),
                          vllm_importance_sampling_clip_max=case.get("clip_max", 3.0),
                          router_aux_loss_coef=case.get("router_aux_loss_coef"))
        # Gemma 2: transformers' default SDPA attention leaves out its soft-capping; the eager one applies it
        model = AutoModelForCausalLM.from_pretrained(
            folder, **({"attn_implementation": "eager"} if case.get("model") == "gemma2" else {}))
        # TRL 1.16's fused LM head runs the backbone as model.base_model, which for Gemma3ForCausalLM
        # under transformers 4.57 (base_model_prefix "language_model", an attribute it lacks) is the whole
        # model again, and fails; pointing it at the backbone is what TRL expects
        if model.base_model is model:
            model.base_model_prefix = "model"
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
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
        if case.get("with_sampling") or case.get("sampling"):
            inputs["sampling_per_token_logps"] = logps + noise_sampling
        if case.get("sampling"):  # as TRL with vLLM: the sampler's log-probs against the trainer's old ones
            trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
            ratio = trl_sampling_ratio(trainer, inputs["old_per_token_logps"], inputs["sampling_per_token_logps"], case_mask)
            inputs["importance_sampling_ratio"] = ratio
            clipped = (ratio == 0).any() if "mask" in case["sampling"] else ((ratio == case["clip_min"]) | (ratio == case["clip_max"])).any()
            assert clipped, f"{case['name']}: no ratio reaches the clip bounds, the test would not test them"
        if "off_policy_mask_threshold" in case:
            kept = GRPOTrainer.get_off_policy_mask(advantages.unsqueeze(1), logps, inputs["sampling_per_token_logps"],
                                                   case_mask, case["off_policy_mask_threshold"])
            assert 0 < kept.sum() < B, f"{case['name']}: the off-policy mask keeps {kept.sum()} of {B} rows"
        for call in range(case.get("calls", 1)):
            trainer.model.zero_grad()
            loss = trainer._compute_loss(trainer.model, inputs)
            loss.backward()
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in trainer.model.parameters() if p.grad is not None]).item()
        logged = {k: trainer._metrics["train"][k][-1] for k in LOGGED if trainer._metrics["train"].get(k)}
        extra = {}
        if case.get("entropy_coef"):  # the coefficient after the (last) call, and the entropy the controller saw
            extra["entropy_coef_after"] = trainer._metrics["train"]["entropy_coef"][-1]
        if case.get("sampling"):
            extra["sampling_ratio"] = inputs["importance_sampling_ratio"].tolist()
        extra["router_aux_loss_coef"] = trainer.router_aux_loss_coef if trainer.aux_loss_enabled else 0.0
        results.append({**case, "loss": loss.item(), "grad_norm": grad_norm, "logged": logged, **extra})
    save_file({"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
               "completion_mask": completion_mask, "advantages": advantages, "env_mask": env_mask,
               "old_logps": (logps + noise_old).contiguous(), "ref_logps": (logps + noise_ref).contiguous(),
               "sampling_logps": (logps + noise_sampling).contiguous(),
               "trl_logps": logps.contiguous()},
              os.path.join(OUT, "rollouts.safetensors"))
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"temperature": TEMPERATURE, "max_completion_length": C, "cases": results}, f, indent=1)
    with open(os.path.join(OUT, "sft_cases.json"), "w") as f:
        json.dump(sft_reference(folders, tokenizer), f, indent=1)
    print(f"TRL reference losses written to {OUT}")


if __name__ == "__main__":
    main()
