// The python plugins' Python half: libgrove_python_embed.so, which links the environment's
// libpython and embeds the interpreter. libgrove_python.so (python_plugin.cpp, in the plugin
// folder) loads it on first use and forwards every call here, so only runs that use a Python
// plugin load Python at all.
//
// The interpreter is the virtual environment's Grove was built with (or the one $GROVE_PYTHON
// names), started once per process by the first instance and never finalized (extension modules
// such as torch's do not survive Py_Finalize). Its lock is held only inside calls. TRL's calling
// conventions live in bridge.py (compiled in as a string); this file moves batches across and turns
// Python exceptions into Grove errors.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

#include <cmath>
#include <grove/plugin.hpp>
#include <mutex>
#include <string>
#include <vector>

#include "python_plugins.hpp"

extern "C" const char grove_python_bridge_source[];  // bridge.py, generated into bridge_source.cpp by CMake

namespace {

using grove::sdk::Error;
using namespace grove::python;

// An owned reference; releases it when it goes out of scope (the interpreter lock must be held).
class Ref {
public:
    explicit Ref(PyObject* object = nullptr) : object_(object) {}
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    ~Ref() { Py_XDECREF(object_); }
    PyObject* get() const { return object_; }
    PyObject* release() {
        PyObject* o = object_;
        object_ = nullptr;
        return o;
    }
    explicit operator bool() const { return object_ != nullptr; }

private:
    PyObject* object_;
};

class HoldInterpreterLock {
public:
    HoldInterpreterLock() : state_(PyGILState_Ensure()) {}
    ~HoldInterpreterLock() { PyGILState_Release(state_); }

private:
    PyGILState_STATE state_;
};

PyObject* bridge_module();  // below

// A Python string's UTF-8 text; empty when it is not a string (the pending error says why).
std::string utf8(PyObject* text) {
    const char* s = text ? PyUnicode_AsUTF8(text) : nullptr;
    return s ? s : "";
}

// The pending Python exception as text (its type, message and last frames), then cleared.
// `config_key` receives the key a bridge.ConfigError names.
std::string take_python_error(std::string* config_key = nullptr) {
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
    if (!type) return "unknown Python error";
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback && value) PyException_SetTraceback(value, traceback);
    Ref owned_type(type), owned(value), owned_traceback(traceback);
    PyObject* error = value ? value : type;
    if (config_key) {
        Ref key(PyObject_GetAttrString(error, "key"));
        if (key && PyUnicode_Check(key.get())) *config_key = utf8(key.get());
        PyErr_Clear();
    }
    Ref text(PyObject_CallMethod(bridge_module(), "describe_exception", "O", error));
    if (!text || !PyUnicode_Check(text.get())) {
        PyErr_Clear();
        Ref plain(PyObject_Str(error));
        return plain ? utf8(plain.get()) : "unprintable Python error";
    }
    return utf8(text.get());
}

// The pending Python exception as a configuration error, naming the key a bridge.ConfigError names.
[[noreturn]] void throw_config_error(const std::string& doing) {
    std::string key;
    std::string message = take_python_error(&key);
    throw Error(GROVE_ERROR_CONFIG, doing + ": " + message, key);
}

std::string python_executable() {
    if (const char* chosen = std::getenv("GROVE_PYTHON"); chosen && *chosen) return chosen;
    return GROVE_DEFAULT_PYTHON;  // the build's virtual environment
}

