"""Grove's reward plugins as reward functions for TRL's GRPOTrainer.

A Grove reward plugin is a shared library with a C ABI (sdk/include/grove/grove_plugin.h). This
package loads one with ctypes and wraps it in a callable with TRL's reward signature, so the same
reward library serves a Grove manifest and a TRL script:

    from grove_plugins import reward_function
    correctness = reward_function("correctness", {"reference_column": "solution"})
    trainer = GRPOTrainer(model=..., reward_funcs=[correctness, my_python_reward], ...)

Its scores equal `grove plugins score` on the same rows. A plugin's error becomes a PluginError
carrying the plugin's message. Plugins are found by name on `plugin_dirs`, then $GROVE_PLUGIN_PATH,
then next to the `grove` on PATH (<prefix>/lib/grove/plugins), or named by the path of the library.
"""

import ctypes
import json
import logging
import math
import os
import shutil

from . import _abi

__all__ = ["PluginError", "RewardPlugin", "reward_function", "plugin_search_path"]
_log = logging.getLogger("grove_plugins")


class PluginError(Exception):
    """A plugin refused its configuration or failed to score; the message is the plugin's."""

    def __init__(self, message, key=None):
        super().__init__(message)
        self.key = key


def plugin_search_path(plugin_dirs=()):
    """The folders searched for a plugin named by name, in order (as the grove host searches)."""
    dirs = [os.fspath(d) for d in plugin_dirs]
    dirs += [d for d in os.environ.get("GROVE_PLUGIN_PATH", "").split(":") if d]
    grove = shutil.which("grove")
    if grove:
        dirs.append(os.path.join(os.path.dirname(os.path.realpath(grove)), "..", "lib", "grove", "plugins"))
    return dirs


@_abi.HOST_LOG
def _host_log(level, plugin_name, message):
    _log.log({0: logging.DEBUG, 1: logging.INFO}.get(level, logging.WARNING), "%s: %s",
             (plugin_name or b"").decode(), (message or b"").decode())


_HOST = _abi.HostApi(ctypes.sizeof(_abi.HostApi), _abi.ABI_MAJOR, _abi.ABI_MINOR, b"grove-plugins 0.1.0", _host_log)
_LIBRARIES = {}  # path -> (CDLL, PluginList): loaded once, kept for the process


def _plugins_in(path):
    """The descriptors a library holds; errors name the file."""
    path = os.path.realpath(path)
    if path not in _LIBRARIES:
        try:
            library = ctypes.CDLL(path)
            entry = getattr(library, _abi.ENTRY_SYMBOL)
        except (OSError, AttributeError) as error:
            raise PluginError(f"{path}: not a Grove plugin library ({error})") from None
        entry.restype = ctypes.POINTER(_abi.PluginList)
        entry.argtypes = [ctypes.POINTER(_abi.HostApi)]
        plugin_list = entry(ctypes.byref(_HOST))
        if not plugin_list or plugin_list.contents.abi_major != _abi.ABI_MAJOR:
            major = plugin_list.contents.abi_major if plugin_list else "?"
            raise PluginError(f"{path}: built for plugin ABI {major}.x, but this package speaks {_abi.ABI_MAJOR}.x; "
                              "rebuild the plugin against the Grove SDK")
        _LIBRARIES[path] = (library, plugin_list.contents)
    plugin_list = _LIBRARIES[path][1]
    return [plugin_list.plugins[i].contents for i in range(plugin_list.count)], plugin_list.abi_minor


def _find(reference, plugin_dirs):
    """(descriptor, library path, ABI minor) of the reward plugin named or at `reference`."""
    if "/" in reference or reference.endswith(".so"):
        candidates = [reference]
    else:
        candidates = []
        for folder in plugin_search_path(plugin_dirs):
            if os.path.isdir(folder):
                candidates += [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".so")]
    for path in candidates:
        try:
            descriptors, minor = _plugins_in(path)
        except PluginError:
            if candidates == [reference]:
                raise
            continue  # a library in a plugin folder that is not a plugin: the host skips it too
        rewards = [d for d in descriptors if d.kind == _abi.KIND_REWARD]
        chosen = rewards if candidates == [reference] else [d for d in rewards if d.name.decode() == reference]
        if chosen:
            return chosen[0], os.path.realpath(path), minor
    where = ", ".join(plugin_search_path(plugin_dirs)) or "(no folders: set GROVE_PLUGIN_PATH)"
    raise PluginError(f"no reward plugin '{reference}' in {where}")


