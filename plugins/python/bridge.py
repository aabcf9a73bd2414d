"""The Python side of Grove's `python` plugin: reward functions called exactly as TRL calls them.

python_plugin.cpp embeds this file as the module `grove_python_bridge`. For each batch it hands over
Grove's reward batch as plain lists; `Reward.score` turns them into TRL's arguments (GRPOTrainer.
_calculate_rewards): prompts and completions in the standard (text) or conversational (messages) form,
completion_ids, every other dataset column as a keyword list, trainer_state, log_metric and
log_extra. It returns one float per row (None -> NaN) and the metrics logged by name.
"""

import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback
import types


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


def _find_function(module, name, factory_args):
    function = getattr(module, name, None)
    if function is None or not callable(function):
        callables = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None)))
        raise ConfigError("function", f"module '{module.__name__}' has no function '{name}'; it has: {', '.join(callables)}")
    if factory_args is not None:  # e.g. get_soft_overlong_punishment(max_completion_len=..., ...)
        function = function(**factory_args)
        if not callable(function):
            raise ConfigError("factory_args", f"'{name}(**factory_args)' returned {type(function).__name__}, not a function")
    return function


def _is_conversation(prompt):
    """TRL's is_conversational for a prompt: a list of messages with a role."""
    return isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], dict) and "role" in prompt[0]


class Reward:
    """One [[rewards]] use of the python plugin: a module's function and its fixed keyword arguments."""

    def __init__(self, module, function, kwargs_json, factory_args_json, base_dir):
        self.kwargs = json.loads(kwargs_json) if kwargs_json else {}
        factory_args = json.loads(factory_args_json) if factory_args_json else None
        self.function = _find_function(_load_module(module, base_dir), function, factory_args)
        self.name = f"{module}:{function}"
        self.loop = None  # an event loop for async reward functions, made on first use

    def score(self, prompts, completions, completion_ids, row_json, prompt_json, step, max_steps):
        n = len(completions)
        if prompt_json is not None:
            prompts = [json.loads(p) for p in prompt_json]  # the dataset's prompts, as TRL passes them
        if prompts and _is_conversation(prompts[0]):
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        rows = [json.loads(r) if r else {} for r in row_json]
        keys = [k for k in (rows[0] if rows else {}) if k not in ("prompt", "completion", "completion_ids")]
        columns = {k: [row.get(k) for row in rows] for k in keys}
        logged = []
        columns["trainer_state"] = types.SimpleNamespace(global_step=step, max_steps=max_steps)
        columns["log_metric"] = lambda name, value: logged.append((str(name), float(value)))
        columns["log_extra"] = lambda column, values: None  # Grove keeps no completions table
        columns.update(self.kwargs)
        result = self.function(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        if inspect.isawaitable(result):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            result = self.loop.run_until_complete(result)
        return self._scores(result, n), logged

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
