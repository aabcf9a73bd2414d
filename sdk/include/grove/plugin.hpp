// grove/plugin.hpp — an optional, header-only C++17 layer over <grove/grove_plugin.h>.
//
// It turns a plain C++ class into a plugin and guarantees that no exception ever crosses the C ABI:
// every entry point is wrapped, a grove::sdk::Error becomes its status (and names its config key),
// any other exception becomes GROVE_ERROR_INTERNAL with what() as the message.
//
//   struct MyReward {
//       explicit MyReward(const grove::sdk::Config& config) : bonus_(config.get_float("bonus", 1.0)) {}
//       void score(const grove_reward_batch& batch, grove_reward_output& out) {
//           for (uint32_t i = 0; i < batch.count; ++i) out.scores[i] = bonus_;
//       }
//       double bonus_;
//   };
//   static const grove_config_key kKeys[] = {grove::sdk::key("bonus", GROVE_VALUE_FLOAT, "1.0", "score")};
//   static const auto kMyReward = grove::sdk::reward_descriptor<MyReward>(
//       "my_reward", "1.0.0", "gives every completion `bonus`", GROVE_PLUGIN_DETERMINISTIC, kKeys);
//   GROVE_PLUGIN_LIBRARY(&kMyReward)
//
// Reductions implement `void weights(const grove_reduction_context&, float* weight)`; adapters
// implement attach/forward/merged_delta (see AdapterPlugin below); environments implement
// `const char* const* stop_strings() const` and `void step(const grove_environment_batch&,
// grove_environment_output&)`, and optionally score_episodes, begin_episodes, `std::string
// tools_json() const` and `EpisodeReward episode_reward() const` (see EnvironmentPlugin).
#ifndef GROVE_PLUGIN_HPP
#define GROVE_PLUGIN_HPP

#include <grove/grove_plugin.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace grove::sdk {

// Throw this from plugin code to fail with a specific status and, optionally, a config key.
class Error : public std::runtime_error {
public:
    Error(grove_status status, std::string message, std::string key = {})
            : std::runtime_error(std::move(message)), status_(status), key_(std::move(key)) {}
    grove_status status() const noexcept { return status_; }
    const std::string& key() const noexcept { return key_; }

private:
    grove_status status_;
    std::string key_;
};

inline Error config_error(std::string key, std::string message) {
    return Error(GROVE_ERROR_CONFIG, std::move(message), std::move(key));
}

// Runs fn; converts any exception into a status + message on the sink. Never throws.
template <class Fn>
grove_status guard(grove_error_sink* err, Fn&& fn) noexcept {
    try {
        fn();
        return GROVE_OK;
    } catch (const Error& e) {
        return grove_fail(err, e.status(), e.key().empty() ? nullptr : e.key().c_str(), e.what());
    } catch (const std::bad_alloc&) {
        return grove_fail(err, GROVE_ERROR_OUT_OF_MEMORY, nullptr, "out of memory");
    } catch (const std::exception& e) {
        std::string message = std::string("unexpected C++ exception: ") + e.what();
        return grove_fail(err, GROVE_ERROR_INTERNAL, nullptr, message.c_str());
    } catch (...) {
        return grove_fail(err, GROVE_ERROR_INTERNAL, nullptr, "unknown C++ exception");
    }
}

// Read-only view of an instance's configuration with typed getters and defaults.
class Config {
public:
    explicit Config(const grove_config* config) : config_(config) {}
    bool has(const char* key) const { return grove_config_find(config_, key) != nullptr; }
    double get_float(const char* key, double fallback) const { return grove_config_float(config_, key, fallback); }
    int64_t get_int(const char* key, int64_t fallback) const { return grove_config_int(config_, key, fallback); }
    bool get_bool(const char* key, bool fallback) const { return grove_config_bool(config_, key, fallback) != 0; }
    std::string get_string(const char* key, std::string fallback) const {
        const grove_config_value* v = grove_config_find(config_, key);
        return v ? std::string(v->string_value) : fallback;
    }
    std::vector<std::string> get_strings(const char* key, std::vector<std::string> fallback) const {
        const grove_config_value* v = grove_config_find(config_, key);
        if (!v) return fallback;
        return std::vector<std::string>(v->string_array, v->string_array + v->array_length);
    }
    std::vector<int64_t> get_ints(const char* key, std::vector<int64_t> fallback) const {
        const grove_config_value* v = grove_config_find(config_, key);
        if (!v) return fallback;
        return std::vector<int64_t>(v->int_array, v->int_array + v->array_length);
    }
    const char* raw_toml() const { return config_ && config_->raw_toml ? config_->raw_toml : ""; }
    // The folder relative paths are relative to: the manifest's (ABI 1.7), else the current one.
    std::string base_dir() const {
        return config_ && GROVE_HAS_FIELD(config_, grove_config, base_dir) && config_->base_dir ? config_->base_dir : ".";
    }

private:
    const grove_config* config_;
};

