"""A resume names a reward column that a plugin added or took away since the checkpoint: a TRL
environment class that gained get_reward() is a new column, weight 1 (as TRL makes it), which
changes every advantage, yet no line of the manifest changed to show it.

`grove train` runs a step with an environment class without get_reward() and saves; the class then
gains get_reward(), and the resumed run must warn with the columns before and after. Resumed with
nothing changed, it must not warn.

usage: check_resume_reward_columns.py GROVE MODEL_DIR WORK_DIR
"""

import json
import os
import shutil
import subprocess
import sys

CLASS = '''
class Tally:
    def reset(self, **kwargs):
        self.count = 0

    def count_up(self) -> int:
        """Counts one up.

        Returns:
            The count.
        """
        self.count += 1
        return self.count
'''
GET_REWARD = '''
    def get_reward(self):
        return float(self.count)
'''


def train(grove, run, steps, resume):
    command = [grove, "train", os.path.join(run, "grove.toml"), "--set", f"train.max_steps={steps}"]
    out = subprocess.run(command + (["--resume"] if resume else []), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stderr


def main():
    grove, model, work = (os.path.abspath(a) for a in sys.argv[1:4])
    run = os.path.join(work, "run")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    with open(os.path.join(run, "tally.py"), "w") as f:
        f.write(CLASS)
    with open(os.path.join(run, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": [{"role": "user", "content": f"Count {n}."}]}) + "\n" for n in range(4))
    with open(os.path.join(run, "grove.toml"), "w") as f:
        f.write(f'''[model]
path = "{model}"
chat_template = "chatml"
[data]
source = "prompts.jsonl"
[generation]
num_generations = 2
max_completion_length = 4
[train]
per_device_train_batch_size = 4
[output]
dir = "out"
save_steps = 1
[[rewards]]
plugin = "format"
[environment]
plugin = "python_environment"
config = {{ module = "tally.py", class = "Tally" }}
''')
    train(grove, run, 1, resume=False)
    quiet = train(grove, run, 2, resume=True)
    assert "reward columns" not in quiet, f"nothing changed, yet the resume said:\n{quiet}"
    with open(os.path.join(run, "tally.py"), "a") as f:
        f.write(GET_REWARD)
    told = train(grove, run, 3, resume=True)
    expected = "reward columns (name: weight): [format: 1.0] -> [format: 1.0, Tally: 1.0]"
    assert expected in told, f"the resume after Tally gained get_reward() said:\n{told}"
    print(f"the resume names the column get_reward() added: {expected}")


if __name__ == "__main__":
    main()
