"""ctypes mirror of the parts of Grove's plugin ABI (sdk/include/grove/grove_plugin.h, 1.8) that a
reward plugin touches. Field order and types follow the header exactly; tests/python/ checks the
sizes against the C compiler's."""

import ctypes as C

ABI_MAJOR = 1
ABI_MINOR = 8
ENTRY_SYMBOL = "grove_plugin_entry"

KIND_REWARD = 1
KIND_NAMES = {1: "reward", 2: "reduction", 3: "adapter", 4: "environment", 5: "objective"}

VALUE_STRING, VALUE_INT, VALUE_FLOAT, VALUE_BOOL = 1, 2, 3, 4
VALUE_STRING_ARRAY, VALUE_INT_ARRAY, VALUE_FLOAT_ARRAY, VALUE_TABLE = 5, 6, 7, 8


class ErrorSink(C.Structure):
    pass


REPORT = C.CFUNCTYPE(None, C.POINTER(ErrorSink), C.c_char_p, C.c_char_p)
ErrorSink._fields_ = [("struct_size", C.c_uint32), ("host_data", C.c_void_p), ("report", REPORT)]


class ConfigKey(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("name", C.c_char_p),
        ("type", C.c_uint32),
        ("required", C.c_uint32),
        ("default_text", C.c_char_p),
        ("help", C.c_char_p),
    ]


class ConfigValue(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("key", C.c_char_p),
        ("type", C.c_uint32),
        ("string_value", C.c_char_p),
        ("int_value", C.c_int64),
        ("float_value", C.c_double),
        ("bool_value", C.c_int32),
        ("array_length", C.c_uint32),
        ("string_array", C.POINTER(C.c_char_p)),
        ("int_array", C.POINTER(C.c_int64)),
        ("float_array", C.POINTER(C.c_double)),
    ]


class Config(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("count", C.c_uint32),
        ("values", C.POINTER(ConfigValue)),
        ("raw_toml", C.c_char_p),
        ("source_name", C.c_char_p),
        ("base_dir", C.c_char_p),
    ]


class Text(C.Structure):
    _fields_ = [("data", C.c_char_p), ("size", C.c_size_t)]


class RawText(C.Structure):
    """Text as its address: a log_extra value from a plugin need not end with a NUL."""
    _fields_ = [("data", C.c_void_p), ("size", C.c_size_t)]


class RewardBatch(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("count", C.c_uint32),
        ("num_generations", C.c_uint32),
        ("prompts", C.POINTER(Text)),
        ("completions", C.POINTER(Text)),
        ("completion_token_offsets", C.POINTER(C.c_int64)),
        ("completion_tokens", C.POINTER(C.c_int32)),
        ("truncated", C.POINTER(C.c_uint8)),
        ("row_json", C.POINTER(Text)),
        ("step", C.c_int64),
        ("seed", C.c_uint64),
        ("rank", C.c_uint32),
        ("world_size", C.c_uint32),
        ("global_row_offset", C.c_uint64),
        ("model_token_mask", C.POINTER(C.c_uint8)),
        ("prompt_json", C.POINTER(Text)),
        ("max_steps", C.c_int64),
    ]


class RewardOutput(C.Structure):
    pass


LOG_METRIC = C.CFUNCTYPE(None, C.POINTER(RewardOutput), C.c_char_p, C.c_double)
LOG_EXTRA = C.CFUNCTYPE(None, C.POINTER(RewardOutput), C.c_char_p, C.POINTER(Text), C.c_uint32)
RewardOutput._fields_ = [
    ("struct_size", C.c_uint32),
    ("scores", C.POINTER(C.c_float)),
    ("metric_count", C.c_uint32),
    ("metrics", C.POINTER(C.c_float)),
    ("host_data", C.c_void_p),
    ("log_metric", LOG_METRIC),
    ("log_extra", LOG_EXTRA),
]

SCORE = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(RewardBatch), C.POINTER(RewardOutput), C.POINTER(ErrorSink))


class RewardApi(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("score", SCORE)]


CREATE = C.CFUNCTYPE(C.c_int, C.POINTER(Config), C.POINTER(C.c_void_p), C.POINTER(ErrorSink))
DESTROY = C.CFUNCTYPE(None, C.c_void_p)


class Descriptor(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("kind", C.c_uint32),
        ("name", C.c_char_p),
        ("version", C.c_char_p),
        ("description", C.c_char_p),
        ("flags", C.c_uint64),
        ("config_keys", C.POINTER(ConfigKey)),
        ("config_key_count", C.c_uint32),
        ("metric_names", C.POINTER(C.c_char_p)),
        ("metric_count", C.c_uint32),
        ("create", CREATE),
        ("destroy", DESTROY),
        ("reward", C.POINTER(RewardApi)),
        ("reduction", C.c_void_p),
        ("adapter", C.c_void_p),
        ("environment", C.c_void_p),
        ("objective", C.c_void_p),
    ]


class PluginList(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("abi_major", C.c_uint32),
        ("abi_minor", C.c_uint32),
        ("count", C.c_uint32),
        ("plugins", C.POINTER(C.POINTER(Descriptor))),
    ]


HOST_LOG = C.CFUNCTYPE(None, C.c_int32, C.c_char_p, C.c_char_p)


class HostApi(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("abi_major", C.c_uint32),
        ("abi_minor", C.c_uint32),
        ("host_version", C.c_char_p),
        ("log", HOST_LOG),
    ]


def has_field(struct_size, struct_type, field):
    """GROVE_HAS_FIELD: a struct of `struct_size` bytes reaches `field`."""
    f = getattr(struct_type, field)
    return struct_size >= f.offset + f.size