// Starts the interpreter once; throws with what to do when it cannot.
void start_interpreter() {
    static std::once_flag once;
    static std::string failure;
    std::call_once(once, [] {
        // Extension modules (json, numpy, torch) expect libpython's symbols to be global; the host
        // loaded this plugin, and libpython with it, privately.
        Dl_info info{};
        if (dladdr(reinterpret_cast<void*>(&Py_InitializeFromConfig), &info) && info.dli_fname)
            dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        if (!Py_IsInitialized()) {  // else: loaded into a Python process, whose interpreter serves
            const std::string executable = python_executable();
            PyConfig config;
            PyConfig_InitPythonConfig(&config);
            config.install_signal_handlers = 0;  // SIGINT and SIGTERM stay Grove's (a checkpoint, then exit)
            config.parse_argv = 0;
            PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, executable.c_str());
            if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
            PyConfig_Clear(&config);
            if (PyStatus_Exception(status)) {
                failure = "the Python interpreter at " + executable +
                          " did not start: " + (status.err_msg ? status.err_msg : "unknown reason") +
                          "; set GROVE_PYTHON to a Python 3.11 executable (that of the build's .venv)";
                return;
            }
            PyEval_SaveThread();  // release the lock: calls take it when they need it
        }
        HoldInterpreterLock lock;
        Ref code(Py_CompileString(grove_python_bridge_source, "grove_python_bridge.py", Py_file_input));
        Ref module(code ? PyImport_ExecCodeModule("grove_python_bridge", code.get()) : nullptr);
        if (!module) {
            PyErr_Print();
            failure = "the python plugin's bridge module did not load (a bug: report it)";
        }
    });
    if (!failure.empty()) throw Error(GROVE_ERROR_CONFIG, failure);
}

PyObject* bridge_module() {
    static PyObject* module = PyImport_AddModule("grove_python_bridge");  // borrowed, lives forever
    return module;
}

PyObject* text_list(const grove_text* texts, uint32_t n) {
    Ref list(PyList_New(n));
    for (uint32_t i = 0; list && i < n; ++i) {
        // invalid UTF-8 (a token cut mid-character) becomes U+FFFD, as tokenizers' decode does
        PyObject* s = PyUnicode_DecodeUTF8(texts[i].data, Py_ssize_t(texts[i].size), "replace");
        if (!s) return nullptr;
        PyList_SET_ITEM(list.get(), i, s);
    }
    return list.release();
}

PyObject* token_lists(const grove_reward_batch& b) {
    Ref list(PyList_New(b.count));
    for (uint32_t i = 0; list && i < b.count; ++i) {
        const int64_t begin = b.completion_token_offsets[i], end = b.completion_token_offsets[i + 1];
        Ref ids(PyList_New(end - begin));
        if (!ids) return nullptr;
        for (int64_t t = begin; t < end; ++t) {
            PyObject* id = PyLong_FromLong(b.completion_tokens[t]);
            if (!id) return nullptr;
            PyList_SET_ITEM(ids.get(), t - begin, id);
        }
        PyList_SET_ITEM(list.get(), i, ids.release());
    }
    return list.release();
}

// Each row's episode turns (grove_reward_batch.episode_turns, ABI 1.10) as a list of strings: empty
// for a row that is no episode, and for every row of a host that sends none.
PyObject* turn_lists(const grove_reward_batch& b) {
    const bool has_turns = GROVE_HAS_FIELD(&b, grove_reward_batch, episode_turns) && b.episode_turns;
    Ref list(PyList_New(b.count));
    for (uint32_t i = 0; list && i < b.count; ++i) {
        const uint64_t begin = has_turns ? b.episode_turn_offsets[i] : 0, end = has_turns ? b.episode_turn_offsets[i + 1] : 0;
        PyObject* turns = has_turns ? text_list(b.episode_turns + begin, uint32_t(end - begin)) : PyList_New(0);
        if (!turns) return nullptr;
        PyList_SET_ITEM(list.get(), i, turns);
    }
    return list.release();
}

class PythonReward {
public:
    explicit PythonReward(const grove::sdk::Config& config)
            : module_(config.get_string("module", "")), function_(config.get_string("function", "")) {
        start_interpreter();
        HoldInterpreterLock lock;
        reward_ = PyObject_CallMethod(bridge_module(), "Reward", "sssss", module_.c_str(), function_.c_str(),
                                      config.get_string("kwargs", "").c_str(), config.get_string("factory_args", "").c_str(),
                                      config.base_dir().c_str());
        if (!reward_) throw_config_error("loading " + function_ + " from " + module_);
    }
    ~PythonReward() {
        HoldInterpreterLock lock;
        Py_XDECREF(reward_);
    }

