"""Several environments in one run train as TRL 1.16 trains them with environment_factory={name:
factory}: each row's `environment` column chooses its class, the row's prompt shows that class's
tools only, reset() gets the row's other columns, and each class with get_reward() scores its own
rows (NaN elsewhere). And again on a dataset without prompts: each class's reset() writes the
prompt (and gets no `prompt`), into one empty user message.

The reference is TRL's own GRPOTrainer, trained for one step on the tiny checkpoint with
{"meter": Meter, "scale": Scale, "notes": Notes, "dial": Dial} (tests/plugins/python/several_environments.py):
the prompt ids it generated from, and the logged reward (each row's weighted sum, where the
classes' columns are NaN on the other classes' rows). `grove train` runs the same with
`classes = { meter = "Meter", ... }`; its saved rollouts must start from TRL's prompt ids, row for
row, and its logged reward and reward_std must be TRL's, and so must each class's column
(rewards/NAME/mean and /std, NaN on the other classes' rows). A row naming no environment, or an unknown one, is refused naming the row.

usage: check_several_environments.py GROVE MODEL_DIR WORK_DIR
"""

import json
import math
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(sys.prefix, "transformers5-site"))  # TRL's environment_factory needs transformers 5

CLASSES = {"meter": "Meter", "scale": "Scale", "notes": "Notes", "dial": "Dial"}
ROWS = [{"prompt": [{"role": "user", "content": f"Measure {n}."}], "target": n, "environment": name}
        for n, name in enumerate(["meter", "scale", "notes", "meter"])]
# a dataset without prompts: each class's reset() (which then gets none) writes it (the datasets library
# gives a file's rows the union of their columns, so TRL takes rows without one only in such a dataset)
ROWS_WITHOUT_PROMPTS = [{"target": n, "environment": "dial"} for n in (4, 7)]


def trl_run(model, work, rows):
    import transformers
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import several_environments

    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5.jinja")) as f:
        tokenizer.chat_template = f.read()
    prompts = []
    original_generate = GRPOTrainer._generate

    def recording_generate(self, batch):
        result = original_generate(self, batch)
        prompts.extend(list(p) for p in result[0])
        return result

    GRPOTrainer._generate = recording_generate
    args = GRPOConfig(output_dir=os.path.join(work, "trl"), num_generations=2, per_device_train_batch_size=2 * len(rows),
                      max_completion_length=8, max_steps=1, report_to="none", use_cpu=True, bf16=False, logging_steps=1,
                      save_strategy="no")
    factories = {name: getattr(several_environments, cls) for name, cls in CLASSES.items()}
    trainer = GRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          environment_factory=factories)
    trainer.train()
    GRPOTrainer._generate = original_generate
    metrics = next(entry for entry in trainer.state.log_history if "reward" in entry)
    print(f"TRL {trl.__version__}: columns {trainer.reward_func_names}, reward {metrics['reward']}")
    return prompts, metrics


