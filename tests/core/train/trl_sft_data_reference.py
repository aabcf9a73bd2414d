"""What TRL 1.16's SFTTrainer trains on: its dataset preparation (SFTTrainer._prepare_dataset) run
on each of TRL's dataset formats with the tiny checkpoints' tokenizers and chat templates. Writes
OUT_DIR/cases.json (each case: the tokenizer folder, the JSONL file, the SFTConfig options, and
TRL's input_ids and labels per kept row) and the JSONL files; `SftData.PreparesRowsAsTrl` prepares
the same files with grove sft's code and compares.

    .venv/bin/python tests/core/train/trl_sft_data_reference.py TINY_MODELS_DIR OUT_DIR
"""
import json
import os
import shutil
import sys
import tempfile
import types

import trl
from datasets import Dataset
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer
from trl.chat_template_utils import get_training_chat_template

TINY, OUT = sys.argv[1], sys.argv[2]
os.makedirs(OUT, exist_ok=True)


def with_trl_template(name, template, tokenizer="llama_gqa"):
    """A tiny checkpoint's tokenizer (the Llama's unless named) with one of TRL's stored chat templates
    (for assistant_only_loss TRL swaps in its training version, with {% generation %} markers)."""
    folder = os.path.join(OUT, f"{name}_template")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(TINY, tokenizer, file)):
            shutil.copy(os.path.join(TINY, tokenizer, file), folder)
    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", template)) as f:
        tokenizer_config["chat_template"] = f.read()
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f)
    return folder


# Qwen3's template (reasoning blocks: the prompt alone and the prompt followed by its completion
# render differently, so the completion starts where their tokens part) on the tiny Llama's tokenizer
QWEN3_TOKENIZER = with_trl_template("qwen3", "qwen3.jinja")
TOKENIZERS = {"chatml": os.path.join(TINY, "llama_gqa"), "gemma": os.path.join(TINY, "gemma3_window"),
              "qwen3": QWEN3_TOKENIZER}
# assistant_only_loss: Qwen2.5's template (chatml, with its default system turn), Qwen3's (whose training
# version keeps every turn's reasoning block) and Qwen3-Instruct-2507's, Llama 3's and Gemma 3's (on
# Gemma's tokenizer, where <start_of_turn> is one token)
ASSISTANT_ONLY = {"qwen2_5": with_trl_template("qwen2_5", "qwen2_5.jinja"),
                  "qwen3": QWEN3_TOKENIZER,
                  "qwen3_instruct_2507": with_trl_template("qwen3_instruct_2507", "qwen3_instruct_2507.jinja"),
                  "llama3": with_trl_template("llama3", "llama3.jinja"),
                  "gemma3": with_trl_template("gemma3", "gemma3.jinja", "gemma3_window")}

LONG = "The quick brown fox jumps over the lazy dog. " * 6
PROCESSED = [[5, 6, 7, 8, 9, 10], list(range(11, 21)), [(7 * i) % 40 + 3 for i in range(30)]]


def datasets(eos):
    """TRL's four formats; some rows already end with the EOS text, some prompts end with a space."""
    return {
        "language_modeling": [{"text": "Hello world, how are you?"}, {"text": "It ends with EOS." + eos},
                              {"text": LONG}],
        "conversational_language_modeling": [
            {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]},
            {"messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                          {"role": "user", "content": LONG}, {"role": "assistant", "content": "A fox."}]}],
        "prompt_completion": [{"prompt": "What is 2+2? ", "completion": "It is 4."},
                              {"prompt": "Say hi.", "completion": " hi" + eos},
                              {"prompt": LONG, "completion": " The end."},
                              # the prompt's last token merges with the completion's first
                              {"prompt": "The quick brown fox jumps over ", "completion": "the lazy dog."}],
        # lengths that leave rows of 32 tokens partly filled, for packing to choose among
        "language_modeling_many": [{"text": " ".join(["fox", "dog", "jumps"][i % 3] for i in range((7 * k) % 9 + 1))}
                                   for k in range(14)],
        "conversational_prompt_completion": [
            {"prompt": [{"role": "user", "content": "What is 2+2?"}],
             "completion": [{"role": "assistant", "content": "4"}]},
            {"prompt": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                        {"role": "user", "content": LONG}],
             "completion": [{"role": "assistant", "content": "A fox jumps."}]}],
        # processed rows (input_ids: tokenized already), as they are, with TRL's masks, or with labels;
        # the last row's trained tokens all lie beyond 24 tokens
        "processed": [{"input_ids": PROCESSED[0]}, {"input_ids": PROCESSED[1]}, {"input_ids": PROCESSED[2]}],
        "processed_masks": [{"input_ids": ids, "completion_mask": [int(i >= 3) for i in range(len(ids))],
                             "assistant_masks": [int(i % 4 != 1) for i in range(len(ids))]} for ids in PROCESSED[:2]]
                           + [{"input_ids": PROCESSED[2], "completion_mask": [int(i >= 26) for i in range(30)],
                               "assistant_masks": [1] * 30}],
        "processed_labels": [{"input_ids": ids, "labels": [t if i % 3 else -100 for i, t in enumerate(ids)]}
                             for ids in PROCESSED[:2]] + [{"input_ids": PROCESSED[2],
                                                           "labels": [-100] * 27 + PROCESSED[2][27:]}],
    }


