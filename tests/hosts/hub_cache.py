"""Models named by Hub id, found in a local Hugging Face cache laid out as huggingface_hub lays it out
(blobs, snapshots of symlinks, refs): Grove picks the snapshot folder snapshot_download(...,
local_files_only=True) picks for each revision, and `grove generate` on the id decodes what
transformers' from_pretrained(id) decodes. A folder of that name wins over the cache; an id in
neither place is an error that names the cache.
    hub_cache.py GROVE TINY_MODELS_DIR MANIFEST"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

grove, models, manifest = sys.argv[1:4]
work = tempfile.mkdtemp()
cache = os.path.join(work, "hub")
# before huggingface_hub reads them, at import
env = dict(os.environ, HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
os.environ.update(env)

import torch  # noqa: E402
from huggingface_hub import snapshot_download  # noqa: E402
from peft import AutoPeftModelForCausalLM  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
repo_id = "grove-test/tiny-chat"
storage = os.path.join(cache, "models--grove-test--tiny-chat")
main_commit, tag_commit = "1" * 40, "2" * 40


def add_snapshot(commit, source, repository=storage):
    """snapshots/COMMIT/FILE -> ../../blobs/HASH, as huggingface_hub writes them"""
    os.makedirs(os.path.join(repository, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(repository, "snapshots", commit))
    for name in os.listdir(source):
        data = open(os.path.join(source, name), "rb").read()
        blob = hashlib.sha256(data).hexdigest()
        with open(os.path.join(repository, "blobs", blob), "wb") as f:
            f.write(data)
        os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(repository, "snapshots", commit, name))


add_snapshot(main_commit, os.path.join(models, "llama_gqa"))
add_snapshot(tag_commit, os.path.join(models, "mistral_mha"))
os.makedirs(os.path.join(storage, "refs"))
for ref, commit in (("main", main_commit), ("v1", tag_commit)):
    with open(os.path.join(storage, "refs", ref), "w") as f:
        f.write(commit)


def run(*args, cwd=None):
    return subprocess.run([grove, *args], capture_output=True, text=True, env=env, cwd=cwd)


def resolved_model_path(*overrides, cwd=None):
    sets = [arg for pair in overrides for arg in ("--set", pair)]
    r = run("check", os.path.abspath(manifest), *sets, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    line = next(l for l in lines[lines.index("[model]"):] if l.startswith("path = "))
    return line.split("'")[1]


# the revision's snapshot: a branch, a tag, a commit
for revision in ("main", "v1", tag_commit):
    expected = snapshot_download(repo_id, revision=revision, local_files_only=True)
    got = resolved_model_path(f"model.path={repo_id}", f"model.revision={revision}")
    assert os.path.realpath(got) == os.path.realpath(expected), f"revision {revision}: grove {got}, huggingface_hub {expected}"
    print(f"revision {revision}: {got}")

# generate on the id: transformers' greedy tokens from the same cached model
tokenizer = AutoTokenizer.from_pretrained(repo_id)
model = AutoModelForCausalLM.from_pretrained(repo_id, dtype=torch.float32)
ids = tokenizer("What is 2 + 2?", return_tensors="pt").input_ids
reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)[0, ids.shape[1]:].tolist()
r = run("generate", "--model", repo_id, "--prompt", "What is 2 + 2?", "--greedy", "--max-new-tokens", "8", "--json",
        "--device", "cpu")
assert r.returncode == 0, r.stdout + r.stderr
row = json.loads(r.stdout)
assert row["prompt_ids"] == ids[0].tolist(), (row["prompt_ids"], ids[0].tolist())
assert row["completion_ids"] == reference, (row["completion_ids"], reference)
print(f"grove generate --model {repo_id}: {row['completion_ids']} as transformers")

# a revision the cache lacks, or a revision with a folder, is refused with the key
r = run("check", manifest, "--set", f"model.path={repo_id}", "--set", "model.revision=v2")
assert r.returncode == 3 and "holds no revision v2 of grove-test/tiny-chat" in r.stderr, r.stderr
r = run("check", manifest, "--set", f"model.path={os.path.join(models, 'llama_gqa')}", "--set", "model.revision=v1")
assert r.returncode == 3 and "is a folder, not a Hub id; leave the revision out" in r.stderr, r.stderr
print("a revision the cache lacks, and a revision with a folder: exit 3")

# a reward model named by Hub id takes its revision too ([[rewards]] revision): main and v1 are two
# architectures here, so the plugins line says which snapshot loaded
reward_storage = os.path.join(cache, "models--grove-test--tiny-reward")
add_snapshot(main_commit, os.path.join(models, "llama_reward"), reward_storage)
add_snapshot(tag_commit, os.path.join(models, "qwen2_reward"), reward_storage)
os.makedirs(os.path.join(reward_storage, "refs"))
for ref, commit in (("main", main_commit), ("v1", tag_commit)):
    with open(os.path.join(reward_storage, "refs", ref), "w") as f:
        f.write(commit)
with open(os.path.join(work, "prompts.jsonl"), "w") as f:
    f.write('{"prompt": "What is 2 + 2?"}\n')


def check_reward(reward_lines):
    with open(os.path.join(work, "reward.toml"), "w") as f:
        f.write(f'[model]\npath = "{os.path.join(models, "llama_gqa")}"\nchat_template = "none"\n'
                f'[data]\nsource = "prompts.jsonl"\n[[rewards]]\n{reward_lines}\n')
    return run("check", os.path.join(work, "reward.toml"))


for revision, architecture in (("main", "LlamaForSequenceClassification"), ("v1", "Qwen2ForSequenceClassification")):
    r = check_reward(f'model = "grove-test/tiny-reward"\nrevision = "{revision}"')
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("#   reward "))
    expected = snapshot_download("grove-test/tiny-reward", revision=revision, local_files_only=True)
    assert line.split()[2:4] == ["tiny-reward", architecture], line
    assert os.path.realpath(line.split()[4]) == os.path.realpath(expected), (line, expected)
    print(f"reward model at {revision}: {architecture} from {line.split()[4]}")
r = check_reward('model = "grove-test/tiny-reward"\nrevision = "v2"')
assert r.returncode == 3 and 'rewards.0.revision = "v2": the local Hugging Face cache' in r.stderr, r.stderr
assert "holds no revision v2 of grove-test/tiny-reward" in r.stderr, r.stderr
r = check_reward('plugin = "format"\nrevision = "v1"')
assert r.returncode == 3 and "rewards.0.revision names the Hub revision of a reward model" in r.stderr, r.stderr
print("a reward model's revision the cache lacks, and a plugin's revision: exit 3")

# the command line's --revision: generate on the tag decodes as transformers' from_pretrained(id,
# revision="v1"); logprobs scores its tokens as that model does; the same refusals, as usage errors
tagged = AutoModelForCausalLM.from_pretrained(repo_id, revision="v1", dtype=torch.float32)
ids = AutoTokenizer.from_pretrained(repo_id, revision="v1")("What is 2 + 2?", return_tensors="pt").input_ids
reference = tagged.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                            do_sample=False)[0, ids.shape[1]:].tolist()
r = run("generate", "--model", repo_id, "--revision", "v1", "--prompt", "What is 2 + 2?", "--greedy", "--max-new-tokens",
        "8", "--json", "--device", "cpu")
assert r.returncode == 0, r.stdout + r.stderr
assert json.loads(r.stdout)["completion_ids"] == reference, (r.stdout, reference)
rows = os.path.join(work, "rows.jsonl")
with open(rows, "w") as f:
    f.write(json.dumps({"prompt_ids": ids[0].tolist(), "completion_ids": reference}) + "\n")
r = run("logprobs", "--model", repo_id, "--revision", tag_commit, "--input", rows, "--device", "cpu")
assert r.returncode == 0, r.stdout + r.stderr
with torch.no_grad():
    full = torch.tensor([ids[0].tolist() + reference])
    expected = torch.log_softmax(tagged(full).logits[0, ids.shape[1] - 1:-1], -1).gather(
        -1, torch.tensor(reference)[:, None])[:, 0]
got = torch.tensor(json.loads(r.stdout)["logprobs"])
assert (got - expected).abs().max() < 1e-4, (got, expected)
for model_arg, revision, words in ((repo_id, "v2", "holds no revision v2 of grove-test/tiny-chat"),
                                   (os.path.join(models, "llama_gqa"), "v1", "is a folder, not a Hub id")):
    r = run("generate", "--model", model_arg, "--revision", revision, "--prompt", "hi")
    assert r.returncode == 2 and f"--revision {revision}: " in r.stderr and words in r.stderr, (r.returncode, r.stderr)
print(f"--revision v1: generate decodes as transformers at v1 ({reference}); logprobs at the tag's commit within 1e-4; "
      "refusals exit 2")

# a LoRA adapter trained on the id at tag v1 names its base by the id and commit, as PEFT does:
# AutoPeftModelForCausalLM loads that base from the cache, and grove generate on the adapter (merged
# in memory) decodes the same
run_dir = os.path.join(work, "lora")
os.makedirs(run_dir)
with open(os.path.join(run_dir, "pairs.jsonl"), "w") as f:
    for i in range(8):
        f.write(json.dumps({"prompt": f"What is {i} + 2?", "completion": f" {i + 2}"}) + "\n")
with open(os.path.join(run_dir, "sft.toml"), "w") as f:
    f.write(f"""[model]\npath = "{repo_id}"\nrevision = "v1"\nchat_template = "none"\n[data]\nsource = "pairs.jsonl"\n
