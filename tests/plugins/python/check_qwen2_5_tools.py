"""A TRL environment's tools reach the model as Qwen2.5's chat template writes them, and its tool
turns are what that template renders for tool messages.

The reference is the original Qwen2.5 template that TRL ships (trl/chat_templates/qwen2_5.jinja),
rendered by transformers' apply_chat_template:
1. prompts: `grove generate --environment python_environment` renders a conversation with the
   environment's tools exactly as apply_chat_template(messages, tools=<its methods>) does, with and
   without a system message;
2. tool turns: a conversation with an assistant message holding tool calls, then the tool messages
   and the generation prompt, equals the conversation up to the assistant's <|im_end|> (what the
   model wrote, ending with EOS) followed by the observation the bridge (plugins/python/bridge.py,
   loaded from the source tree) answers those calls with.

usage: check_qwen2_5_tools.py GROVE MODEL_DIR WORK_DIR
"""

import importlib.util
import json
import os
import subprocess
import sys

import trl
from transformers import AutoTokenizer
from transformers.utils import get_json_schema

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def load_bridge():
    spec = importlib.util.spec_from_file_location("grove_python_bridge", os.path.join(SOURCE, "plugins/python/bridge.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_prompts(grove, model, work, template, tokenizer, bridge):
    sys.path.insert(0, HERE)
    from environments import Counter

    instance = Counter()
    # TRL's tools are the bound methods, by name; transformers 4.57 takes only plain functions or
    # schemas, so they go in as the schemas its get_json_schema makes (what newer versions do inside)
    tools = [get_json_schema(getattr(instance, name)) for name in bridge._public_methods(instance)]
    conversations = [
        [{"role": "user", "content": "Count to 7"}],
        [{"role": "system", "content": "You count with tools."}, {"role": "user", "content": "Count to 7, é 中"}],
    ]
    rows = os.path.join(work, "tool_prompts.jsonl")
    with open(rows, "w") as f:
        f.writelines(json.dumps({"prompt": c, "target": 7}) + "\n" for c in conversations)
    out = subprocess.run([grove, "generate", "--model", model, "--input", rows, "--chat-template", "chatml",
                          "--max-new-tokens", "2", "--max-turns", "1", "--json", "--environment", "python_environment",
                          "--environment-config", f'module = "{HERE}/environments.py"\nclass = "Counter"'],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = [json.loads(line)["prompt"] for line in out.stdout.splitlines()]
    for conversation, prompt in zip(conversations, got, strict=True):
        expected = tokenizer.apply_chat_template(conversation, tools=tools, chat_template=template, tokenize=False,
                                                 add_generation_prompt=True)
        assert prompt == expected, f"\ngrove:    {prompt!r}\ntemplate: {expected!r}"
    print(f"ok   {len(got)} prompts with the environment's {len(tools)} tools equal Qwen2.5's template rendering")


def main():
    grove, model, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    template = open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5.jinja")).read()
    tokenizer = AutoTokenizer.from_pretrained(model)
    bridge = load_bridge()
    check_prompts(grove, model, work, template, tokenizer, bridge)
    env = bridge.Environment(os.path.join(HERE, "environments.py"), "Counter", "", HERE)
    prompt = [{"role": "user", "content": "Count to 7"}]
    calls = [("add", {"amount": 2}), ("echo_prompt", {}), ("subtract", {"amount": 1})]
    assistant = {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls],
    }
    results = ["2", "Count to 7", "{'error': 'Tool subtract not found.'}"]
    tools = [{"role": "tool", "name": n, "content": r} for (n, _), r in zip(calls, results)]

    def render(messages, generation_prompt):
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=generation_prompt)

    before = render(prompt + [assistant], False)
    full = render(prompt + [assistant] + tools, True)
    assert before.endswith("<|im_end|>\n") and full.startswith(before), (before, full)
    # what the model wrote: the assistant message's text up to and with <|im_end|> (its EOS)
    turn = before[before.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):-1]
    row = (0, 1, turn, [1, 2], True, "rendered prompt", json.dumps({"target": 7}), json.dumps(prompt))
    env.begin([row[:2] + ("", [], False) + row[5:]], 0, 1)
    observation, done, tool_calls, failures = env.step([row], 0, 1)[0]
    expected = full[len(before) - 1:]
    assert observation == expected, f"\nbridge:   {observation!r}\ntemplate: {expected!r}"
    assert (done, tool_calls, failures) == (False, 3, 1), (done, tool_calls, failures)
    print(f"ok   the tool turn for {len(calls)} calls equals Qwen2.5's template rendering: {observation!r}")


if __name__ == "__main__":
    main()