constexpr grove_config_key key(const char* name, grove_value_type type, const char* default_text, const char* help) {
    return grove_config_key{sizeof(grove_config_key), name, static_cast<uint32_t>(type), 0, default_text, help};
}
constexpr grove_config_key required_key(const char* name, grove_value_type type, const char* help) {
    return grove_config_key{sizeof(grove_config_key), name, static_cast<uint32_t>(type), 1, nullptr, help};
}

inline std::string_view view(const grove_text& text) { return std::string_view(text.data, text.size); }

// ---- lifecycle shared by all kinds -----------------------------------------------------------
template <class T>
struct Lifecycle {
    static grove_status create(const grove_config* config, void** instance, grove_error_sink* err) noexcept {
        return guard(err, [&] { *instance = new T(Config(config)); });
    }
    static void destroy(void* instance) noexcept { delete static_cast<T*>(instance); }
};

// ---- rewards ---------------------------------------------------------------------------------
template <class T>
struct RewardPlugin : Lifecycle<T> {
    static grove_status score(void* instance, const grove_reward_batch* batch, grove_reward_output* out,
                              grove_error_sink* err) noexcept {
        return guard(err, [&] { static_cast<T*>(instance)->score(*batch, *out); });
    }
    static constexpr grove_reward_api api{sizeof(grove_reward_api), &score};
};

// ---- reductions ------------------------------------------------------------------------------
template <class T>
struct ReductionPlugin : Lifecycle<T> {
    static grove_status weights(void* instance, const grove_reduction_context* ctx, float* weight,
                                grove_error_sink* err) noexcept {
        return guard(err, [&] { static_cast<T*>(instance)->weights(*ctx, weight); });
    }
    static constexpr grove_reduction_api api{sizeof(grove_reduction_api), &weights};
};

// ---- adapters --------------------------------------------------------------------------------
// A thin wrapper over the host op table that throws grove::sdk::Error when an op fails.
class Ops {
public:
    Ops(const grove_tensor_ops* ops, grove_op_context* ctx) : ops_(ops), ctx_(ctx) {}
    grove_tensor parameter(const char* name, std::vector<int64_t> shape, grove_init init, double arg = 0.0) const {
        grove_tensor out = nullptr;
        ErrorCapture capture;
        if (ops_->parameter(ctx_, name, static_cast<uint32_t>(shape.size()), shape.data(), init, arg, &out, &capture.sink) !=
            GROVE_OK)
            throw Error(GROVE_ERROR_INVALID_ARGUMENT, capture.message);
        return out;
    }
    grove_tensor linear(grove_tensor x, grove_tensor w) const { return check(ops_->linear(ctx_, x, w)); }
    grove_tensor matmul(grove_tensor a, grove_tensor b) const { return check(ops_->matmul(ctx_, a, b)); }
    grove_tensor add(grove_tensor a, grove_tensor b) const { return check(ops_->add(ctx_, a, b)); }
    grove_tensor mul(grove_tensor a, grove_tensor b) const { return check(ops_->mul(ctx_, a, b)); }
    grove_tensor scale(grove_tensor a, double f) const { return check(ops_->scale(ctx_, a, f)); }
    grove_tensor dropout(grove_tensor a, double p) const { return check(ops_->dropout(ctx_, a, p)); }
    // ABI 1.13, for adapters that rescale the layer; an older host has none of them
    bool rescaling_available() const { return GROVE_HAS_FIELD(ops_, grove_tensor_ops, reshape); }
    grove_tensor base_weight() const { return check(need_rescaling()->base_weight(ctx_)); }
    grove_tensor base_output(grove_tensor x) const { return check(need_rescaling()->base_output(ctx_, x)); }
    grove_tensor parameter_from(const char* name, grove_tensor initial) const {
        grove_tensor out = nullptr;
        ErrorCapture capture;
        if (need_rescaling()->parameter_from(ctx_, name, initial, &out, &capture.sink) != GROVE_OK)
            throw Error(GROVE_ERROR_INVALID_ARGUMENT, capture.message);
        return out;
    }
    grove_tensor detach(grove_tensor a) const { return check(need_rescaling()->detach(ctx_, a)); }
    grove_tensor div(grove_tensor a, grove_tensor b) const { return check(need_rescaling()->div(ctx_, a, b)); }
    grove_tensor row_norm(grove_tensor a) const { return check(need_rescaling()->row_norm(ctx_, a)); }
    grove_tensor reshape(grove_tensor a, std::vector<int64_t> shape) const {
        return check(need_rescaling()->reshape(ctx_, a, static_cast<uint32_t>(shape.size()), shape.data()));
    }

private:
    const grove_tensor_ops* need_rescaling() const {
        if (!rescaling_available())
            throw Error(GROVE_ERROR_UNSUPPORTED,
                        "this Grove's tensor-op table predates ABI 1.13 (base_weight, row_norm, ...): "
                        "run the plugin with a Grove built against SDK 1.13 or newer");
        return ops_;
    }
    struct ErrorCapture {
        grove_error_sink sink{sizeof(grove_error_sink), this, &ErrorCapture::report};
        std::string message;
        static void report(grove_error_sink* s, const char*, const char* m) {
            static_cast<ErrorCapture*>(s->host_data)->message = m ? m : "";
        }
    };
    // the host has recorded why an op failed; a distinct status lets it report that first failure
    static grove_tensor check(grove_tensor t) {
        if (!t) throw Error(GROVE_ERROR_INVALID_ARGUMENT, "a host tensor op failed");
        return t;
    }
    const grove_tensor_ops* ops_;
    grove_op_context* ctx_;
};

