"""A TRL environment's get_reward() is a reward as TRL 1.16 makes it: GRPOTrainer, given an
environment_factory whose class defines get_reward(), adds it to the reward functions with weight 1,
named after the class. Grove's python_environment plugin says the same of such a class (SDK
episode_reward), so a manifest with the class and [[rewards]] but no [environment] reward_weight
trains on both columns.

The reference is TRL's own GRPOTrainer, built (not trained) on the same tiny checkpoint with the
same reward function, weights and class: its reward_func_names and reward_weights. `grove train`
runs one step of the equivalent manifest; its logged columns must be those names, and its logged
reward the sum of their means with those weights (every episode is scored, so the mean of the
weighted sums is the weighted sum of the means).

usage: check_environment_reward.py GROVE MODEL_DIR WORK_DIR
"""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# TRL's environment_factory needs transformers >= 5.2; the tests' own is 4.57, and .ci/deps.sh
# installs 5 beside it
sys.path.insert(0, os.path.join(sys.prefix, "transformers5-site"))

REWARDS = '''
def has_vowel(completions, **kwargs):
    return [float(any(v in c[0]["content"] if isinstance(c, list) else v in c for v in "aeiou")) for c in completions]
'''
WEIGHT = 0.5
# the tiny model calls no tool, so a Counter episode is 1 where the target is its starting 0: the
# column's mean is 1/4, and its weight shows in the logged reward
ROWS = [{"prompt": [{"role": "user", "content": f"Count to {n}."}], "target": n} for n in range(4)]


def trl_columns(model, work):
    import transformers
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from environments import Counter

    namespace = {}
    exec(REWARDS, namespace)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5.jinja")) as f:
        tokenizer.chat_template = f.read()  # the tiny checkpoint's own template writes no tools
    args = GRPOConfig(output_dir=os.path.join(work, "trl"), num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=8, reward_weights=[WEIGHT], max_steps=1, report_to="none",
                      use_cpu=True, bf16=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[namespace["has_vowel"]], args=args,
                          train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer, environment_factory=Counter)
    print(f"TRL {trl.__version__}, transformers {transformers.__version__}: columns {trainer.reward_func_names}, "
          f"weights {trainer.reward_weights.tolist()}")
    return dict(zip(trainer.reward_func_names, trainer.reward_weights.tolist(), strict=True))


def grove_metrics(grove, model, work):
    run = os.path.join(work, "grove")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    with open(os.path.join(run, "rewards.py"), "w") as f:
        f.write(REWARDS)
    with open(os.path.join(run, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)
    with open(os.path.join(run, "grove.toml"), "w") as f:
        f.write(f'''[model]
path = "{model}"
chat_template = "chatml"
[data]
source = "prompts.jsonl"
[generation]
num_generations = 2
max_completion_length = 24
[train]
per_device_train_batch_size = 8
max_steps = 1
[output]
dir = "out"
[[rewards]]
plugin = "python"
weight = {WEIGHT}
config = {{ module = "rewards.py", function = "has_vowel" }}
[environment]
plugin = "python_environment"
config = {{ module = "{HERE}/environments.py", class = "Counter" }}
''')
    out = subprocess.run([grove, "train", os.path.join(run, "grove.toml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f][-1]


def main():
    grove, model, work = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(work, exist_ok=True)
    expected = trl_columns(model, work)
    metrics = grove_metrics(grove, model, work)
    logged = {key[len("rewards/"):-len("/mean")] for key in metrics if key.startswith("rewards/") and key.endswith("/mean")}
    assert logged == set(expected), f"Grove logged reward columns {sorted(logged)}, TRL has {sorted(expected)}"
    assert metrics["rewards/Counter/mean"] > 0, "no episode reached its target: the weights below prove nothing"
    weighted = sum(w * metrics[f"rewards/{name}/mean"] for name, w in expected.items())
    assert abs(metrics["reward"] - weighted) < 1e-5, f"reward {metrics['reward']}, TRL's weights give {weighted}"
    print(f"Grove: columns {sorted(logged)}, reward {metrics['reward']:.4f} = weighted sum of the means {weighted:.4f}")


if __name__ == "__main__":
    main()
