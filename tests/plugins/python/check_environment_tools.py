"""A TRL environment's tools reach the model as Qwen2.5's and Llama 3.1's chat templates write them,
and its tool turns are what those templates render for tool messages.

The references are the original templates that TRL ships (trl/chat_templates/qwen2_5.jinja and
llama3_1.jinja), rendered by transformers' apply_chat_template, each on its own:
1. prompts: `grove generate --environment python_environment` renders a conversation with the
   environment's tools exactly as apply_chat_template(messages, tools=<its tools>) does, with and
   without a system message: a class's methods, TRL's standalone functions (tools=[...]) before
   them, or the functions alone;
2. tool turns: a conversation with an assistant message holding tool calls, then the tool messages
   and the generation prompt, equals the conversation up to the end of the assistant's turn (what
   the model wrote, ending with EOS) followed by the observation the bridge (plugins/python/bridge.py,
   loaded from the source tree) answers those calls with, in TRL's order (the synchronous tools'
   answers and failed calls in call order, then the async tools'): three Hermes calls in one turn for
   Qwen2.5, one JSON call for Llama 3.1 (its template writes one per turn).

usage: check_environment_tools.py GROVE MODEL_DIR WORK_DIR
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


# the [environment] config's tools: (its class, the module's functions as TRL's standalone tools=[...])
ENVIRONMENTS = [("Counter", []), ("Counter", ["multiply", "say_later"]), (None, ["multiply"])]


def check_prompts(grove, model, work, family, template, tokenizer, bridge, class_name, functions):
    sys.path.insert(0, HERE)
    import environments

    # TRL's tools are the standalone functions, then the bound methods, by name; transformers 4.57
    # takes only plain functions or schemas, so they go in as the schemas its get_json_schema makes
    # (what newer versions do inside)
    tools = [get_json_schema(getattr(environments, name)) for name in functions]
    if class_name:
        instance = getattr(environments, class_name)()
        tools += [get_json_schema(getattr(instance, name)) for name in bridge._public_methods(instance)]
    config = f'module = "{HERE}/environments.py"\ntools = {json.dumps(functions)}\n'
    config += f'class = "{class_name}"' if class_name else ""
    conversations = [
        [{"role": "user", "content": "Count to 7"}],
        [{"role": "system", "content": "You count with tools."}, {"role": "user", "content": "Count to 7, é 中"}],
    ]
    rows = os.path.join(work, f"{family}_tool_prompts.jsonl")
    with open(rows, "w") as f:
        f.writelines(json.dumps({"prompt": c, "target": 7}) + "\n" for c in conversations)
    out = subprocess.run([grove, "generate", "--model", model, "--input", rows, "--chat-template", family,
                          "--max-new-tokens", "2", "--max-turns", "1", "--json", "--environment", "python_environment",
                          "--environment-config", config],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = [json.loads(line)["prompt"] for line in out.stdout.splitlines()]
    for conversation, prompt in zip(conversations, got, strict=True):
        expected = tokenizer.apply_chat_template(conversation, tools=tools, chat_template=template, tokenize=False,
                                                 add_generation_prompt=True)
        assert prompt == expected, f"\ngrove:    {prompt!r}\ntemplate: {expected!r}"
    print(f"ok   {len(got)} prompts with the {len(tools)} tools of {class_name} and {functions} equal the {family} "
          "template's rendering")


# (Grove's chat template, TRL's file, the calls of one model turn, the tool messages TRL's loop appends
# for them (the synchronous tools' answers in call order, failed calls among them, then the async
# tools'), where the turn starts and how the assistant's message ends in the template's text)
CASES = [
    ("chatml", "qwen2_5.jinja", [("add", {"amount": 2}), ("echo_prompt", {}), ("subtract", {"amount": 1})],
     [("add", "2"), ("subtract", "{'error': 'Tool subtract not found.'}"), ("echo_prompt", "Count to 7")],
     "<|im_start|>assistant\n", "<|im_end|>\n", 1),
    ("llama3_1", "llama3_1.jinja", [("add", {"amount": 2})], [("add", "2")],
     "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", 0),
]


def check_tool_turn(tokenizer, template, bridge, calls, answers, turn_start, turn_end, failures_expected):
    env = bridge.Environment(os.path.join(HERE, "environments.py"), "Counter", "", HERE)
    prompt = [{"role": "user", "content": "Count to 7"}]
    assistant = {
        "role": "assistant",
        "content": "Let me add." if len(calls) > 1 else "",
        "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls],
    }
    tools = [{"role": "tool", "name": n, "content": r} for n, r in answers]

    def render(messages, generation_prompt):
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=generation_prompt)

    before = render(prompt + [assistant], False)
    full = render(prompt + [assistant] + tools, True)
    assert before.endswith(turn_end) and full.startswith(before), (before, full)
    # what the model wrote: the assistant message's text up to and with its EOS (after it, ChatML's newline)
    eos_end = len(before) - (1 if turn_end.endswith("\n") else 0)
    turn = before[before.rindex(turn_start) + len(turn_start):eos_end]
    rendered_prompt = render(prompt, True)
    row = (0, 1, turn, [1, 2], True, rendered_prompt, json.dumps({"target": 7}), json.dumps(prompt))
    env.begin([row[:2] + ("", [], False) + row[5:]], 0, 1)
    observation, done, tool_calls, failures = env.step([row], 0, 1)[0]
    expected = full[eos_end:]
    assert observation == expected, f"\nbridge:   {observation!r}\ntemplate: {expected!r}"
    assert (done, tool_calls, failures) == (False, len(calls), failures_expected), (done, tool_calls, failures)
    return observation


def main():
    grove, model, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(model)
    bridge = load_bridge()
    for family, file, calls, answers, turn_start, turn_end, failures in CASES:
        template = open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", file)).read()
        for class_name, functions in ENVIRONMENTS:
            check_prompts(grove, model, work, family, template, tokenizer, bridge, class_name, functions)
        observation = check_tool_turn(tokenizer, template, bridge, calls, answers, turn_start, turn_end, failures)
        print(f"ok   the tool turn for {len(calls)} calls equals the {file} rendering: {observation!r}")


if __name__ == "__main__":
    main()