// T implements:
//   void* attach(const grove_linear_info&, const Ops&)      -> non-null layer state to attach
//   grove_tensor forward(void* state, const Ops&, const grove_tensor* params, uint32_t n, grove_tensor x)
//   grove_tensor merged_delta(void* state, const Ops&, const grove_tensor* params, uint32_t n)
//   void detach(void* state)
//   std::string saved_config_json() const
template <class T>
struct AdapterPlugin : Lifecycle<T> {
    static grove_status attach(void* instance, const grove_linear_info* layer, const grove_tensor_ops* ops,
                               grove_op_context* ctx, void** state, grove_error_sink* err) noexcept {
        return guard(err, [&] { *state = static_cast<T*>(instance)->attach(*layer, Ops(ops, ctx)); });
    }
    static grove_status forward(void* instance, void* state, const grove_tensor_ops* ops, grove_op_context* ctx,
                                const grove_tensor* params, uint32_t n, grove_tensor x, grove_tensor* delta,
                                grove_error_sink* err) noexcept {
        return guard(err, [&] { *delta = static_cast<T*>(instance)->forward(state, Ops(ops, ctx), params, n, x); });
    }
    static grove_status merged_delta(void* instance, void* state, const grove_tensor_ops* ops, grove_op_context* ctx,
                                     const grove_tensor* params, uint32_t n, grove_tensor* out,
                                     grove_error_sink* err) noexcept {
        return guard(err, [&] { *out = static_cast<T*>(instance)->merged_delta(state, Ops(ops, ctx), params, n); });
    }
    static void detach(void* instance, void* state) noexcept {
        try {
            static_cast<T*>(instance)->detach(state);
        } catch (...) {
        }
    }
    static grove_status saved_config_json(void* instance, grove_text_sink* out, grove_error_sink* err) noexcept {
        return guard(err, [&] {
            std::string json = static_cast<T*>(instance)->saved_config_json();
            out->append(out, json.data(), json.size());
        });
    }
    static constexpr grove_adapter_api api{sizeof(grove_adapter_api), &attach, &forward, &merged_delta, &detach,
                                           &saved_config_json};
};

// ---- environments (ABI 1.2; score_episodes 1.3) --------------------------------------------------------------
//   const char* const* stop_strings() const   (a NULL-terminated array valid until the instance goes)
//   void step(const grove_environment_batch&, grove_environment_output&)
//   void score_episodes(const grove_environment_batch&, float* rewards)   (optional, ABI 1.3)
//   EpisodeReward episode_reward() const   (optional, ABI 1.9: how that judgement counts as a reward)
// observe(out, i, text) appends episode i's observation.
inline void observe(const grove_environment_output& out, uint32_t episode, std::string_view text) {
    grove_text_sink* sink = out.observations[episode];
    sink->append(sink, text.data(), text.size());
}