    void score(const grove_reward_batch& b, grove_reward_output& out) {
        HoldInterpreterLock lock;
        const bool has_prompt_json = GROVE_HAS_FIELD(&b, grove_reward_batch, prompt_json) && b.prompt_json;
        const int64_t max_steps = GROVE_HAS_FIELD(&b, grove_reward_batch, max_steps) ? b.max_steps : 0;
        Ref prompts(text_list(b.prompts, b.count)), completions(text_list(b.completions, b.count));
        Ref ids(token_lists(b)), rows(text_list(b.row_json, b.count));
        Ref prompt_json(has_prompt_json ? text_list(b.prompt_json, b.count) : Py_NewRef(Py_None));
        Ref turns(turn_lists(b));
        Ref result(prompts && completions && ids && rows && prompt_json && turns
                       ? PyObject_CallMethod(reward_, "score", "OOOOOLLKKO", prompts.get(), completions.get(), ids.get(),
                                             rows.get(), prompt_json.get(), (long long)b.step, (long long)max_steps,
                                             (unsigned long long)b.seed, (unsigned long long)b.global_row_offset, turns.get())
                       : nullptr);
        if (!result) fail(b, take_python_error());
        // (scores: list of floats, logged: list of (name, value), extras: list of (column, [JSON text])),
        // as bridge.Reward.score returns
        PyObject* scores = PyTuple_GetItem(result.get(), 0);
        PyObject* logged = PyTuple_GetItem(result.get(), 1);
        PyObject* extras = PyTuple_GetItem(result.get(), 2);
        for (uint32_t i = 0; i < b.count; ++i) out.scores[i] = float(PyFloat_AsDouble(PyList_GetItem(scores, i)));
        const bool can_log = GROVE_HAS_FIELD(&out, grove_reward_output, log_metric) && out.log_metric;
        for (Py_ssize_t k = 0; can_log && k < PyList_Size(logged); ++k) {
            PyObject* entry = PyList_GetItem(logged, k);
            out.log_metric(&out, utf8(PyTuple_GetItem(entry, 0)).c_str(), PyFloat_AsDouble(PyTuple_GetItem(entry, 1)));
        }
        const bool can_log_extra = GROVE_HAS_FIELD(&out, grove_reward_output, log_extra) && out.log_extra;
        for (Py_ssize_t k = 0; can_log_extra && k < PyList_Size(extras); ++k) {
            PyObject* entry = PyList_GetItem(extras, k);
            PyObject* values = PyTuple_GetItem(entry, 1);
            std::vector<std::string> texts;
            for (Py_ssize_t i = 0; i < PyList_Size(values); ++i) texts.push_back(utf8(PyList_GetItem(values, i)));
            std::vector<grove_text> views;
            for (const std::string& text : texts) views.push_back({text.data(), text.size()});
            out.log_extra(&out, utf8(PyTuple_GetItem(entry, 0)).c_str(), views.data(), uint32_t(views.size()));
        }
        if (PyErr_Occurred()) fail(b, take_python_error());
    }

private:
    [[noreturn]] void fail(const grove_reward_batch& b, const std::string& message) const {
        throw Error(GROVE_ERROR_INVALID_ARGUMENT, "reward function " + function_ + " (" + module_ +
                                                      ") failed on the batch of step " + std::to_string(b.step) + " (" +
                                                      std::to_string(b.count) + " rows): " + message);
    }

    std::string module_, function_;
    PyObject* reward_ = nullptr;  // a bridge.Reward
};

