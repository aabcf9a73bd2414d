"""The Python side of Grove's python plugins: reward functions called exactly as TRL calls them
(`python`), and environments (`python_environment`): TRL's environment_factory classes or Grove's
own environment contract.

python_plugin.cpp embeds this file as the module `grove_python_bridge`. For each batch it hands over
Grove's reward batch as plain lists; `Reward.score` turns them into TRL's arguments (GRPOTrainer.
_calculate_rewards): prompts and completions in the standard (text) or conversational (messages) form,
completion_ids, every other dataset column as a keyword list, trainer_state, log_metric,
log_extra, and environments when this process runs a python_environment. It returns one float per row (None -> NaN), the metrics logged by name and the values
logged per row by column (as JSON texts).
"""

import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import traceback
import types
import weakref


def _plain(value):
    """numpy and torch values as Python's (their item() or tolist()), else their str()."""
    for convert in ("tolist", "item"):
        if hasattr(value, convert):
            try:
                return getattr(value, convert)()
            except (TypeError, ValueError):
                pass
    return str(value)


def _json_text(value):
    """A log_extra value as JSON text: as json writes it (numpy and torch values as numbers or lists),
    a value holding NaN or an infinity as null, and what json cannot write as its str()."""
    try:
        return json.dumps(value, allow_nan=False, default=_plain)
    except ValueError:
        return "null"

class ConfigError(Exception):
    """A configuration value is wrong; `key` names it so Grove can point at the manifest line."""

    def __init__(self, key, message):
        super().__init__(message)
        self.key = key


def describe_exception(error, frames=4):
    """The exception and the last frames of its traceback in the user's code, for a Grove error message."""
    if isinstance(error, ConfigError):
        return str(error)
    lines = [f"{type(error).__name__}: {error}"]
    stack = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != __file__][-frames:]
    if stack:
        lines.append(f"traceback (last {len(stack)} frames):")
        lines.extend(line.rstrip("\n") for line in traceback.format_list(stack))
    return "\n".join(lines)


def _load_module(spec, base_dir):
    """A .py file (relative to the manifest's folder) or an importable module name."""
    if spec.endswith(".py") or "/" in spec:
        path = os.path.normpath(spec if os.path.isabs(spec) else os.path.join(base_dir, spec))
        if not os.path.isfile(path):
            raise ConfigError("module", f"{path}: no such file (a relative path is relative to the manifest's folder)")
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # so the file can import its neighbours, as `python file.py` would
        name = os.path.splitext(os.path.basename(path))[0]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules.setdefault(name, module)
        loader_spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as error:
        if error.name and spec.startswith(error.name):
            raise ConfigError(
                "module",
                f"no module named '{error.name}' in the Python at {sys.executable}; install it there "
                f"({sys.executable} -m pip install ...) or give the path of a .py file",
            ) from None
        raise


def _find_function(module, name, factory_args, key="function", noun=None):
    function = getattr(module, name, None)
    if function is None or not callable(function):
        callables = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None)))
        raise ConfigError(key, f"module '{module.__name__}' has no {noun or key} '{name}'; it has: {', '.join(callables)}")
    if factory_args is not None:  # e.g. get_soft_overlong_punishment(max_completion_len=..., ...)
        function = function(**factory_args)
        if not callable(function):
            raise ConfigError("factory_args", f"'{name}(**factory_args)' returned {type(function).__name__}, not a function")
    return function


def _is_conversation(prompt):
    """TRL's is_conversational for a prompt: a list of messages with a role."""
    return isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], dict) and "role" in prompt[0]


