// Adapter "full": full fine-tuning. It attaches to no layer and adds nothing; its flag
// GROVE_PLUGIN_TRAINS_BASE_WEIGHTS tells the core to train the base model's own weights.
#include <grove/plugin.hpp>

namespace {
struct Full {
    explicit Full(const grove::sdk::Config&) {}
    void* attach(const grove_linear_info&, const grove::sdk::Ops&) { return nullptr; }
    grove_tensor forward(void*, const grove::sdk::Ops&, const grove_tensor*, uint32_t, grove_tensor) {
        throw grove::sdk::Error(GROVE_ERROR_UNSUPPORTED, "the full adapter attaches to no layer");
    }
    grove_tensor merged_delta(void*, const grove::sdk::Ops&, const grove_tensor*, uint32_t) {
        throw grove::sdk::Error(GROVE_ERROR_UNSUPPORTED, "the full adapter attaches to no layer");
    }
    void detach(void*) {}
    std::string saved_config_json() const { return ""; }
};
constexpr auto kFull = grove::sdk::adapter_descriptor<Full>(
    "full", "1.0.0", "full fine-tuning: every base weight trains, nothing is added",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC | GROVE_PLUGIN_TRAINS_BASE_WEIGHTS, grove::sdk::kNoKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kFull)
