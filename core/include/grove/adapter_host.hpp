// Runs an adapter plugin (LoRA, full, or a user's own) on linear layers. The plugin sees only the
// C tensor-op table (grove_tensor_ops); this host executes each op in libtorch so autograd records
// it, and owns the parameters the plugin declares.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "grove/beside_adapter.hpp"
#include "grove/plugin_host.hpp"

namespace grove {

struct LinearLayer {
    std::string name;  // "model.layers.0.self_attn.q_proj"
    uint32_t layer_index = UINT32_MAX;
    at::Tensor weight;  // [out, in]
    std::optional<at::Tensor> bias;
};

class AdaptedLinear;

class AdapterHost {
public:
    // `adapter` must be an adapter-kind instance and outlive this host and every layer it attaches.
    explicit AdapterHost(const PluginInstance& adapter);
    bool trains_base_weights() const;

    // nullptr when the adapter leaves this layer alone. Parameters are created on the weight's
    // device and dtype; random initialisation uses torch's default generator (seed it first).
    std::unique_ptr<AdaptedLinear> attach(const LinearLayer& layer);

    // The adapter's saved configuration (PEFT adapter_config.json), or "" if it saves none.
    std::string saved_config_json() const;

    void set_training(bool training) { training_ = training; }
    bool training() const { return training_; }

private:
    friend class AdaptedLinear;
    const PluginInstance& adapter_;
    bool training_ = true;
};

class AdaptedLinear {
public:
    ~AdaptedLinear();
    // y = x W^T + b + adapter delta(x)
    at::Tensor forward(const at::Tensor& x) const;
    // only the adapter's delta(x); `base_output` is the layer's x W^T + b when the caller has it
    // (an adapter that rescales the layer reuses it), or undefined
    at::Tensor delta(const at::Tensor& x, const at::Tensor& base_output = {}) const;
    // the [out, in] weight delta that merging adds to W
    at::Tensor merged_delta() const;
    bool can_merge() const;  // the plugin implements merged_delta
    // The adapter's parameters with their saved (PEFT) names:
    // "base_model.model.<layer name>.<parameter name>"
    const std::deque<std::pair<std::string, at::Tensor>>& parameters() const { return parameters_; }

private:
    friend class AdapterHost;
    AdaptedLinear(const AdapterHost& host, LinearLayer layer) : host_(host), layer_(std::move(layer)) {}
    const AdapterHost& host_;
    LinearLayer layer_;
    void* state_ = nullptr;
    // a deque: handles given to the plugin point into it and must not move
    std::deque<std::pair<std::string, at::Tensor>> parameters_;
};

class Model;
// Model::train_beside_adapter(beside) with the adapter attached; its refusals are manifest errors
// naming `adapter_use`'s origin ([adapter] in the manifest).
void train_beside_adapter(Model& model, const BesideAdapter& beside, const PluginUse& adapter_use);
// The model's trainable tensors with the adapter attached (or its base weights, for full training);
// an adapter that left none (target_modules matching no layer) is a plugin error naming
// `adapter_use`'s origin and the model's layer names.
std::vector<std::pair<std::string, at::Tensor>> trainable_parameters_or_refuse(Model& model, const PluginUse& adapter_use,
                                                                               const std::string& adapter_name);

}  // namespace grove