// The usual tool protocol, for step(): in each waiting episode's turn, the LAST call between `open`
// and `close` (the close tag is a stop string, so it ends the turn). A turn without a call ends the
// episode (the model has answered); a call never closed ends it as a failed call; otherwise
// answer(body, bool& failed) returns the observation, and `failed` counts it as a failed call.
template <class Answer>
void answer_tool_calls(const grove_environment_batch& batch, grove_environment_output& out, std::string_view open,
                       std::string_view close, Answer&& answer) {
    for (uint32_t i = 0; i < batch.count; ++i) {
        const std::string_view turn = view(batch.turn_texts[i]);
        const size_t at = turn.rfind(open);
        if (at == std::string_view::npos) {
            out.done[i] = 1;
            continue;
        }
        out.tool_calls[i] = 1;
        const size_t start = at + open.size(), end = turn.find(close, start);
        if (end == std::string_view::npos) {
            out.tool_failures[i] = 1;
            out.done[i] = 1;
            continue;
        }
        bool failed = false;
        observe(out, i, answer(turn.substr(start, end - start), failed));
        out.tool_failures[i] = failed ? 1 : 0;
    }
}

// What episode_reward() gives: GROVE_EPISODES_* and the reward column's default name (empty: none).
struct EpisodeReward {
    uint32_t judgement = GROVE_EPISODES_JUDGED_ON_REQUEST;
    std::string name;
};

namespace detail {
template <class T, class = void>
struct has_episode_reward : std::false_type {};
template <class T>
struct has_episode_reward<T, std::void_t<decltype(EpisodeReward(std::declval<const T&>().episode_reward()))>> : std::true_type {
};
template <class T, class = void>
struct begins_episodes : std::false_type {};
template <class T>
struct begins_episodes<T, std::void_t<decltype(std::declval<T&>().begin_episodes(std::declval<const grove_environment_batch&>(),
                                                                                 std::declval<grove_environment_output&>()))>>
        : std::true_type {};
template <class T, class = void>
struct has_tools_json : std::false_type {};
template <class T>
struct has_tools_json<T, std::void_t<decltype(std::string(std::declval<const T&>().tools_json()))>> : std::true_type {};
template <class T, class = void>
struct scores_episodes : std::false_type {};
template <class T>
struct scores_episodes<T, std::void_t<decltype(std::declval<T&>().score_episodes(std::declval<const grove_environment_batch&>(),
                                                                                 std::declval<float*>()))>> : std::true_type {};
}  // namespace detail

template <class T>
struct EnvironmentPlugin : Lifecycle<T> {
    static grove_status stop_strings(void* instance, const char* const** strings, grove_error_sink* err) noexcept {
        return guard(err, [&] { *strings = static_cast<T*>(instance)->stop_strings(); });
    }
    static grove_status step(void* instance, const grove_environment_batch* batch, grove_environment_output* out,
                             grove_error_sink* err) noexcept {
        return guard(err, [&] { static_cast<T*>(instance)->step(*batch, *out); });
    }
    static grove_status score_episodes(void* instance, const grove_environment_batch* episodes, float* rewards,
                                       grove_error_sink* err) noexcept {
        return guard(err, [&] {
            if constexpr (detail::scores_episodes<T>::value) static_cast<T*>(instance)->score_episodes(*episodes, rewards);
        });
    }
    static grove_status begin_episodes(void* instance, const grove_environment_batch* episodes, grove_environment_output* out,
                                       grove_error_sink* err) noexcept {
        return guard(err, [&] {
            if constexpr (detail::begins_episodes<T>::value) static_cast<T*>(instance)->begin_episodes(*episodes, *out);
        });
    }
    static grove_status tools_json(void* instance, grove_text_sink* out, grove_error_sink* err) noexcept {
        return guard(err, [&] {
            if constexpr (detail::has_tools_json<T>::value) {
                const std::string json = static_cast<const T*>(instance)->tools_json();
                out->append(out, json.data(), json.size());
            }
        });
    }
    static grove_status episode_reward(void* instance, uint32_t* judgement, grove_text_sink* name,
                                       grove_error_sink* err) noexcept {
        return guard(err, [&] {
            if constexpr (detail::has_episode_reward<T>::value) {
                const EpisodeReward reward = static_cast<const T*>(instance)->episode_reward();
                *judgement = reward.judgement;
                name->append(name, reward.name.data(), reward.name.size());
            }
        });
    }
    static constexpr grove_environment_api api{sizeof(grove_environment_api),
                                               &stop_strings,
                                               &step,
                                               detail::scores_episodes<T>::value ? &score_episodes : nullptr,
                                               detail::begins_episodes<T>::value ? &begin_episodes : nullptr,
                                               detail::has_tools_json<T>::value ? &tools_json : nullptr,
                                               detail::has_episode_reward<T>::value ? &episode_reward : nullptr};
};

