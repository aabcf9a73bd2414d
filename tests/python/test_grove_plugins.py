"""The grove_plugins package (python/): Grove's C reward plugins as TRL reward functions.

1. its ctypes structs have the sizes the C compiler gives the header (pinned in tests/sdk/c_layout.c);
2. its scores equal `grove plugins score` on the same rows, standard and conversational, metrics too;
3. bad configurations and failing calls raise PluginError with the plugin's message;
4. a real TRL GRPOTrainer step on a tiny model uses a Grove C plugin among its reward functions:
   TRL's logged reward mean is the mean of the plugin's scores of the completions TRL generated, and
   the values another C plugin logs per row (log_extra, in two calls) land in TRL's completions table.

usage: test_grove_plugins.py GROVE PLUGIN_DIR TINY_MODEL_DIR WORK_DIR MISBEHAVING_PLUGIN
"""

import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile

from grove_plugins import PluginError, _abi, reward_function

GROVE, PLUGINS, TINY_MODEL, WORK, MISBEHAVING = sys.argv[1:6]
os.makedirs(WORK, exist_ok=True)


def check_struct_sizes():
    pinned = {_abi.ErrorSink: 24, _abi.ConfigKey: 40, _abi.ConfigValue: 80, _abi.Config: 40, _abi.Descriptor: 128,
              _abi.PluginList: 24, _abi.HostApi: 32, _abi.Text: 16, _abi.RewardBatch: 120, _abi.RewardOutput: 56,
              _abi.RewardApi: 16}
    for struct, size in pinned.items():
        assert ctypes.sizeof(struct) == size, f"{struct.__name__}: {ctypes.sizeof(struct)} bytes, the header's is {size}"
    print(f"ok   {len(pinned)} ctypes structs have the header's sizes")


def grove_scores(plugin, config_toml, rows):
    path = os.path.join(WORK, "rows.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = subprocess.run([GROVE, "plugins", "score", plugin, "--input", path, "--config", config_toml],
                         capture_output=True, text=True, env={**os.environ, "GROVE_PLUGIN_PATH": PLUGINS})
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if '"row"' in line]
    return [line["score"] for line in lines], [line.get("metrics", {}) for line in lines]


def package_scores(plugin, config, rows):
    f = reward_function(plugin, config, plugin_dirs=[PLUGINS])
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("prompt", "completion", "completion_ids")}
    logged = {}
    scores = f(prompts=[r["prompt"] for r in rows], completions=[r["completion"] for r in rows],
               completion_ids=[r["completion_ids"] for r in rows] if "completion_ids" in rows[0] else None,
               log_metric=lambda name, value: logged.setdefault(name, value), **columns)
    return scores, logged


def same(a, b):
    """Equal as float32 (the ABI's type), None = not applicable."""
    f32 = lambda v: None if v is None else ctypes.c_float(v).value
    return [f32(x) for x in a] == [f32(x) for x in b]


def check_scores_equal_the_cli():
    standard = [
        {"prompt": "What is 2+2?", "completion": "<think>2 and 2</think><answer>4</answer>", "answer": "4",
         "completion_ids": [1] * 5},
        {"prompt": "What is 3+3?", "completion": "<answer>7</answer>", "answer": "6", "completion_ids": [2] * 12},
        {"prompt": "Name it.", "completion": "no tags at all", "answer": "x", "completion_ids": [3] * 20},
        {"prompt": "Name it.", "completion": "<think>é 中</think><answer>中</answer>", "answer": "中",
         "completion_ids": []},
    ]
    conversational = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "completion": [{"role": "assistant", "content": r["completion"]}],
         "answer": r["answer"], "completion_ids": r["completion_ids"]} for r in standard
    ]
    cases = [
        ("correctness", 'reference_column = "answer"', {"reference_column": "answer"}, standard),
        ("format", 'preset = "think_answer"', {"preset": "think_answer"}, standard),
        ("length_penalty", "max_length = 12\ncache = 8", {"max_length": 12, "cache": 8}, standard),
        ("correctness", 'reference_column = "answer"', {"reference_column": "answer"}, conversational),
        ("python", 'module = "trl.rewards"\nfunction = "think_format_reward"',
         {"module": "trl.rewards", "function": "think_format_reward"}, conversational),
    ]
    for plugin, toml, config, rows in cases:
        expected, expected_metrics = grove_scores(plugin, toml, rows)
        got, logged = package_scores(plugin, config, rows)
        assert same(got, expected), f"{plugin}: package {got}, grove plugins score {expected}"
        for metric in expected_metrics[0]:
            values = [m[metric] for m in expected_metrics if m[metric] is not None]
            mean = sum(values) / len(values)
            key = f"rewards/{plugin}/{metric}"
            assert abs(logged[key] - mean) < 1e-6, f"{key}: logged {logged.get(key)}, rows' mean {mean}"
        form = "conversational" if isinstance(rows[0]["prompt"], list) else "standard"
        print(f"ok   {plugin} ({form}): {got} = grove plugins score" + (f", metrics {logged}" if logged else ""))