[[rewards]]\nplugin = "correctness"\n[generation]\nnum_generations = 4\n
[adapter]\nplugin = "lora"\nconfig = {{ r = 4, alpha = 8, target_modules = ["q_proj", "v_proj"] }}\n
[train]\nper_device_train_batch_size = 4\nlearning_rate = 5e-2\nmax_steps = 3\n[output]\ndir = "out"\n""")
r = run("sft", os.path.join(run_dir, "sft.toml"))
assert r.returncode == 0, r.stdout + r.stderr
adapter = os.path.join(run_dir, "out")
adapter_config = json.load(open(os.path.join(adapter, "adapter_config.json")))
assert (adapter_config["base_model_name_or_path"], adapter_config["revision"]) == (repo_id, tag_commit), adapter_config
ids = AutoTokenizer.from_pretrained(repo_id, revision="v1")("What is 2 + 2?", return_tensors="pt").input_ids
peft_model = AutoPeftModelForCausalLM.from_pretrained(adapter, dtype=torch.float32)
reference = peft_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                do_sample=False)[0, ids.shape[1]:].tolist()
r = run("generate", "--model", adapter, "--prompt", "What is 2 + 2?", "--greedy", "--max-new-tokens", "8", "--json",
        "--device", "cpu")
assert r.returncode == 0, r.stdout + r.stderr
assert json.loads(r.stdout)["completion_ids"] == reference, (r.stdout, reference)
print(f"LoRA on {repo_id} at v1: adapter_config names it and the commit; PEFT and grove generate agree: {reference}")

# grove export merges onto that same base (the tag's commit, not main, which holds another model):
# without --base, and with --base naming the id; PEFT's merge_and_unload of the adapter is the reference
from safetensors.torch import load_file  # noqa: E402
merged = peft_model.merge_and_unload().state_dict()
for base_args in ([], ["--base", repo_id]):
    out = os.path.join(run_dir, f"merged{len(base_args)}")
    r = run("export", "--merge", adapter, *base_args, out)
    assert r.returncode == 0, r.stdout + r.stderr
    exported = load_file(os.path.join(out, "model.safetensors"))
    assert set(exported) <= set(merged), set(exported) - set(merged)
    worst = max((exported[k].float() - merged[k].float()).abs().max().item() for k in exported)
    assert worst < 1e-6, (base_args, worst)
r = run("export", "--merge", adapter, "--revision", "v1", os.path.join(run_dir, "merged_bad"))
assert r.returncode == 2 and "--revision goes with --base" in r.stderr, (r.returncode, r.stderr)
print(f"grove export of the adapter, with and without --base {repo_id}: PEFT's merged weights (within 1e-6)")

# a resumed run keeps the snapshot it started from when the revision has moved since: v1 moves to
# another model between a run and its resume from checkpoint-2, and the resumed run still ends with
# the adapter a straight run on the old v1 ends with, bit for bit
def sft_run(name, *extra):
    with open(os.path.join(run_dir, "sft.toml")) as f:
        body = f.read().replace('dir = "out"', f'dir = "{name}"\nsave_steps = 2').replace("max_steps = 3", "max_steps = 4")
    with open(os.path.join(run_dir, f"{name}.toml"), "w") as f:
        f.write(body)
    r = run("sft", os.path.join(run_dir, f"{name}.toml"), *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stderr


def adapter_weights(name):
    from safetensors.torch import load_file
    return load_file(os.path.join(run_dir, name, "adapter_model.safetensors"))


sft_run("straight")
said = sft_run("moved")
assert "resuming on" not in said, said
moved_commit = "3" * 40
add_snapshot(moved_commit, os.path.join(models, "llama_gqa"))
with open(os.path.join(storage, "refs", "v1"), "w") as f:
    f.write(moved_commit)
said = sft_run("moved", "--resume", os.path.join(run_dir, "moved", "checkpoint-2"))
with open(os.path.join(storage, "refs", "v1"), "w") as f:
    f.write(tag_commit)
assert f"grove: note: resuming on {repo_id} at {tag_commit}" in said and moved_commit in said, said
assert "settings changed" not in said, said
straight, resumed = adapter_weights("straight"), adapter_weights("moved")
assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight), \
    "the resumed adapter differs from the straight run's"
kept = json.load(open(os.path.join(run_dir, "moved", "adapter_config.json")))["revision"]
assert kept == tag_commit, kept
print(f"v1 moved to {moved_commit[:8]} before --resume: the run kept {tag_commit[:8]}; its adapter equals the straight "
      f"run's ({len(straight)} tensors)")

# ... and when the snapshot it started from has since left the cache, the resume is refused (exit 5),
# naming the commit and how to put it back, rather than going on from another base
sft_run("gone")
metrics_before = open(os.path.join(run_dir, "gone", "metrics.jsonl")).read()
snapshot = os.path.join(storage, "snapshots", tag_commit)
os.rename(snapshot, snapshot + ".away")
with open(os.path.join(storage, "refs", "v1"), "w") as f:
    f.write(moved_commit)
r = run("sft", os.path.join(run_dir, "gone.toml"), "--resume", os.path.join(run_dir, "gone", "checkpoint-2"))
with open(os.path.join(storage, "refs", "v1"), "w") as f:
    f.write(tag_commit)
os.rename(snapshot + ".away", snapshot)
message = r.stderr + r.stdout
assert r.returncode == 5 and f"hf download {repo_id} --revision {tag_commit}" in message, (r.returncode, message)
assert open(os.path.join(run_dir, "gone", "metrics.jsonl")).read() == metrics_before, "a step ran on the other base"
print(f"its snapshot gone from the cache before --resume: exit 5, {message.strip()}")

# a folder of the id's name next to the manifest wins over the cache
local = os.path.join(work, "manifest")
shutil.copytree(os.path.dirname(os.path.abspath(manifest)), local)
shutil.copytree(os.path.join(models, "olmo2_post_norm"), os.path.join(local, repo_id))
manifest = os.path.join(local, os.path.basename(manifest))
got = resolved_model_path(f"model.path={repo_id}")
assert os.path.realpath(got) == os.path.realpath(os.path.join(local, repo_id)), got
print(f"a folder named {repo_id} next to the manifest: {got}")

# neither a folder nor cached: exit 5, naming the cache
r = run("generate", "--model", "grove-test/absent", "--prompt", "hi")
message = r.stderr + r.stdout
assert r.returncode == 5 and "no such folder" in message and cache in message, (r.returncode, message)
print(f"an id the cache lacks: exit 5, {message.strip()}")

# the cache folder under huggingface_hub's variables, "~" and "$VAR" included: as huggingface_hub's
# constants.HF_HUB_CACHE (Grove names it in the message for an id it does not find)
plain = {k: v for k, v in os.environ.items()
         if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
plain["HOME"] = os.path.join(work, "home")
for variables in ({}, {"XDG_CACHE_HOME": f"{work}/xdg"}, {"HF_HOME": "~/hf"}, {"HF_HOME": "$GROVE_T/hf", "GROVE_T": work},
                  {"HUGGINGFACE_HUB_CACHE": "${GROVE_T}/old", "GROVE_T": work},
                  {"HF_HUB_CACHE": "~/new", "HUGGINGFACE_HUB_CACHE": "/old"}, {"HOME": None}):
    variant = dict(plain, **variables)
    if variables.get("HOME") is None and "HOME" in variables:  # unset: the password database's home, as Python's
        del variant["HOME"]
    expected = subprocess.run([sys.executable, "-c", "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"],
                              capture_output=True, text=True, env=variant, check=True).stdout.strip()
    said = subprocess.run([grove, "generate", "--model", "grove-test/absent", "--prompt", "hi"], capture_output=True,
                          text=True, env=variant).stderr
    got = said.split("Hugging Face cache (", 1)[1].split("; `hf download", 1)[0]
    assert got == expected, (variables, got, expected)
    print(f"cache folder with {variables}: {got}")
shutil.rmtree(work)