// One tuple per episode: (episode, turn, text, token ids, ended with EOS, prompt, row JSON, prompt JSON or None)
PyObject* episode_rows(const grove_environment_batch& b) {
    const bool has_prompt_json = GROVE_HAS_FIELD(&b, grove_environment_batch, prompt_json) && b.prompt_json;
    Ref texts(text_list(b.turn_texts, b.count)), prompts(text_list(b.prompts, b.count)), rows(text_list(b.row_json, b.count));
    Ref prompt_json(has_prompt_json ? text_list(b.prompt_json, b.count) : nullptr);
    if (!texts || !prompts || !rows || (has_prompt_json && !prompt_json)) return nullptr;
    Ref list(PyList_New(b.count));
    for (uint32_t i = 0; list && i < b.count; ++i) {
        const int64_t begin = b.turn_token_offsets[i], end = b.turn_token_offsets[i + 1];
        Ref ids(PyList_New(end - begin));
        if (!ids) return nullptr;
        for (int64_t t = begin; t < end; ++t) PyList_SET_ITEM(ids.get(), t - begin, PyLong_FromLong(b.turn_tokens[t]));
        PyObject* row = Py_BuildValue("(KIOOOOOO)", (unsigned long long)b.episodes[i], (unsigned)b.turns[i],
                                      PyList_GET_ITEM(texts.get(), i), ids.get(), b.turn_ended_with_eos[i] ? Py_True : Py_False,
                                      PyList_GET_ITEM(prompts.get(), i), PyList_GET_ITEM(rows.get(), i),
                                      prompt_json ? PyList_GET_ITEM(prompt_json.get(), i) : Py_None);
        if (!row) return nullptr;
        PyList_SET_ITEM(list.get(), i, row);
    }
    return list.release();
}

// An environment written in Python (bridge.Environment): TRL's environment_factory classes, or
// Grove's environment contract in Python.
class PythonEnvironment {
public:
    explicit PythonEnvironment(const grove::sdk::Config& config)
            : module_(config.get_string("module", "")), class_(display_name(config)) {
        start_interpreter();
        HoldInterpreterLock lock;
        Ref tool_names(PyList_New(0));
        for (const std::string& name : config.get_strings("tools", {})) {
            Ref text(PyUnicode_FromString(name.c_str()));
            if (!text || PyList_Append(tool_names.get(), text.get()) != 0) throw_config_error("reading `tools`");
        }
        environment_ =
            PyObject_CallMethod(bridge_module(), "Environment", "sssssO", module_.c_str(),
                                config.get_string("class", "").c_str(), config.get_string("kwargs", "").c_str(),
                                config.base_dir().c_str(), config.get_string("classes", "").c_str(), tool_names.get());
        Ref strings(environment_ ? PyObject_CallMethod(environment_, "stop_strings", nullptr) : nullptr);
        if (!strings) throw_config_error("loading " + class_ + " from " + module_);
        for (Py_ssize_t i = 0; i < PyList_Size(strings.get()); ++i)
            stop_strings_.push_back(utf8(PyList_GetItem(strings.get(), i)));
        for (const std::string& s : stop_strings_) stop_pointers_.push_back(s.c_str());
        stop_pointers_.push_back(nullptr);
    }
    ~PythonEnvironment() {
        HoldInterpreterLock lock;
        Py_XDECREF(environment_);
    }

    const char* const* stop_strings() const { return stop_pointers_.data(); }

    std::string tools_json() const {
        HoldInterpreterLock lock;
        Ref json(PyObject_CallMethod(environment_, "tools_json", nullptr));
        if (!json) throw_config_error("describing the tools of " + class_);
        return utf8(json.get());
    }

    grove::sdk::EpisodeReward episode_reward() const {
        HoldInterpreterLock lock;
        // (judgement, name), as bridge.Environment.episode_reward returns
        Ref answer(PyObject_CallMethod(environment_, "episode_reward", nullptr));
        unsigned int judgement = 0;
        const char* name = nullptr;
        if (!answer || !PyArg_ParseTuple(answer.get(), "Is", &judgement, &name))
            throw_config_error("asking " + class_ + " how it judges episodes");
        return {uint32_t(judgement), name};
    }