def check_errors():
    def raises(fragment, make):
        try:
            make()
        except PluginError as error:
            assert fragment in str(error), f"expected '{fragment}' in: {error}"
            print(f"ok   PluginError: {str(error).splitlines()[0][:150]}")
            return
        raise AssertionError(f"no PluginError (expected '{fragment}')")

    raises("unknown key 'refernce_column'", lambda: reward_function("correctness", {"refernce_column": "a"},
                                                                     plugin_dirs=[PLUGINS]))
    raises("missing required key 'module'", lambda: reward_function("python", {"function": "f"}, plugin_dirs=[PLUGINS]))
    raises("has the wrong type", lambda: reward_function("length_penalty", {"max_length": "12", "cache": 2},
                                                         plugin_dirs=[PLUGINS]))
    raises("no reward plugin 'nonexistent'", lambda: reward_function("nonexistent", plugin_dirs=[PLUGINS]))
    raises("cache", lambda: reward_function("length_penalty", {"max_length": 4, "cache": 9}, plugin_dirs=[PLUGINS]))
    folder = tempfile.mkdtemp(dir=WORK)
    with open(os.path.join(folder, "failing.py"), "w") as f:
        f.write("def always_fails(completions, **kwargs):\n    raise RuntimeError('the judge is down')\n")
    failing = reward_function("python", {"module": os.path.join(folder, "failing.py"), "function": "always_fails"},
                              plugin_dirs=[PLUGINS])
    raises("RuntimeError: the judge is down", lambda: failing(prompts=["p"], completions=["c"]))


def check_trl_trains_with_a_grove_plugin():
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    class Recorded(reward_function):
        calls = []

        def __call__(self, prompts, completions, completion_ids=None, **kwargs):
            scores = super().__call__(prompts, completions, completion_ids, **kwargs)
            self.calls.append((list(completions), [list(ids) for ids in completion_ids], scores))
            return scores

    # the format plugin with a regex found in some of a random model's completions and not in others
    found = Recorded("format", {"pattern": "[0-4]", "full_match": False}, plugin_dirs=[PLUGINS])
    # a test plugin that scores every row 1 (no learning signal of its own) and logs each row's index
    # with log_extra in two calls: 0 and 1, then 2, 3 and "more"
    rows_logged = reward_function(MISBEHAVING, {"behaviour": "fine"})
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    rows = [{"prompt": f"What is {a} + {b}?"} for a in range(4) for b in range(2)]
    config = GRPOConfig(output_dir=os.path.join(WORK, "trl"), per_device_train_batch_size=8, num_generations=4,
                        max_completion_length=12, max_steps=1, learning_rate=1e-3, logging_steps=1, report_to=[],
                        use_cpu=True, seed=3, save_strategy="no")
    torch.manual_seed(3)
    trainer = GRPOTrainer(model=TINY_MODEL, processing_class=tokenizer, reward_funcs=[found, rows_logged], args=config,
                          train_dataset=Dataset.from_list(rows))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "rewards/format/mean" in entry]
    assert len(Recorded.calls) == 1 and logs, "TRL did not call the Grove plugin once and log it"
    completions, ids, scores = Recorded.calls[0]
    mean = sum(scores) / len(scores)
    assert abs(logs[0]["rewards/format/mean"] - mean) < 1e-6, (logs[0], scores)
    # the scores differ within a group, so they gave TRL a learning signal
    assert logs[0]["frac_reward_zero_std"] < 1 and logs[0]["grad_norm"] > 0, (scores, logs[0])
    # the plugin's scores of TRL's completions are what `grove plugins score` gives for them
    expected, _ = grove_scores("format", 'pattern = "[0-4]"\nfull_match = false',
                               [{"prompt": "", "completion": c, "completion_ids": i} for c, i in zip(completions, ids)])
    assert same(scores, expected), (scores, expected)
    extra = list(trainer._logs["extra"]["misbehaving/row"])  # TRL's completions-table column
    assert extra == [0, 1, 2, 3, "more"], extra
    print(f"ok   TRL GRPOTrainer trained a step with the Grove format plugin: scores {scores} (= grove plugins score), "
          f"rewards/format/mean {logs[0]['rewards/format/mean']:.4f}, grad_norm {logs[0]['grad_norm']:.4g}; "
          f"the other plugin's log_extra column in TRL's table: {extra}")


if __name__ == "__main__":
    check_struct_sizes()
    check_scores_equal_the_cli()
    check_errors()
    check_trl_trains_with_a_grove_plugin()
    print("grove_plugins: all checks passed")