def _toml(value):
    """TOML text of one value (the plugin's raw_toml; plugins rarely read it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"{type(value).__name__} has no TOML form")


class _Config:
    """A configuration dict checked against the plugin's declared keys, as grove_config (owns its memory)."""

    def __init__(self, descriptor, config, plugin_name):
        keys = {descriptor.config_keys[i].name.decode(): descriptor.config_keys[i] for i in range(descriptor.config_key_count)}
        self._keep = []
        values = []
        for key, value in config.items():
            if key not in keys:
                raise PluginError(f"unknown key '{key}' for plugin '{plugin_name}'; accepted keys: "
                                  f"{', '.join(keys) or '(none)'}", key)
            values.append(self._value(key, keys[key], value, plugin_name))
        for key, declared in keys.items():
            if declared.required and key not in config:
                raise PluginError(f"missing required key '{key}' for plugin '{plugin_name}' "
                                  f"({(declared.help or b'').decode()})", key)
        self.values = (_abi.ConfigValue * max(len(values), 1))(*values)
        raw = "\n".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in config.items()).encode()
        self.struct = _abi.Config(ctypes.sizeof(_abi.Config), len(values), self.values, raw,
                                  f"python config of '{plugin_name}'".encode(), os.getcwd().encode())
        self._keep += [raw]

    def _text(self, s):
        b = s.encode()
        self._keep.append(b)
        return b

    def _value(self, key, declared, value, plugin_name):
        v = _abi.ConfigValue(struct_size=ctypes.sizeof(_abi.ConfigValue), key=self._text(key), type=declared.type)
        t = declared.type
        ok = {
            _abi.VALUE_STRING: isinstance(value, str),
            _abi.VALUE_INT: isinstance(value, int) and not isinstance(value, bool),
            _abi.VALUE_FLOAT: isinstance(value, (int, float)) and not isinstance(value, bool),
            _abi.VALUE_BOOL: isinstance(value, bool),
            _abi.VALUE_STRING_ARRAY: isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value),
            _abi.VALUE_INT_ARRAY: isinstance(value, (list, tuple)) and all(isinstance(x, int) for x in value),
            _abi.VALUE_FLOAT_ARRAY: isinstance(value, (list, tuple)) and all(isinstance(x, (int, float)) for x in value),
            _abi.VALUE_TABLE: isinstance(value, dict),
        }.get(t, False)
        if not ok:
            raise PluginError(f"'{key}' of plugin '{plugin_name}' has the wrong type ({type(value).__name__}): "
                              f"{(declared.help or b'').decode()}", key)
        if t == _abi.VALUE_STRING:
            v.string_value = self._text(value)
        elif t == _abi.VALUE_TABLE:
            v.string_value = self._text(json.dumps(value))
        elif t == _abi.VALUE_INT:
            v.int_value = value
        elif t == _abi.VALUE_FLOAT:
            v.float_value = float(value)
        elif t == _abi.VALUE_BOOL:
            v.bool_value = int(value)
        else:
            array_type = {_abi.VALUE_STRING_ARRAY: ctypes.c_char_p, _abi.VALUE_INT_ARRAY: ctypes.c_int64,
                          _abi.VALUE_FLOAT_ARRAY: ctypes.c_double}[t]
            items = [self._text(x) if t == _abi.VALUE_STRING_ARRAY else x for x in value]
            array = (array_type * max(len(items), 1))(*items)
            self._keep.append(array)
            v.array_length = len(items)
            field = {_abi.VALUE_STRING_ARRAY: "string_array", _abi.VALUE_INT_ARRAY: "int_array",
                     _abi.VALUE_FLOAT_ARRAY: "float_array"}[t]
            setattr(v, field, ctypes.cast(array, type(getattr(v, field))))
        return v


class _ErrorCapture:
    def __init__(self):
        self.key = self.message = None

        @_abi.REPORT
        def report(_sink, key, message):
            self.key = key.decode() if key else None
            self.message = message.decode("utf-8", "replace") if message else "(no message)"

        self._report = report
        self.sink = _abi.ErrorSink(ctypes.sizeof(_abi.ErrorSink), None, report)


def _is_conversation(prompt):
    return isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], dict) and "role" in prompt[0]


def _texts(strings, keep):
    encoded = [s.encode("utf-8") for s in strings]
    keep.append(encoded)
    return (_abi.Text * max(len(encoded), 1))(*[_abi.Text(b, len(b)) for b in encoded])


_TRAINER_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