    void step(const grove_environment_batch& b, grove_environment_output& out) {
        HoldInterpreterLock lock;
        Ref answers(call("step", b));
        for (uint32_t i = 0; i < b.count; ++i) {
            // (observation, done, tool_calls, tool_failures), as bridge.Environment.step returns
            PyObject* a = PyList_GetItem(answers.get(), i);
            Py_ssize_t size = 0;
            const char* text = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(a, 0), &size);
            if (text && size > 0) out.observations[i]->append(out.observations[i], text, size_t(size));
            out.done[i] = PyObject_IsTrue(PyTuple_GetItem(a, 1)) ? 1 : 0;
            out.tool_calls[i] = uint32_t(PyLong_AsUnsignedLong(PyTuple_GetItem(a, 2)));
            out.tool_failures[i] = uint32_t(PyLong_AsUnsignedLong(PyTuple_GetItem(a, 3)));
        }
        if (PyErr_Occurred()) fail("step", b, take_python_error());
    }

    void begin_episodes(const grove_environment_batch& b, grove_environment_output& out) {
        HoldInterpreterLock lock;
        Ref texts(call("begin", b));
        for (uint32_t i = 0; i < b.count; ++i) {
            Py_ssize_t size = 0;
            const char* text = PyUnicode_AsUTF8AndSize(PyList_GetItem(texts.get(), i), &size);
            if (text && size > 0) out.observations[i]->append(out.observations[i], text, size_t(size));
        }
        if (PyErr_Occurred()) fail("begin_episodes", b, take_python_error());
    }

    void score_episodes(const grove_environment_batch& b, float* rewards) {
        HoldInterpreterLock lock;
        Ref scores(call("score", b));
        for (uint32_t i = 0; i < b.count; ++i) rewards[i] = float(PyFloat_AsDouble(PyList_GetItem(scores.get(), i)));
        if (PyErr_Occurred()) fail("score_episodes", b, take_python_error());
    }

private:
    // how errors name it: its class, its classes, or its tools
    static std::string display_name(const grove::sdk::Config& config) {
        std::string name = config.get_string("class", config.get_string("classes", ""));
        if (!name.empty()) return name;
        std::string tools;
        for (const std::string& tool : config.get_strings("tools", {})) tools += (tools.empty() ? "" : ", ") + tool;
        return "tools [" + tools + "]";
    }
    PyObject* call(const char* method, const grove_environment_batch& b) const {
        Ref rows(episode_rows(b));
        PyObject* result =
            rows ? PyObject_CallMethod(environment_, method, "OLK", rows.get(), (long long)b.step, (unsigned long long)b.seed)
                 : nullptr;
        if (!result) fail(method, b, take_python_error());
        return result;
    }
    [[noreturn]] void fail(const char* call, const grove_environment_batch& b, const std::string& message) const {
        throw Error(GROVE_ERROR_INVALID_ARGUMENT, "environment " + class_ + " (" + module_ + ") failed in " + call + "() on " +
                                                      std::to_string(b.count) + " episodes of step " + std::to_string(b.step) +
                                                      ": " + message);
    }

    std::string module_, class_;
    PyObject* environment_ = nullptr;  // a bridge.Environment
    std::vector<std::string> stop_strings_;
    std::vector<const char*> stop_pointers_;
};

constexpr auto kPythonReward =
    grove::sdk::reward_descriptor<PythonReward>(kRewardName, kVersion, kRewardDescription, 0, kRewardKeys);
constexpr auto kPythonEnvironment = grove::sdk::environment_descriptor<PythonEnvironment>(
    kEnvironmentName, kVersion, kEnvironmentDescription, 0, kEnvironmentKeys);

}  // namespace

GROVE_PLUGIN_LIBRARY(&kPythonReward, &kPythonEnvironment)
