"""Reward functions see a tool-using episode as TRL 1.16's reward functions see it: a list of
messages, each model turn parsed by transformers' parse_response with TRL's response template
(content, reasoning_content, tool_calls) and each tool result a {"role": "tool", "name", "content"}
message.

The reference is TRL's own GRPOTrainer (under transformers 5, which its environment_factory needs),
trained for one step with environment_factory=Counter and a model whose turns are scripted: the
first turn of each prompt calls tools (one call, two calls, unknown and failing tools, async
tools called before a synchronous one (TRL answers them last), TRL's standalone tools (tools=[...])
next to the class's methods, a call that is not JSON, a string argument the tool's schema types as an integer, or none), the turn after the tool results answers (with a <think> block in one case). TRL
runs the tools, builds the episodes and hands the reward function its messages. Grove's bridge
then gets the same episodes as the host hands them over (each episode cut where TRL's tool_mask
changes, each piece decoded with special tokens kept: grove_reward_batch.episode_turns), and its
reward function must get the same messages; and Grove's python_environment, given each first turn,
must answer with the tool results TRL appended, token for token as text. Both with Qwen2.5's chat template (Hermes tool calls)
and Llama 3.1's (a JSON turn per call, ipython results).

usage: check_episode_messages.py MODEL_DIR WORK_DIR
"""

import importlib.util
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(sys.prefix, "transformers5-site"))

import environment_rewards  # noqa: E402  (after the path above)


