"""Grove's weight-decay flags against transformers' Trainer.get_decay_parameter_names.
    check_weight_decay.py FLAGS.json      FLAGS: {checkpoint_dir: {tensor name: decays}}"""
import json
import sys

from transformers import AutoModelForCausalLM, Trainer

failures, checked = [], 0
for directory, flags in json.load(open(sys.argv[1])).items():
    model = AutoModelForCausalLM.from_pretrained(directory)
    names = {n for n, _ in model.named_parameters()}
    decayed = set(Trainer.get_decay_parameter_names(None, model))
    for name, grove_decays in flags.items():
        if name not in names:
            failures.append(f"{directory}: transformers has no parameter {name}")
        elif grove_decays != (name in decayed):
            failures.append(f"{directory}: {name}: transformers decays it: {name in decayed}, Grove: {grove_decays}")
        checked += 1
if failures:
    sys.exit("\n".join(failures))
print(f"{checked} tensors: Grove decays what transformers decays")
