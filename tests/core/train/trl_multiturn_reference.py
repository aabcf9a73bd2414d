"""TRL's GRPOTrainer, end to end, on fixed multi-turn rollouts given through rollout_func with
env_mask: the updated weights Grove must reproduce when it replays the same rollouts. One case takes
three steps with TR-DPO's reference sync (sync_ref_model), so the KL of steps 2 and 3 is taken to a
reference TRL moved toward the policy; another three with optim = "adafactor" and weight decay.

    .venv/bin/python tests/core/train/trl_multiturn_reference.py OUT_DIR

Writes OUT_DIR/model (a tiny random Llama), OUT_DIR/rollouts.jsonl (the rows in Grove's replay
format: prompt_ids, completion_ids, env_mask, rewards) and OUT_DIR/<case>.safetensors (the weights
after the case's TRL optimizer steps, one unless it says) for each case in CASES. Everything numeric is computed by TRL.
"""
import json
import os
import sys
import tempfile
import warnings

from datasets import Dataset
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from tiny_llama import save_tiny_llama  # noqa: E402

warnings.filterwarnings("ignore")
OUT = sys.argv[1]
CASES = [dict(name="grpo_beta", loss_type="grpo", beta=0.04), dict(name="dapo_beta", loss_type="dapo", beta=0.04),
         dict(name="dapo_sync_ref", loss_type="dapo", beta=0.5, max_steps=3, sync_ref_model=True, ref_model_sync_steps=1,
              ref_model_mixup_alpha=0.6),
         dict(name="dapo_adafactor", loss_type="dapo", beta=0.04, max_steps=3, optim="adafactor", weight_decay=0.1)]
# 2 prompts x 2 episodes. Completions: model turn, tool answer (env_mask 0), model turn with EOS (id 2)
ROWS = [
    dict(prompt_ids=[1, 10, 11, 12], completion_ids=[20, 21, 2, 50, 51, 52, 22, 2], env_mask=[1, 1, 1, 0, 0, 0, 1, 1], reward=1.0),
    dict(prompt_ids=[1, 10, 11, 12], completion_ids=[23, 24, 25, 2], env_mask=[1, 1, 1, 1], reward=0.0),
    dict(prompt_ids=[1, 13, 14], completion_ids=[26, 2, 53, 54, 27, 28, 2], env_mask=[1, 1, 0, 0, 1, 1, 1], reward=0.25),
    dict(prompt_ids=[1, 13, 14], completion_ids=[29, 30, 2, 55, 56, 57, 58, 31], env_mask=[1, 1, 1, 0, 0, 0, 0, 1], reward=0.75),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    folder = save_tiny_llama(os.path.join(OUT, "model"))
    # a byte-level BPE tokenizer (Grove reads BPE); the rollouts are token ids below its vocabulary
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["What is 2 + 2? The answer is 4.", "Hello world, hello there."] * 50,
                            trainers.BpeTrainer(vocab_size=128, special_tokens=["<pad>", "<s>", "</s>"], show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(folder)

    def rollout_func(prompts, trainer):
        assert len(prompts) == len(ROWS), prompts
        return {"prompt_ids": [r["prompt_ids"] for r in ROWS], "completion_ids": [r["completion_ids"] for r in ROWS],
                "logprobs": [[0.0] * len(r["completion_ids"]) for r in ROWS], "env_mask": [r["env_mask"] for r in ROWS],
                "given_reward": [r["reward"] for r in ROWS]}

    def given(completions, given_reward, **kwargs):
        return list(given_reward)

    for case in CASES:
        args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=len(ROWS), num_generations=2,
                          max_completion_length=8, loss_type=case["loss_type"], beta=case["beta"], learning_rate=1e-3,
                          lr_scheduler_type="constant", max_steps=case.get("max_steps", 1), use_cpu=True, bf16=False,
                          report_to="none", save_strategy="no", logging_steps=1, seed=3, temperature=1.0,
                          use_bias_correction_kl=False, sync_ref_model=case.get("sync_ref_model", False),
                          ref_model_sync_steps=case.get("ref_model_sync_steps", 512),
                          ref_model_mixup_alpha=case.get("ref_model_mixup_alpha", 0.6),
                          optim=case.get("optim", "adamw_torch"), weight_decay=case.get("weight_decay", 0.0))
        trainer = GRPOTrainer(model=folder, reward_funcs=given, args=args, processing_class=tokenizer,
                              train_dataset=Dataset.from_dict({"prompt": ["t10 t11 t12", "t13 t14"]}),
                              rollout_func=rollout_func)
        trainer.train()
        state = {k: v.detach().contiguous() for k, v in trainer.model.state_dict().items()}
        save_file(state, os.path.join(OUT, case["name"] + ".safetensors"))
    with open(os.path.join(OUT, "rollouts.jsonl"), "w") as f:
        for r in ROWS:
            f.write(json.dumps({"prompt_ids": r["prompt_ids"], "completion_ids": r["completion_ids"],
                                "env_mask": r["env_mask"], "rewards": {"given": r["reward"]}}) + "\n")
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(CASES, f)
    print(f"TRL multi-turn updates written to {OUT}")


if __name__ == "__main__":
    main()