def hermes_call(name, arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def llama3_call(name, arguments):
    return json.dumps({"name": name, "parameters": arguments})


# target -> (first turn, the turn after the tool results), before the end-of-turn token
def scripts(call, llama3):
    first = {
        0: "It is 0.",
        1: "Let me add.\n" + call("add", {"amount": 1}),
        2: call("add", {"amount": 1}) + ("" if llama3 else "\n" + call("add", {"amount": 1})),
        3: (call("subtract", {"amount": 1}) if llama3 else call("subtract", {"amount": 1}) + call("add", {"amount": -1})),
        # async tools (say_later, the method echo_prompt) answered after the synchronous multiply
        4: call("echo_prompt", {}) if llama3 else
        call("say_later", {"text": "soon"}) + call("echo_prompt", {}) + call("multiply", {"a": 2, "b": 2}),
        # a turn that does not parse is its text without special tokens; the tiny tokenizer has
        # <|im_end|> as a special token but not <|eot_id|>, so only ChatML can show it
        5: "No idea." if llama3 else call("add", {"amount": 1}) + "<tool_call>\n{oops\n</tool_call>",
        # a string where the tool takes an integer: typed by the tool's schema
        6: call("add", {"amount": "6"}),
        7: call("multiply", {"a": 3, "b": 5}),  # a standalone tool (TRL's tools=[...]), no method
    }
    after = {6: "Six.", 1: "Done: 1.", 2: "<think>two adds</think>\nIt is 2." if not llama3 else "It is 2.", 3: "Failed.",
             4: "  You said it.  ", 7: "Fifteen."}
    return first, after


def trl_episodes(model, template, llama3, output):
    """TRL's messages for each scripted episode, and its token stream: (prompt ids, completion ids, tool_mask)."""
    import transformers
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from environments import Counter, multiply, say_later

    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", template)) as f:
        tokenizer.chat_template = f.read()
    end = "<|eot_id|>" if llama3 else "<|im_end|>"
    first, after = scripts(llama3_call if llama3 else hermes_call, llama3)
    rows = [{"prompt": [{"role": "user", "content": f"Count to {n}."}], "target": n} for n in first]

    def scripted_turns(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            n = int(re.findall(r"Count to (\d)\.", text)[-1])
            answered = "<tool_response>" in text or "ipython<|end_header_id|>" in text  # the tools' results
            turn = after[n] if answered else first[n]
            out.append(tokenizer(turn + end, add_special_tokens=False)["input_ids"])
        return out, None

    generated = {}
    original_generate = GRPOTrainer._generate

    def recording_generate(self, prompts):
        result = original_generate(self, prompts)
        generated["prompt_ids"], generated["completion_ids"], generated["tool_mask"] = result[0], result[1], result[2]
        return result

    GRPOTrainer._generate_single_turn = scripted_turns
    GRPOTrainer._generate = recording_generate
    environment_rewards.RECORDED.clear()
    args = GRPOConfig(output_dir=output, num_generations=2, per_device_train_batch_size=2 * len(rows),
                      max_completion_length=512, max_steps=1, report_to="none", use_cpu=True, bf16=False,
                      save_strategy="no")
    trainer = GRPOTrainer(model=model, reward_funcs=[environment_rewards.record_completions], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, environment_factory=Counter,
                          tools=[multiply, say_later])
    trainer.model.config.max_position_embeddings = 4096  # the tiny model's 256 would drop the tool results
    trainer.train()
    assert generated["tool_mask"] is not None, "TRL ran no tool loop"
    return environment_rewards.RECORDED[0], generated, tokenizer


def grove_messages(generated, tokenizer):
    """What Grove's bridge gives the same reward function for the same episodes."""
    spec = importlib.util.spec_from_file_location("grove_python_bridge", os.path.join(ROOT, "plugins", "python", "bridge.py"))
    bridge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bridge)
    environment = bridge.Environment("environments", "Counter", "", HERE, "", ["multiply", "say_later"])
    environment.tools_json()  # as the host asks once, after create(): the tools' schemas type the calls
    reward = bridge.Reward("environment_rewards", "record_completions", "", "", HERE)
    prompts, turns, rows = [], [], []
    for prompt_ids, ids, mask in zip(generated["prompt_ids"], generated["completion_ids"], generated["tool_mask"]):
        prompts.append(tokenizer.decode(prompt_ids))
        n = int(re.findall(r"Count to (\d)\.", prompts[-1])[-1])
        rows.append({"prompt": [{"role": "user", "content": f"Count to {n}."}], "target": n})
        pieces, start = [], 0
        for k in range(1, len(ids) + 1):  # runs of one author, as the host cuts an episode
            if k == len(ids) or mask[k] != mask[start]:
                pieces.append(tokenizer.decode(ids[start:k]))
                start = k
        turns.append(pieces)
    # the environment answers first, as in a run: the reward's messages name its answers in its order
    observations = grove_observations(environment, turns, prompts, rows)
    environment_rewards.RECORDED.clear()
    n = len(prompts)
    reward.score(prompts, [""] * n, [list(i) for i in generated["completion_ids"]],
                 [json.dumps({"target": r["target"]}) for r in rows], [json.dumps(r["prompt"]) for r in rows], 0, 1, 0, 0,
                 turns)
    return environment_rewards.RECORDED[0], turns, rows, observations


def grove_observations(environment, turns, prompts, rows):
    """What Grove's python_environment answers each episode's first turn with (its tool turn), to
    compare with the tool results TRL appended."""
    # bridge.Environment's rows: (episode, turn, text, ids, ended with EOS, prompt as seen, row, dataset prompt)
    episodes = [(i, 1, pieces[0], [], True, prompt, json.dumps({"target": row["target"]}), json.dumps(row["prompt"]))
                for i, (pieces, prompt, row) in enumerate(zip(turns, prompts, rows))]
    environment.begin([(i, 0, "", [], False, p, r, q) for i, _, _, _, _, p, r, q in episodes], 0, 0)
    return [answer[0] for answer in environment.step(episodes, 0, 0)]


def main():
    model, work = (os.path.abspath(a) for a in sys.argv[1:3])
    for template, llama3 in (("qwen2_5.jinja", False), ("llama3_1.jinja", True)):
        trl_messages, generated, tokenizer = trl_episodes(model, template, llama3, os.path.join(work, template))
        ours, turns, rows, observations = grove_messages(generated, tokenizer)
        tools = sum(m["role"] == "tool" for c in trl_messages for m in c)
        assert tools >= 4, f"{template}: TRL ran {tools} tool calls; the script meant more"
        for row, observation, pieces in zip(rows, observations, turns):
            assert observation == (pieces[1] if len(pieces) > 1 else ""), (
                f"{template}, target {row['target']}: after {pieces[0]!r} TRL appended {pieces[1:2]}, "
                f"Grove's environment {observation!r}")
        for row, theirs, mine, pieces in zip(rows, trl_messages, ours, turns):
            assert mine == theirs, (f"{template}, target {row['target']}: the episode {pieces}\n"
                                    f"TRL's messages:   {json.dumps(theirs)}\nGrove's messages: {json.dumps(mine)}")
        print(f"{template}: {len(rows)} episodes, {tools} tool messages; Grove's environment answers as TRL's "
              "tools did, and the reward function gets TRL's messages, e.g.")
        print("  " + json.dumps(max(trl_messages, key=len)))


if __name__ == "__main__":
    main()