// ---- descriptors -----------------------------------------------------------------------------
namespace detail {
template <class Plugin, std::size_t NK, std::size_t NM>
constexpr grove_plugin_descriptor make(grove_plugin_kind kind, const char* name, const char* version, const char* description,
                                       uint64_t flags, const grove_config_key (&keys)[NK], const char* const (&metrics)[NM]) {
    grove_plugin_descriptor d{};
    d.struct_size = sizeof(grove_plugin_descriptor);
    d.kind = static_cast<uint32_t>(kind);
    d.name = name;
    d.version = version;
    d.description = description;
    d.flags = flags;
    d.config_keys = keys;
    // kNoKeys is a single entry with an empty name: it means "no keys"
    d.config_key_count = (NK == 1 && keys[0].name[0] == '\0') ? 0u : static_cast<uint32_t>(NK);
    d.metric_names = NM > 0 && metrics[0] ? metrics : nullptr;
    d.metric_count = NM > 0 && metrics[0] ? static_cast<uint32_t>(NM) : 0;
    d.create = &Plugin::create;
    d.destroy = &Plugin::destroy;
    return d;
}
inline constexpr const char* const kNoMetrics[1] = {nullptr};
}  // namespace detail

template <class T, std::size_t NK, std::size_t NM = 1>
constexpr grove_plugin_descriptor reward_descriptor(const char* name, const char* version, const char* description,
                                                    uint64_t flags, const grove_config_key (&keys)[NK],
                                                    const char* const (&metrics)[NM] = detail::kNoMetrics) {
    auto d = detail::make<RewardPlugin<T>>(GROVE_PLUGIN_KIND_REWARD, name, version, description, flags, keys, metrics);
    d.reward = &RewardPlugin<T>::api;
    return d;
}
template <class T, std::size_t NK>
constexpr grove_plugin_descriptor reduction_descriptor(const char* name, const char* version, const char* description,
                                                       uint64_t flags, const grove_config_key (&keys)[NK]) {
    auto d = detail::make<ReductionPlugin<T>>(GROVE_PLUGIN_KIND_REDUCTION, name, version, description, flags, keys,
                                              detail::kNoMetrics);
    d.reduction = &ReductionPlugin<T>::api;
    return d;
}
template <class T, std::size_t NK>
constexpr grove_plugin_descriptor adapter_descriptor(const char* name, const char* version, const char* description,
                                                     uint64_t flags, const grove_config_key (&keys)[NK]) {
    auto d =
        detail::make<AdapterPlugin<T>>(GROVE_PLUGIN_KIND_ADAPTER, name, version, description, flags, keys, detail::kNoMetrics);
    d.adapter = &AdapterPlugin<T>::api;
    return d;
}

template <class T, std::size_t NK>
constexpr grove_plugin_descriptor environment_descriptor(const char* name, const char* version, const char* description,
                                                         uint64_t flags, const grove_config_key (&keys)[NK]) {
    auto d = detail::make<EnvironmentPlugin<T>>(GROVE_PLUGIN_KIND_ENVIRONMENT, name, version, description, flags, keys,
                                                detail::kNoMetrics);
    d.environment = &EnvironmentPlugin<T>::api;
    return d;
}

// A plugin with no configuration keys passes this.
inline constexpr grove_config_key kNoKeys[1] = {{sizeof(grove_config_key), "", 0, 0, nullptr, nullptr}};

}  // namespace grove::sdk

// Defines the library's entry point over the given descriptors (pointers to static descriptors).
#define GROVE_PLUGIN_LIBRARY(...)                                                                               \
    extern "C" GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api*) {                \
        static const grove_plugin_descriptor* const grove_all_[] = {__VA_ARGS__};                               \
        static const grove_plugin_list grove_list_{sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, \
                                                   sizeof(grove_all_) / sizeof(grove_all_[0]), grove_all_};     \
        return &grove_list_;                                                                                    \
    }

#endif  // GROVE_PLUGIN_HPP