class RewardPlugin:
    """A Grove reward plugin as a TRL reward function: call it with TRL's arguments (prompts,
    completions, completion_ids and the dataset's columns as keyword lists); it returns one float
    per completion, or None where the plugin gives NaN (not applicable)."""

    def __init__(self, plugin, config=None, *, plugin_dirs=(), num_generations=1, name=None):
        if isinstance(config, str):
            import tomllib

            config = tomllib.loads(config)
        self._descriptor, self.file, self._abi_minor = _find(plugin, plugin_dirs)
        self.plugin_name = self._descriptor.name.decode()
        self.__name__ = name or self.plugin_name  # TRL names a reward function's metrics by __name__
        self.num_generations = num_generations
        self.metric_names = [self._descriptor.metric_names[i].decode() for i in range(self._descriptor.metric_count)]
        self._config = _Config(self._descriptor, dict(config or {}), self.plugin_name)
        self._instance = ctypes.c_void_p()
        capture = _ErrorCapture()
        status = self._descriptor.create(ctypes.byref(self._config.struct), ctypes.byref(self._instance),
                                         ctypes.byref(capture.sink))
        if status != 0:
            self._instance = None
            key = f"'{capture.key}': " if capture.key else ""
            raise PluginError(f"plugin '{self.plugin_name}' ({self.file}) refused its configuration: "
                              f"{key}{capture.message}", capture.key)

    def __del__(self):
        instance = getattr(self, "_instance", None)
        if instance is not None and self._descriptor.destroy:
            self._descriptor.destroy(instance)

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        n = len(completions)
        if len(prompts) != n or n % self.num_generations:
            raise ValueError(f"{n} completions for {len(prompts)} prompts, in groups of {self.num_generations}")
        keep = []
        conversational = bool(prompts) and _is_conversation(prompts[0])
        texts = [c[0]["content"] if conversational else c for c in completions]
        prompt_texts = ["\n".join(m["content"] for m in p) if conversational else p for p in prompts]
        if completion_ids is None:  # as `grove plugins score`: the UTF-8 bytes stand for tokens
            completion_ids = [list(t.encode("utf-8")) for t in texts]
        offsets = [0]
        for ids in completion_ids:
            offsets.append(offsets[-1] + len(ids))
        tokens = [t for ids in completion_ids for t in ids]
        columns = {k: v for k, v in kwargs.items() if k not in _TRAINER_KWARGS}
        rows = [json.dumps({k: v[i] for k, v in columns.items()}, default=str) for i in range(n)]
        state = kwargs.get("trainer_state")
        batch = _abi.RewardBatch(
            struct_size=ctypes.sizeof(_abi.RewardBatch),
            count=n,
            num_generations=self.num_generations,
            prompts=_texts(prompt_texts, keep),
            completions=_texts(texts, keep),
            completion_token_offsets=(ctypes.c_int64 * (n + 1))(*offsets),
            completion_tokens=(ctypes.c_int32 * max(len(tokens), 1))(*tokens),
            truncated=(ctypes.c_uint8 * max(n, 1))(),
            row_json=_texts(rows, keep),
            step=getattr(state, "global_step", 0) or 0,
            world_size=1,
            model_token_mask=(ctypes.c_uint8 * max(len(tokens), 1))(*([1] * len(tokens))),
            prompt_json=_texts([json.dumps(p) for p in prompts], keep),
            max_steps=getattr(state, "max_steps", 0) or 0,
        )
        scores = (ctypes.c_float * max(n, 1))(*([math.nan] * n))
        metrics = (ctypes.c_float * max(n * len(self.metric_names), 1))(*([math.nan] * (n * len(self.metric_names))))
        logged = []

        @_abi.LOG_METRIC
        def log_metric(_out, name, value):
            logged.append((name.decode(), value))

        extras, extra_errors = [], []

        @_abi.LOG_EXTRA
        def log_extra(_out, column, values, count):
            try:  # an exception here would be printed and dropped by ctypes: kept, raised after score()
                if count > n:
                    raise ValueError(f"{count} values for a batch of {n} rows")
                texts = ctypes.cast(values, ctypes.POINTER(_abi.RawText))
                extras.append((column.decode(), [json.loads(ctypes.string_at(texts[i].data, texts[i].size))
                                                 for i in range(count)]))
            except Exception as e:  # noqa: BLE001 (any error of the plugin's values)
                extra_errors.append(f"log_extra({column!r}): {e}")

        out = _abi.RewardOutput(ctypes.sizeof(_abi.RewardOutput), scores, len(self.metric_names), metrics, None, log_metric,
                                log_extra)
        capture = _ErrorCapture()
        status = self._descriptor.reward.contents.score(self._instance, ctypes.byref(batch), ctypes.byref(out),
                                                        ctypes.byref(capture.sink))
        if status != 0:
            raise PluginError(f"plugin '{self.plugin_name}' ({self.file}) failed in score(): {capture.message}", capture.key)
        if extra_errors:
            raise PluginError(f"plugin '{self.plugin_name}' ({self.file}) logged values Grove cannot read: "
                              + "; ".join(extra_errors))
        report = kwargs.get("log_metric")
        if report is not None:
            for m, metric in enumerate(self.metric_names):
                values = [metrics[m * n + i] for i in range(n) if not math.isnan(metrics[m * n + i])]
                if values:
                    report(f"rewards/{self.__name__}/{metric}", sum(values) / len(values))
            for name, value in logged:
                report(name, value)
        extra = kwargs.get("log_extra")  # TRL's: the values go to its completions table
        if extra is not None:
            for column, values in extras:
                extra(column, values)
        return [None if math.isnan(scores[i]) else float(scores[i]) for i in range(n)]


reward_function = RewardPlugin