def write_run(work, rows):
    run = os.path.join(work, "grove")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    with open(os.path.join(run, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return run


def grove(grove_binary, model, run, command="train", rows=ROWS):
    classes = ", ".join(f'{name} = "{cls}"' for name, cls in CLASSES.items())
    with open(os.path.join(run, "grove.toml"), "w") as f:
        f.write(f'''[model]
path = "{model}"
chat_template = "chatml"
[data]
source = "prompts.jsonl"
[generation]
num_generations = 2
max_completion_length = 8
[train]
per_device_train_batch_size = {2 * len(rows)}
max_steps = 1
[output]
dir = "out"
[logging]
save_rollouts = true
[environment]
plugin = "python_environment"
config = {{ module = "{HERE}/several_environments.py", classes = {{ {classes} }} }}
''')
    return subprocess.run([grove_binary, command, os.path.join(run, "grove.toml")], capture_output=True, text=True)


def check_eval_of_mixed_rows(grove_binary, model, work):
    """grove eval takes a file mixing rows with and without prompts (32 samples each, so that the last
    row is a batch of its own: eval generates 64 completions at a time): each row's episodes start
    from its own prompt, written by Dial's reset() where the row has none, and are scored by its own
    class."""
    rows = ROWS_WITHOUT_PROMPTS + ROWS[1:2]
    samples = 32
    run = write_run(work, rows)
    checked = grove(grove_binary, model, run, "check", rows)  # writes the manifest, and checks the rows
    assert checked.returncode == 0, checked.stdout + checked.stderr
    out = subprocess.run([grove_binary, "eval", os.path.join(run, "grove.toml"), "--json", "--samples", str(samples),
                          "--max-new-tokens", "4"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    evaluated = json.loads(out.stdout[out.stdout.index("{"):])["rows"]
    expected = [("Turn the dial to 4.", "Dial", 0.4), ("Turn the dial to 7.", "Dial", 0.7), ("Measure 1.", "Scale", 0.25)]
    assert len(evaluated) == samples * len(expected), f"grove eval gave {len(evaluated)} rows"
    for i, row in enumerate(evaluated):
        text, column, reward = expected[i // samples]
        assert row["prompt"].endswith(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"), (i, row["prompt"])
        assert abs(row["rewards"][column] - reward) < 1e-6, (i, row["rewards"])
        assert all(same(v, None) for k, v in row["rewards"].items() if k != column), (i, row["rewards"])
    print(f"grove eval: {len(evaluated)} episodes of rows with and without prompts, each from its own prompt and class")


def check_refusals(grove_binary, model, work):
    """A row without the column, or naming no environment of the run, is refused, naming its line;
    and so is a run without data.source (TRL's environment_factory dict needs a train_dataset)."""
    for row, says in (({"prompt": "Hi", "target": 0}, 'which this row lacks; give it one of "dial", "meter", "notes", "scale"'),
                      ({"prompt": "Hi", "target": 0, "environment": "clock"},
                       '"environment" is "clock", which is none of the environments')):
        run = write_run(work, ROWS[:3] + [row])
        for command in ("check", "train"):
            out = grove(grove_binary, model, run, command)
            assert out.returncode != 0 and "prompts.jsonl:4" in out.stderr and says in out.stderr, (
                f"grove {command} with the row {row}: exit {out.returncode}\n{out.stderr}")
    manifest = os.path.join(run, "grove.toml")
    with open(manifest) as f:
        text = f.read()
    with open(manifest, "w") as f:
        f.write(text.replace('[data]\nsource = "prompts.jsonl"\n', ""))
    out = subprocess.run([grove_binary, "train", manifest], capture_output=True, text=True)
    says = 'several environments, chosen by each row\'s "environment" column, need data.source with that column'
    assert out.returncode != 0 and says in out.stderr, f"grove train without data.source: {out.returncode}\n{out.stderr}"


def main():
    grove_binary, model, work = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(work, exist_ok=True)
    for rows in (ROWS, ROWS_WITHOUT_PROMPTS):
        compare(grove_binary, model, work, rows)
    check_eval_of_mixed_rows(grove_binary, model, work)
    check_refusals(grove_binary, model, work)
    print("rows naming no environment or an unknown one refused by grove check and grove train")


def same(a, b):
    """Equal logged values; NaN (a class without rows in the batch; Grove's JSON writes it null) is NaN."""
    nan = [v is None or (isinstance(v, float) and math.isnan(v)) for v in (a, b)]
    return nan[0] == nan[1] and (nan[0] or abs(a - b) < 1e-6)


def compare(grove_binary, model, work, rows):
    trl_prompts, trl_metrics = trl_run(model, work, rows)
    run = write_run(work, rows)
    out = grove(grove_binary, model, run, rows=rows)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(run, "out", "rollouts.jsonl")) as f:
        rollouts = [json.loads(line) for line in f]
    with open(os.path.join(run, "out", "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f][-1]
    grove_prompts = sorted(r["prompt_ids"] for r in rollouts)
    assert grove_prompts == sorted(trl_prompts), "Grove's prompts are not TRL's: each row should show its class's tools"
    assert len({tuple(p) for p in grove_prompts}) == len(rows), "the rows' prompts should differ (tools and targets)"
    keys = ["reward", "reward_std"] + [f"rewards/{c}/{s}" for c in ("Dial", "Meter", "Scale") for s in ("mean", "std")]
    for key in keys:
        assert key in metrics and key in trl_metrics, f"{key}: TRL logged {sorted(trl_metrics)}, Grove {sorted(metrics)}"
        assert same(metrics[key], trl_metrics[key]), f"{key}: TRL {trl_metrics[key]}, Grove {metrics[key]}"
    given = "the dataset's prompts" if all("prompt" in row for row in rows) else "prompts reset() wrote (none in the dataset)"
    print(f"Grove: {len(rollouts)} rows from TRL's prompt ids ({given}), each with its class's tools; reward "
          f"{metrics['reward']:.4f} (TRL {trl_metrics['reward']:.4f}), reward_std {metrics['reward_std']:.4f} "
          f"(TRL {trl_metrics['reward_std']:.4f}); per class (Grove / TRL): " +
          ", ".join(f"{c} {metrics[f'rewards/{c}/mean']} / {trl_metrics[f'rewards/{c}/mean']}" for c in ("Dial", "Meter", "Scale")))


if __name__ == "__main__":
    main()