# SFTConfig options: TRL's defaults, short limits keeping either end, and the prompt trained too
OPTIONS = [dict(), dict(max_length=24), dict(max_length=24, truncation_mode="keep_end"),
           dict(completion_only_loss=False),
           # packed into rows of 32 tokens three ways, and padding-free rows
           dict(packing=True, max_length=32), dict(packing=True, max_length=32, packing_strategy="bfd_split"),
           dict(packing=True, max_length=32, packing_strategy="wrapped"),
           dict(packing=True, max_length=32, truncation_mode="keep_end"),  # packing keeps the start anyway
           # no limit: nothing cut or dropped; padding-free rows (TRL refuses them with a limit)
           dict(max_length=None), dict(padding_free=True, max_length=None)]


def prepare(tokenizer, rows, options):
    args = SFTConfig(output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False, **options)
    sample = rows[0]
    # what SFTTrainer.__init__ sets before it prepares the data
    fake = types.SimpleNamespace(
        _tokenizer=tokenizer,
        chat_template=get_training_chat_template(tokenizer) if args.assistant_only_loss else None,
        completion_only_loss=("prompt" in sample and "completion" in sample) if args.completion_only_loss is None
        else args.completion_only_loss)
    dataset = SFTTrainer._prepare_dataset(fake, Dataset.from_list(rows), tokenizer, args, args.packing, None, "train")
    # padding-free batches (bfd packing sets them): TRL's collator masks each sequence's first label
    padding_free = args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"})
    prepared = []
    for r in dataset:
        labels = list(r["labels"])
        if padding_free:
            start = 0
            for length in r.get("seq_lengths") or [len(labels)]:
                labels[start] = -100
                start += length
        prepared.append(dict(input_ids=r["input_ids"], labels=labels, seq_lengths=r.get("seq_lengths")))
    return prepared


