"""A TRL environment's get_reward() is a reward as TRL 1.16 makes it, and reward functions get
TRL's `environments` argument as TRL passes it.

GRPOTrainer, given an environment_factory whose class defines get_reward(), adds it to the reward
functions with weight 1, named after the class. Grove's python_environment plugin says the same of
such a class (SDK episode_reward), so a manifest with the class and [[rewards]] but no
[environment] reward_weight trains on both columns. And TRL calls every reward function with
`environments`, the instance each completion's episode ran in, as the episode left it.

The reference is TRL's own GRPOTrainer, trained for one step on the same tiny checkpoint with the
same reward functions, weights and class: its reward_func_names, reward_weights and logged means.
`grove train` runs one step of the equivalent manifest; its logged columns must be those names, its
logged reward the sum of their means with those weights (every episode is scored, so the mean of
the weighted sums is the weighted sum of the means), and the rewards that read `environments` must
say in both what they say in TRL: every row's instance was reset with the row's target, and the
instance's get_reward() is the class's column row by row (equal means), in `grove eval` of the manifest too.

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


def target_seen(environments, target, **kwargs):
    return [float(e.target == t) for e, t in zip(environments, target)]


def environment_says(environments, **kwargs):
    return [e.get_reward() for e in environments]
'''
WEIGHTS = {"has_vowel": 0.5, "target_seen": 2.0, "environment_says": 0.25}
# the tiny model calls no tool, so a Counter episode is 1 where the target is its starting 0: the
# column's mean is 1/4, and its weight shows in the logged reward
ROWS = [{"prompt": [{"role": "user", "content": f"Count to {n}."}], "target": n} for n in range(4)]


def trl_run(model, work):
    """TRL's reward columns ({name: weight}) and its logged metrics after one step."""
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
    args = GRPOConfig(output_dir=os.path.join(work, "trl"), num_generations=2, per_device_train_batch_size=8,
                      max_completion_length=8, reward_weights=list(WEIGHTS.values()), max_steps=1, report_to="none",
                      use_cpu=True, bf16=False, logging_steps=1, save_strategy="no")
    trainer = GRPOTrainer(model=model, reward_funcs=[namespace[name] for name in WEIGHTS], args=args,
                          train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer, environment_factory=Counter)
    trainer.train()
    print(f"TRL {trl.__version__}, transformers {transformers.__version__}: columns {trainer.reward_func_names}, "
          f"weights {trainer.reward_weights.tolist()}")
    columns = dict(zip(trainer.reward_func_names, trainer.reward_weights.tolist(), strict=True))
    return columns, next(entry for entry in trainer.state.log_history if "reward" in entry)


def check_environments_argument(metrics, who):
    """The rewards that read `environments` say what they say in TRL."""
    assert metrics["rewards/target_seen/mean"] == 1.0, f"{who}: a row's environment was reset with another row's target"
    assert abs(metrics["rewards/environment_says/mean"] - metrics["rewards/Counter/mean"]) < 1e-6, (
        f"{who}: get_reward() through `environments` gives {metrics['rewards/environment_says/mean']}, "
        f"the class's column {metrics['rewards/Counter/mean']}")


def grove_metrics(grove, model, work):
    run = os.path.join(work, "grove")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    with open(os.path.join(run, "rewards.py"), "w") as f:
        f.write(REWARDS)
    with open(os.path.join(run, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)
    rewards = "".join(f'[[rewards]]\nplugin = "python"\nweight = {weight}\n'
                      f'config = {{ module = "rewards.py", function = "{name}" }}\n' for name, weight in WEIGHTS.items())
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
{rewards}[environment]
plugin = "python_environment"
config = {{ module = "{HERE}/environments.py", class = "Counter" }}
''')
    out = subprocess.run([grove, "train", os.path.join(run, "grove.toml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f][-1]


def grove_eval_means(grove, work):
    """`grove eval` of the same manifest: its mean per reward column, where the rewards get
    `environments` as in training."""
    manifest = os.path.join(work, "grove", "grove.toml")
    out = subprocess.run([grove, "eval", manifest, "--samples", "2", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return {f"rewards/{name}/mean": mean for name, mean in json.loads(out.stdout)["rewards"].items()}


def main():
    grove, model, work = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(work, exist_ok=True)
    expected, trl_metrics = trl_run(model, work)
    check_environments_argument(trl_metrics, "TRL")  # the reference behaves as this test says
    metrics = grove_metrics(grove, model, work)
    logged = {key[len("rewards/"):-len("/mean")] for key in metrics if key.startswith("rewards/") and key.endswith("/mean")}
    assert logged == set(expected), f"Grove logged reward columns {sorted(logged)}, TRL has {sorted(expected)}"
    assert metrics["rewards/Counter/mean"] > 0, "no episode reached its target: the weights below prove nothing"
    check_environments_argument(metrics, "Grove")
    check_environments_argument(grove_eval_means(grove, work), "grove eval")
    weighted = sum(w * metrics[f"rewards/{name}/mean"] for name, w in expected.items())
    assert abs(metrics["reward"] - weighted) < 1e-5, f"reward {metrics['reward']}, TRL's weights give {weighted}"
    means = {name: metrics[f"rewards/{name}/mean"] for name in expected}
    print(f"TRL: means {({name: trl_metrics[f'rewards/{name}/mean'] for name in expected})}")
    print(f"Grove: columns {sorted(logged)}, means {means}, reward {metrics['reward']:.4f} = weighted sum of the means "
          f"{weighted:.4f}")


if __name__ == "__main__":
    main()