def _requires_argument(function, name):
    """Whether calling `function` without the keyword argument `name` fails: it names it, without a default."""
    try:
        parameter = inspect.signature(function).parameters.get(name)
    except (TypeError, ValueError):  # no signature to read (a builtin): it cannot be told
        return False
    return (parameter is not None and parameter.default is inspect.Parameter.empty
            and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


class Reward:
    """One [[rewards]] use of the python plugin: a module's function and its fixed keyword arguments."""

    def __init__(self, module, function, kwargs_json, factory_args_json, base_dir):
        self.kwargs = json.loads(kwargs_json) if kwargs_json else {}
        factory_args = json.loads(factory_args_json) if factory_args_json else None
        self.function = _find_function(_load_module(module, base_dir), function, factory_args)
        self.requires_environments = _requires_argument(self.function, "environments")
        # refused before any model loads or generates; the host creates the environment first (one
        # destroyed later, or one of tools alone, is refused at the first batch, below)
        if self.requires_environments and _this_process_environment() is None:
            raise ConfigError("function", _NO_ENVIRONMENTS)
        self.loop = None  # an event loop for async reward functions, made on first use

    def score(self, prompts, completions, completion_ids, row_json, prompt_json, step, max_steps, seed, first_row,
              episode_turns):
        n = len(completions)
        rendered_prompts = prompts
        if prompt_json is not None:
            prompts = [json.loads(p) for p in prompt_json]  # the dataset's prompts, as TRL passes them
        rows = [json.loads(r) if r else {} for r in row_json]
        if prompts and _is_conversation(prompts[0]):
            completions = [_episode_messages(turns, rendered, _run_environment_tool_parameters(row),
                                             _run_environment_answered_names(first_row + i, step, seed))
                           or [{"role": "assistant", "content": c}]
                           for i, (c, turns, rendered, row) in enumerate(zip(completions, episode_turns, rendered_prompts, rows))]
        keys = [k for k in (rows[0] if rows else {}) if k not in ("prompt", "completion", "completion_ids")]
        columns = {k: [row.get(k) for row in rows] for k in keys}
        logged, extras = [], []
        columns["trainer_state"] = types.SimpleNamespace(global_step=step, max_steps=max_steps)
        columns["log_metric"] = lambda name, value: logged.append((str(name), float(value)))
        columns["log_extra"] = lambda column, values: extras.append((str(column), [_json_text(v) for v in values]))
        environments = _environments_of_rows(first_row, n, step, seed)
        if environments is not None:
            columns["environments"] = environments
        elif self.requires_environments:
            raise ConfigError("function", _NO_ENVIRONMENTS)
        columns.update(self.kwargs)
        result = self.function(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        if inspect.isawaitable(result):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            result = self.loop.run_until_complete(result)
        return self._scores(result, n), logged, extras

    def _scores(self, result, n):
        try:
            values = list(result)
        except TypeError:
            raise TypeError(f"returned {type(result).__name__}, not a list of {n} rewards") from None
        if len(values) != n:
            raise ValueError(f"returned {len(values)} rewards, but {n} were expected (one per completion)")
        scores = []
        for i, value in enumerate(values):
            if value is None:
                scores.append(math.nan)
                continue
            try:
                scores.append(float(value))
            except (TypeError, ValueError):
                raise TypeError(f"row {i}: the reward {value!r} ({type(value).__name__}) is not a number or None") from None
        return scores


# ---- environments ---------------------------------------------------------------------------------

# The python_environment of this process (a run has at most one), for the reward functions that take
# TRL's `environments`; a weak reference, so that an environment the host destroyed is not kept.
_run_environment = None

_NO_ENVIRONMENTS = (
    "it takes `environments` (TRL's environment instances, one per completion), which Grove passes only when "
    "the run's [environment] is a python_environment with a class running in the same process as this reward: "
    "this run has no such environment (an environment of `tools` alone has no instances, as TRL passes none), "
    "or its [environment] or this [[rewards]] entry sets isolation = \"process\" (remove it from both), or "
    "`grove eval --no-environment` left it out")


def _this_process_environment():
    """The python_environment this process runs, or None."""
    return _run_environment() if _run_environment is not None else None


def _run_environment_tool_parameters(row):
    """The tools' parameter schemas of this process's python_environment for the dataset row ({}
    without one: with several classes, the row's own), by which the calls in the episode's messages
    are typed, as TRL types them with the row's environment's tools."""
    environment = _this_process_environment()
    if environment is None:
        return {}
    key = row.get("environment") if environment.multi else None
    return environment.tool_parameters_of.get(key, environment.tool_parameters)


def _run_environment_answered_names(episode, step, seed):
    """The names of the tools this process's python_environment answered in each tool turn of the
    episode, in the order it answered them (TRL's: synchronous calls first, then async ones); None
    where it did not run the episode (another process, or none), whose calls are named in call order."""
    environment = _this_process_environment()
    return environment.answered_names.get(((step, seed), episode)) if environment is not None else None


def _environments_of_rows(first_row, n, step, seed):
    """TRL's `environments` reward argument for the reward batch's rows (episodes first_row ..
    first_row + n - 1 of the generation batch (step, seed)): each row's instance; None when this
    process runs no python_environment."""
    environment = _this_process_environment()
    return environment.instances(first_row, n, (step, seed)) if environment is not None else None



class Turn:
    """One episode waiting on the environment: what a Grove-contract environment's step() gets."""

    __slots__ = ("episode", "turn", "text", "token_ids", "ended_with_eos", "prompt", "row", "rendered_prompt")

    def __init__(self, episode, turn, text, token_ids, ended_with_eos, prompt, row, rendered_prompt):
        self.episode, self.turn, self.text, self.token_ids = episode, turn, text, token_ids
        self.ended_with_eos, self.prompt, self.row = ended_with_eos, prompt, row  # prompt: None where the row has none
        self.rendered_prompt = rendered_prompt  # the prompt as the model saw it

    def __repr__(self):
        return f"Turn(episode={self.episode}, turn={self.turn}, text={self.text!r})"


_LLAMA3_HEADER, _LLAMA3_EOT = "<|start_header_id|>", "<|eot_id|>"


def _writes_llama3_calls(rendered_prompt):
    """Whether the chat template the prompt was rendered with is Llama 3's, whose turns open with a
    header, rather than ChatML's (the host writes an environment's tools only with Llama 3.1's and
    3.2's templates and Qwen's Hermes ones)."""
    header, chatml = rendered_prompt.find(_LLAMA3_HEADER), rendered_prompt.find("<|im_start|>")
    return header >= 0 and (chatml < 0 or header < chatml)


def _tool_turn(results, llama3):
    """The tool messages as the model's chat template writes them, then its generation prompt: Llama
    3's ipython turns (the template writes text through tojson), or ChatML's user turn of
    <tool_response> blocks (Qwen2.5's and Hermes' templates)."""
    if llama3:
        return "".join(f"{_LLAMA3_HEADER}ipython<|end_header_id|>\n\n{json.dumps(r, ensure_ascii=False)}{_LLAMA3_EOT}"
                       for r in results) + f"{_LLAMA3_HEADER}assistant<|end_header_id|>\n\n"
    responses = "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in results)
    return "\n<|im_start|>user" + responses + "<|im_end|>\n<|im_start|>assistant\n"


# ---- episodes as TRL's messages -------------------------------------------------------------------
# With tools, TRL's reward functions get an episode as messages: each model turn parsed by
# transformers' parse_response with TRL's response template for the chat template (qwen3_template
# for Qwen2.5's / Hermes' ChatML, llama3_template for Llama 3.1 / 3.2), and a {"role": "tool"}
# message per tool result between them. The two templates, as that parser reads them at the end of
# a turn: the earliest delimiter wins (the longest on a tie, an opening before a closing); text
# outside any field is the content, and a later stretch of it replaces an earlier one.


def _hermes_fields():
    return {
        "reasoning_content": (re.compile("<think>"), re.compile(r"</think>\s*"), lambda body, _: body.strip()),
        "tool_calls": (re.compile("<tool_call>"), re.compile(r"</tool_call>\s*"),
                       lambda body, _: {"type": "function", "function": json.loads(body)}),
    }, re.compile(r"<\|im_end\|>\s*")


def _llama3_fields():
    return {
        "tool_calls": (re.compile(r'\{"name":\s*"(?P<name>[^"]+)",\s*"parameters":\s*'), re.compile(r"\}<\|eot_id\|>\s*"),
                       lambda body, name: {"type": "function", "function": {"name": name, "arguments": json.loads(body)}}),
    }, re.compile(r"<\|eot_id\|>\s*")


def _schema_types(schema):
    """The JSON types a parameter's schema allows (its type, anyOf's, null when nullable)."""
    if not isinstance(schema, dict):
        return ()
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared if isinstance(t, str)] \
        if isinstance(declared, list) else []
    for choice in schema.get("anyOf") or []:
        types.extend(_schema_types(choice))
    if schema.get("nullable") and "null" not in types:  # get_json_schema's mark of an Optional
        types.append("null")
    return tuple(types)


def _typed(raw, types):
    """A string argument as the first of its parameter's types it parses as (else unchanged), as
    transformers' parse_response(tools=...) types it."""
    for name in types:
        try:
            if name == "integer":
                return int(raw)
            if name == "number":
                number = float(raw)
                if number != number or number in (float("inf"), float("-inf")):
                    continue
                return int(number) if number.is_integer() and "." not in raw else number
            if name == "boolean" and raw.strip().lower() in ("true", "1", "false", "0"):
                return raw.strip().lower() in ("true", "1")
            if name == "null" and raw.strip() in ("null", "None"):
                return None
            if name in ("object", "array"):
                decoded = json.loads(raw)
                if isinstance(decoded, dict if name == "object" else list):
                    return decoded
        except ValueError:
            continue
    return raw


def _type_arguments(call, tool_parameters):
    """Casts the call's string arguments by its tool's JSON schema ({tool: properties})."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), dict):
        return
    properties = tool_parameters.get(function.get("name"))
    for key, value in (function["arguments"].items() if properties else ()):
        types = _schema_types(properties[key]) if key in properties else ()
        if types and isinstance(value, str):
            function["arguments"][key] = _typed(value, types)
        elif types and isinstance(value, list):
            function["arguments"][key] = [_typed(v, types) if isinstance(v, str) else v for v in value]


def _tool_parameters(schemas):
    """{tool name: its parameters' schemas} from function schemas (get_json_schema's form)."""
    parameters = {}
    for tool in schemas:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            properties = (function.get("parameters") or {}).get("properties")
            parameters[function["name"]] = properties if isinstance(properties, dict) else {}
    return parameters


_SPECIAL_TEXT = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|start_header_id|end_header_id|begin_of_text|eom_id)\|>")


def _assistant_message(text, llama3, tool_parameters=None):
    """A model turn (special tokens kept) as TRL's parse_response makes it: {"role": "assistant",
    "content", and "reasoning_content" / "tool_calls" when there are any}, the calls' string
    arguments typed by `tool_parameters` (TRL passes the tools); a turn that does not parse (a tool
    call that is not JSON) is its text without special tokens, as TRL falls back to."""
    fields, content_close = _llama3_fields() if llama3 else _hermes_fields()
    message, position, current, body, opened, name = {"role": "assistant"}, 0, None, "", False, None

    def close():  # the open field's value goes into the message; then back to the content
        nonlocal current, body, opened, name
        if opened and current is None:
            message["content"] = body.strip()
        elif opened and current == "tool_calls":  # the one field that repeats
            message.setdefault(current, []).append(fields[current][2](body, name))
        elif opened:
            message[current] = fields[current][2](body, name)
        current, body, opened, name = None, "", False, None

    try:
        while True:
            if current is None:
                watch = [(m.start(), -(m.end() - m.start()), 0, field, m)
                         for field, (opening, _, _) in fields.items() if (m := opening.search(text, position))]
                m = content_close.search(text, position)
                watch += [(m.start(), -(m.end() - m.start()), 1, "", m)] if m else []
            else:
                m = fields[current][1].search(text, position)
                watch = [(m.start(), 0, 1, current, m)] if m else []
            if not watch:
                body, opened = body + text[position:], opened or position < len(text)
                close()
                break
            _, _, closing, field, m = min(watch, key=lambda w: w[:4])
            body, opened = body + text[position:m.start()], opened or m.start() > position
            position = m.end()
            close()
            if not closing:
                current, opened, name = field, True, m.groupdict().get("name")
        for call in message.get("tool_calls", []):
            function = call["function"]
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError("a tool call without a name")
            if function.get("arguments") is None:
                function["arguments"] = {}
            _type_arguments(call, tool_parameters or {})
    except (ValueError, TypeError, KeyError, RecursionError):  # RecursionError: JSON nested too deep
        return {"role": "assistant", "content": _SPECIAL_TEXT.sub("", text)}
    message = {k: v for k, v in message.items() if k == "role" or v}
    message.setdefault("content", "")
    return message


_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
_IPYTHON_TURN = re.compile(re.escape(_LLAMA3_HEADER) + r"ipython<\|end_header_id\|>\n\n(.*?)" + re.escape(_LLAMA3_EOT),
                           re.DOTALL)


def _tool_results(observation, llama3):
    """The tool results in an observation the bridge wrote (_tool_turn), or None when it is not a
    tool turn (an observation of Grove's contract, which is free text)."""
    if llama3:
        try:
            results = [json.loads(r) for r in _IPYTHON_TURN.findall(observation)]
        except ValueError:  # free text in an ipython turn: another environment's, not the bridge's
            return None
        return [r if isinstance(r, str) else json.dumps(r) for r in results] or None
    return _TOOL_RESPONSE.findall(observation) or None


def _shows_tools(rendered_prompt):
    """Whether the prompt describes tools, as the templates write them: Qwen2.5's / Hermes' <tools>
    block, or the "Environment: ipython" line of Llama 3.1's and 3.2's."""
    return "<tools>\n" in rendered_prompt or "Environment: ipython\n" in rendered_prompt


def _episode_messages(turns, rendered_prompt, tool_parameters=None, answered_names=None):
    """An episode's turns (model, observation, model, ...) as TRL's messages: each model turn
    parsed, each result a {"role": "tool", "name", "content"} message, named by the call it
    answers: in the order the environment answered them (`answered_names`, one list per tool turn,
    when it ran in this process), else in call order. None when it is no tool conversation (no turns, neither ChatML nor Llama 3's format, or
    an observation that is not a tool turn): the caller then gives it whole, as one assistant message."""
    # the format the prompt was rendered in, else the one the turns show (`grove plugins score` gets
    # a conversation's prompt without its template)
    shown = rendered_prompt if "<|im_start|>" in rendered_prompt or _LLAMA3_HEADER in rendered_prompt else "".join(turns)
    if not turns or not any(mark in shown for mark in ("<|im_start|>", "<|im_end|>", _LLAMA3_HEADER, _LLAMA3_EOT)):
        return None
    llama3 = _LLAMA3_HEADER in shown or _LLAMA3_EOT in shown if shown is not rendered_prompt else \
        _writes_llama3_calls(rendered_prompt)
    if len(turns) == 1 and not (tool_parameters or _shows_tools(rendered_prompt)):
        return None  # TRL parses completions only when the run has tools; a C environment's stay whole
    messages = []
    for k in range(0, len(turns), 2):
        messages.append(_assistant_message(turns[k], llama3, tool_parameters))
        if k + 1 < len(turns):
            results = _tool_results(turns[k + 1], llama3)
            if results is None:
                return None
            names = [call["function"]["name"] for call in messages[-1].get("tool_calls", [])]
            if answered_names is not None and k // 2 < len(answered_names):
                names = answered_names[k // 2]
            names += ["unknown"] * (len(results) - len(names))
            messages += [{"role": "tool", "name": n, "content": r} for n, r in zip(names, results)]
    return messages


def _tool_schemas(tools, key):
    """What transformers' get_json_schema makes of each tool ((name, function) pairs), as
    apply_chat_template(tools=...) describes TRL's tools to the model."""
    from transformers.utils import get_json_schema

    schemas = []
    for name, function in tools:
        try:
            schemas.append(get_json_schema(function))
        except Exception as error:  # TRL refuses such a tool too: it needs type hints and a docstring
            raise ConfigError(key, f"tool '{name}' cannot be described to the model: {error}") from None
    return schemas


def _public_methods(instance):
    """TRL's tools of an environment: its public functions other than reset and get_reward."""
    return {
        name: getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    }


_PLACEHOLDER_PROMPT = [{"role": "user", "content": ""}]  # a prompt of a run without data.source


class _ToolFailure(dict):
    """A failed tool call's answer, as TRL writes it: {'error': '...'}."""

    def __init__(self, error):
        super().__init__(error=str(error))


async def _gather(coroutines):
    return await asyncio.gather(*coroutines, return_exceptions=True)


class Environment:
    """A Python environment behind Grove's environment ABI.

    A class with step() follows Grove's contract (SDK section 9) in Python; a class with reset() is
    a TRL environment_factory class: one instance per episode, reset with the dataset row, its
    public methods called as tools from the turn's tool calls as TRL parses them (_assistant_message):
    Hermes' (<tool_call>{"name": ..., "arguments": {...}}</tool_call>), answered in <tool_response>
    blocks of a ChatML user turn, or, for prompts in Llama 3's format, Llama 3.1's JSON call
    ({"name": ..., "parameters": {...}} ending the turn) answered in an ipython turn; and
    get_reward() scoring the whole episode.

    Several TRL classes (`classes`, TRL's environment_factory={name: factory}) are chosen row by row
    by the dataset's `environment` column, each row's prompt showing its class's tools.

    `tools` are TRL's standalone tools (GRPOTrainer(tools=[...])): functions of the module every
    episode may call, listed before its class's methods; alone, they make an environment of tools
    without state, reset or reward."""

    def __init__(self, module, name, kwargs_json, base_dir, classes_json="", tool_names=()):
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
        classes = json.loads(classes_json) if classes_json else None
        if classes is not None and name:
            raise ConfigError("class", "give `class` (the environment) or `classes` (several, chosen by each row's "
                                       "`environment` column, as TRL's environment_factory={name: factory}), one of them")
        if classes is None and not name and not tool_names:
            raise ConfigError("class", "give `class` (the environment), `classes` (several, chosen by each row's "
                                       "`environment` column) or `tools` (functions the model may call, TRL's tools=[...])")
        loaded = _load_module(module, base_dir)
        # TRL's standalone tools, in the manifest's order (their schemas are listed in it)
        # keyed by __name__, as TRL keys its tools and get_json_schema names them to the model
        self.functions = [(f.__name__, f) for f in (_find_function(loaded, n, None, key="tools", noun="tool")
                                                     for n in dict.fromkeys(tool_names))]
        self.multi = classes is not None
        names = classes if self.multi else ({None: name} if name else {})
        if self.multi and (not names or not all(isinstance(c, str) for c in names.values())):
            raise ConfigError("classes", "must name each environment's class: classes = { NAME = \"Class\", ... }")
        self.makers = {key: self._maker(loaded, class_name, kwargs) for key, class_name in names.items()}
        self.probes = {key: make() for key, make in self.makers.items()}  # they describe the tools
        self.loop = None
        probe = next(iter(self.probes.values()), None)
        if not self.multi and callable(getattr(probe, "step", None)):
            if self.functions:
                raise ConfigError("tools", f"'{name}' follows Grove's environment contract (it has step()), which answers "
                                           "the model's turns itself: `tools` go with TRL environment_factory classes "
                                           "or alone; list its tools in its own `tools`")
            self.grove = probe
        else:
            self.grove = None
            for key, instance in self.probes.items():
                self._check_trl_class(instance, names[key])
            self.idle = {key: [instance] for key, instance in self.probes.items()}  # made once, reset often (TRL's pool)
            self.live = {}  # episode -> (batch key, instance)
        # TRL's reward columns: each class defining get_reward (a function on the class), once
        self.reward_classes = list(dict.fromkeys(
            type(i) for i in self.probes.values()
            if self.grove is None and "get_reward" in dict(inspect.getmembers(type(i), predicate=inspect.isfunction))))
        self.tool_parameters = {}  # by tool: its parameters' JSON schemas (set by tools_json())
        self.tool_parameters_of = {}  # several classes: by environment name, each class's
        self.answered_names = {}  # (batch key, episode): the tools answered in each tool turn, in answer order
        # TRL runs its tool loop when any tool exists, for a tool-less class's rows too
        self.has_tools = self.grove is None and (bool(self.functions) or any(map(_public_methods, self.probes.values())))
        global _run_environment
        _run_environment = weakref.ref(self)

    @staticmethod
    def _maker(module, class_name, kwargs):
        factory = _find_function(module, class_name, None, key="class")
        return lambda: factory(**kwargs)

    def _check_trl_class(self, instance, class_name):
        if not callable(getattr(type(instance), "reset", None)):
            raise ConfigError("class", f"'{class_name}' has neither step() (Grove's environment contract) nor reset() "
                                       "(TRL's environment_factory)" if not self.multi else
                              f"'{class_name}' has no reset(): several environments are TRL environment_factory classes")
        # TRL asks only for reset(): a class without tools still writes prompts and judges episodes

    def instances(self, first_episode, n, batch_key):
        """The objects that ran episodes first_episode .. first_episode + n - 1 of the generation batch
        `batch_key`: a TRL class's instance of each episode, still holding its state (None for an
        episode this batch did not run, such as a replayed row); Grove's contract: the one object,
        which runs every episode."""
        if self.grove is not None:
            return [self.grove] * n
        if not self.makers:
            return None  # tools alone: TRL has no environments to pass
        held = [self.live.get(first_episode + i) for i in range(n)]
        return [h[1] if h is not None and h[0] == batch_key else None for h in held]

    def episode_reward(self):
        """How its judgement of whole episodes counts (SDK episode_reward: 0 none, 1 a reward when the
        manifest sets reward_weight, 2 a reward anyway), and the column's default name. A TRL class's
        get_reward() (a function on the class, as TRL looks for it) is a reward with weight 1, named
        after the class, as TRL adds it; the Grove contract's score_episodes(), as a C plugin's,
        counts when the manifest asks, named as the manifest says ("" : its default)."""
        if self.grove is not None:
            return (1 if callable(getattr(self.grove, "score_episodes", None)) else 0), ""
        # several classes with get_reward: one column per class, as TRL's (tools_json's reward_names,
        # SDK 1.12); this name, the classes' in the order of their environment names (a TOML table's
        # keys come sorted), is the one column's where the manifest names none but the host is older
        if not self.reward_classes:  # named all the same, for the message saying it is no reward
            return 0, next((type(p).__name__ for p in self.probes.values()), "")
        return 2, "+".join(c.__name__ for c in self.reward_classes)

    def tools_json(self):
        """The tools' JSON schemas for the prompt: for TRL's classes, what transformers' get_json_schema
        makes of each tool method (as apply_chat_template(tools=...) does); for Grove's contract, the
        class's own `tools` list. "" for none."""
        if self.grove is not None:
            tools = getattr(self.grove, "tools", None)
            tools = tools() if callable(tools) else tools
            self.tool_parameters = _tool_parameters(list(tools or []))
            return json.dumps(list(tools)) if tools else ""
        probes = self.probes or {None: None}
        schemas = {key: _tool_schemas(self.functions, "tools") +
                   _tool_schemas(list(_public_methods(probe).items()) if probe is not None else [], "class")
                   for key, probe in probes.items()}
        self.tool_parameters_of = {key: _tool_parameters(tools) for key, tools in schemas.items()}
        for parameters in self.tool_parameters_of.values():
            self.tool_parameters.update(parameters)
        if self.multi:  # SDK 1.11: each row's tools chosen by its `environment` column; 1.12: its reward column
            return json.dumps({"select_by": "environment", "tools": schemas,
                               "reward_names": {key: type(probe).__name__ for key, probe in self.probes.items()
                                                if type(probe) in self.reward_classes}})
        return json.dumps(schemas[None])

    def stop_strings(self):
        if self.grove is None:
            return []  # TRL reads the tool calls of a whole turn, which ends at EOS
        strings = getattr(self.grove, "stop_strings", ())
        return [str(s) for s in (strings() if callable(strings) else strings)]

    def _await(self, value):
        if inspect.isawaitable(value):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            return self.loop.run_until_complete(value)
        return value

    def _turns(self, rows):
        # p: the dataset's prompt as JSON; "" where the row has none (the environment writes it): None
        return [Turn(e, t, text, ids, bool(eos), json.loads(p) if p else (None if p == "" else prompt),
                     json.loads(r) if r else {}, prompt) for e, t, text, ids, eos, prompt, r, p in rows]

    def _reset(self, turn, batch_key):
        """A pooled instance for the episode, reset with its dataset row as TRL resets it: the prompt
        (none for a row without one) and every other column as keyword arguments. Returns reset()'s
        text for the prompt, or None."""
        held = self.live.pop(turn.episode, None)
        if held is not None:
            self.idle[held[2]].append(held[1])
        key, row = self._environment_of(turn)
        instance = self.idle[key].pop() if self.idle[key] else self.makers[key]()
        self.live[turn.episode] = (batch_key, instance, key)
        prompt = {} if turn.prompt is None else {"prompt": turn.prompt}
        return self._await(instance.reset(**prompt, **row))

    def _release_other_batches(self, batch_key):
        """The instances of earlier generation batches' episodes back to their pools, as TRL reuses its
        instances batch after batch: grove eval numbers every batch's episodes afresh, so holding them
        by episode would make new instances for every batch."""
        for episode, (key, instance, name) in list(self.live.items()):
            if key != batch_key:
                del self.live[episode]
                self.idle[name].append(instance)

    def _forget_other_batches(self, batch_key):
        """The answered tool names of earlier generation batches, whose rewards were scored."""
        self.answered_names = {k: v for k, v in self.answered_names.items() if k[0] == batch_key}

    def _environment_of(self, turn):
        """The episode's environment name (None for one environment) and the columns reset() gets:
        with several, the `environment` column chooses and is not passed on, as in TRL."""
        if not self.multi:
            return None, turn.row
        key = turn.row.get("environment")
        if key not in self.makers:
            raise ValueError(f"Example has `environment={key!r}`, which is not among the environments of `classes`. "
                             f"Expected one of: {list(self.makers)}.")
        return key, {k: v for k, v in turn.row.items() if k != "environment"}

    def _instance(self, turn, batch_key):
        """The episode's TRL environment in this batch (reset now if begin() did not reach it); None
        for tools alone."""
        if not self.makers:
            return None
        held = self.live.get(turn.episode)
        if held is None or held[0] != batch_key:
            self._reset(turn, batch_key)
        return self.live[turn.episode][1]

    def begin(self, rows, step, seed):
        """Before generation: each episode's text for its prompt (TRL's reset() observation)."""
        turns = self._turns(rows)
        if self.grove is not None:
            begin = getattr(self.grove, "begin_episodes", None)
            texts = self._await(begin(turns)) if callable(begin) else [None] * len(turns)
        elif not self.makers:  # tools alone: nothing to reset, the dataset's prompts as they are
            self._forget_other_batches((step, seed))
            if any(t.prompt is None or (t.prompt == _PLACEHOLDER_PROMPT and not t.row) for t in turns):
                raise ConfigError("tools", "an environment of `tools` alone writes no prompts: every row needs one "
                                           "(set data.source, each row with its prompt; TRL needs a train_dataset "
                                           "with prompts without an environment_factory)")
            texts = [None] * len(turns)
        else:
            self._release_other_batches((step, seed))
            self._forget_other_batches((step, seed))
            texts = [self._reset(t, (step, seed)) for t in turns]
        if len(texts) != len(turns):
            raise ValueError(f"returned {len(texts)} texts for {len(turns)} episodes")
        for text in texts:
            if text is not None and not isinstance(text, str):
                raise TypeError(f"the text for a prompt must be a string or None, not {type(text).__name__}")
        return ["" if text is None else text for text in texts]

    def step(self, rows, step, seed):
        """[(observation, done, tool_calls, tool_failures)] for each waiting episode."""
        turns = self._turns(rows)
        if self.grove is not None:
            return [self._grove_answer(a) for a in self._await(self.grove.step(turns))]
        return [self._tool_answer(self._instance(t, (step, seed)), t, step, seed) for t in turns]

    @staticmethod
    def _grove_answer(answer):
        if answer is None or answer == "":
            return ("", True, 0, 0)
        if isinstance(answer, str):
            return (answer, False, 0, 0)
        return (str(answer.get("observation") or ""), bool(answer.get("done", False)),
                int(answer.get("tool_calls", 0)), int(answer.get("tool_failures", 0)))

    def _tools_of(self, instance):
        """An episode's tools by name, as TRL's tool dicts find them: the standalone functions, then
        its instance's methods, split into synchronous and async ones (a later one wins a name in
        its dict), the synchronous dict looked up first."""
        sync, async_ = {}, {}
        methods = _public_methods(instance) if instance is not None else {}
        for name, tool in list(self.functions) + list(methods.items()):
            (async_ if inspect.iscoroutinefunction(tool) else sync)[name] = tool
        return {**async_, **sync}

    def _tool_answer(self, instance, turn, step, seed):
        """The tool calls of the turn as TRL reads them (the turn parsed as the reward functions get
        it, so a turn whose calls do not parse calls nothing and ends the episode), each answered in
        TRL's order: the synchronous tools' results (and failed calls') in call order, then the async
        tools', which run together."""
        if not self.has_tools:
            return ("", True, 0, 0)  # no tools: TRL runs no tool loop, the episode is one turn
        llama3 = _writes_llama3_calls(turn.rendered_prompt)
        parameters = self.tool_parameters_of.get(self._environment_of(turn)[0], self.tool_parameters)
        calls = _assistant_message(turn.text, llama3, parameters).get("tool_calls", [])
        if not calls:
            return ("", True, 0, 0)
        tools = self._tools_of(instance)
        results, names, pending = [], [], []
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            try:
                if name not in tools:
                    raise ValueError(f"Tool {name} not found.")
                if inspect.iscoroutinefunction(tools[name]):
                    pending.append((name, tools[name](**arguments)))
                    continue
                result = self._await(tools[name](**arguments))
            except Exception as error:  # the model's bad call: an answer it can learn from, counted
                result = _ToolFailure(error)
            results.append(result)
            names.append(name)
        if pending:
            answers = self._await(_gather([coroutine for _, coroutine in pending]))
            results += [_ToolFailure(r) if isinstance(r, Exception) else r for r in answers]
            names += [name for name, _ in pending]
        self.answered_names.setdefault(((step, seed), turn.episode), []).append(names)  # for the reward's messages
        failures = sum(isinstance(r, _ToolFailure) for r in results)
        return (_tool_turn([str(r) for r in results], llama3), False, len(calls), failures)

    def score(self, rows, step, seed):
        """Each whole episode's score: the Grove contract's score_episodes, or TRL's get_reward()."""
        turns = self._turns(rows)  # the host calls this only when episode_reward() says it judges
        if self.grove is not None:
            scores = self._await(self.grove.score_episodes(turns))
        else:
            instances = [self._instance(t, (step, seed)) for t in turns]
            # as TRL: a column is a probed class's, so an instance of another class a factory made (a
            # subclass included) is not scored
            scores = [self._await(i.get_reward()) if type(i) in self.reward_classes else None for i in instances]
        if len(scores) != len(turns):
            raise ValueError(f"returned {len(scores)} scores for {len(turns)} episodes")
        return [math.nan if v is None else float(v) for v in scores]