cases = []
for family, folder in TOKENIZERS.items():
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for kind, rows in datasets(tokenizer.eos_token).items():
        data = os.path.join(OUT, f"{family}_{kind}.jsonl")
        with open(data, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        for options in OPTIONS:
            if kind.endswith("language_modeling") and "completion_only_loss" in options:
                continue  # TRL: not for language modeling rows
            if kind.startswith("processed") and "completion_only_loss" not in options:
                # TRL's None is false for rows without a prompt, leaving completion_mask unused;
                # grove sft applies a completion_mask unless sft.completion_only_loss = false
                options = dict(options, completion_only_loss=True)
            cases.append(dict(name=f"{family}_{kind}_{'_'.join(f'{k}={v}' for k, v in options.items()) or 'defaults'}",
                              tokenizer=folder, data=data, options=options,
                              rows=prepare(tokenizer, rows, options)))
# assistant_only_loss: the conversations' assistant turns as TRL's training templates mark them, under
# TRL's defaults, a limit keeping either end, and packing
for family, folder in ASSISTANT_ONLY.items():
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = datasets(tokenizer.eos_token)["conversational_language_modeling"] + [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
                      {"role": "assistant", "content": "  Hello.  "}, {"role": "user", "content": "Bye."},
                      {"role": "assistant", "content": ""}]},
        {"messages": [{"role": "user", "content": "2 + 2?"},
                      {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4."},
                      {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6."}]}]
    if family != "gemma3":  # (Gemma's templates have no tool role)
        # tool calls written out, then their results: consecutive tool messages share one turn in
        # Qwen's templates, so the conversation's beginning up to the first renders that turn closed
        call = '<tool_call>\n{"name": "weather", "arguments": {"city": "%s"}}\n</tool_call>'
        rows += [{"messages": [{"role": "user", "content": "Weather in Paris and Rome?"},
                               {"role": "assistant", "content": call % "Paris" + "\n" + call % "Rome"},
                               {"role": "tool", "content": '{"temp": 20}'}, {"role": "tool", "content": '{"temp": 25}'},
                               {"role": "assistant", "content": "Paris 20, Rome 25."}]},
                 {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                               {"role": "assistant", "content": call % "Oslo"},
                               {"role": "tool", "content": '{"temp": 5}'}, {"role": "assistant", "content": "5."}]}]
    data = os.path.join(OUT, f"{family}_assistant_only.jsonl")
    with open(data, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    # (the tiny tokenizer spends about a token a character: limits of 100 and rows of 128 tokens)
    for options in (dict(), dict(max_length=100), dict(max_length=100, truncation_mode="keep_end"),
                    dict(packing=True, max_length=128)):
        options = dict(options, assistant_only_loss=True)
        cases.append(dict(name=f"{family}_assistant_only_{'_'.join(f'{k}={v}' for k, v in options.items())}",
                          tokenizer=folder, data=data, options=options, rows=prepare(tokenizer, rows, options)))
# tool calling (Qwen's templates): a "tools" column and assistant messages with "tool_calls", their
# arguments' keys not in sorted order (the file's order is the one rendered), as conversations and as
# prompt-completion rows, with and without assistant_only_loss
WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string"}, "city": {"type": "string"}}, "required": ["city"]}}}


def weather_call(city):
    return {"type": "function", "function": {"name": "weather", "arguments": {"unit": "C", "city": city}}}


TOOL_ROWS = [
    {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [weather_call("Oslo")]},
        {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5 degrees."}]},
    {"tools": [WEATHER], "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Oslo and Zürich?"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [weather_call("Oslo"), weather_call("Zürich")]},
        {"role": "tool", "content": "5"}, {"role": "tool", "content": "20"},
        {"role": "assistant", "content": "Oslo 5, Zürich 20."}]},
    {"tools": None, "messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]}]
# (the first completion's call has no "content" key at all: TRL's is_conversational looks at roles)
TOOL_PROMPT_COMPLETION = [{"tools": [WEATHER], "prompt": r["messages"][:-3],
                           "completion": [{k: v for k, v in r["messages"][-3].items() if k != "content"}] + r["messages"][-2:]}
                          for r in TOOL_ROWS[:1]] + [
    {"tools": [WEATHER], "prompt": TOOL_ROWS[1]["messages"][:2], "completion": TOOL_ROWS[1]["messages"][2:]}]
for family in ("qwen2_5", "qwen3", "qwen3_instruct_2507"):
    tokenizer = AutoTokenizer.from_pretrained(ASSISTANT_ONLY[family])
    for kind, rows, all_options in (("tool_calling", TOOL_ROWS, (dict(), dict(assistant_only_loss=True),
                                                                 dict(assistant_only_loss=True, max_length=100))),
                                    ("tool_calling_prompt_completion", TOOL_PROMPT_COMPLETION, (dict(),))):
        data = os.path.join(OUT, f"{family}_{kind}.jsonl")
        with open(data, "w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for options in all_options:
            cases.append(dict(name=f"{family}_{kind}_{'_'.join(f'{k}={v}' for k, v in options.items()) or 'defaults'}",
                              tokenizer=ASSISTANT_ONLY[family], data=data, options=options,
                              rows=prepare(tokenizer, rows, options)))
# reasoning given apart (reasoning_content) with Qwen3's template, whose training version writes every
# turn's block
REASONING_ROWS = [{"messages": [
    {"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4.", "reasoning_content": "Add them."},
    {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6.", "reasoning_content": "\nAgain.\n"}]}]
tokenizer = AutoTokenizer.from_pretrained(ASSISTANT_ONLY["qwen3"])
data = os.path.join(OUT, "qwen3_reasoning_content.jsonl")
with open(data, "w") as f:
    for row in REASONING_ROWS:
        f.write(json.dumps(row) + "\n")
for options in (dict(), dict(assistant_only_loss=True)):
    cases.append(dict(name=f"qwen3_reasoning_content_{'_'.join(f'{k}={v}' for k, v in options.items()) or 'defaults'}",
                      tokenizer=ASSISTANT_ONLY["qwen3"], data=data, options=options,
                      rows=prepare(tokenizer, REASONING_ROWS, options)))
# 1100 short texts: TRL packs each chunk of 1000 rows (datasets' map batch) on its own
many = os.path.join(OUT, "chatml_1100_texts.jsonl")
tokenizer = AutoTokenizer.from_pretrained(TOKENIZERS["chatml"])
rows = [{"text": " ".join(["fox"] * ((5 * k) % 7 + 1))} for k in range(1100)]
with open(many, "w") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
for options in (dict(packing=True, max_length=32), dict(packing=True, max_length=32, packing_strategy="wrapped")):
    cases.append(dict(name=f"chatml_1100_texts_{options.get('packing_strategy', 'bfd')}", tokenizer=TOKENIZERS["chatml"],
                      data=many, options=options, rows=prepare(tokenizer, rows, options)))
with open(os.path.join(OUT, "cases.json"), "w") as f:
    json.dump(cases, f, indent=1)
print(f"{len(cases)} cases in {OUT}/cases.json")
