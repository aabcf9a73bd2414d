// A C++ reward (through grove/plugin.hpp) that throws: in score() always, in its constructor when
// asked to. The exceptions must reach the host as messages, never as exceptions.
#include <grove/plugin.hpp>

#include <stdexcept>

namespace {
struct Throwing {
    explicit Throwing(const grove::sdk::Config& config) {
        if (config.get_bool("throw_in_create", false)) throw std::runtime_error("constructor exploded");
    }
    void score(const grove_reward_batch&, grove_reward_output&) { throw std::out_of_range("vector index 7 out of range"); }
};
const grove_config_key kKeys[] = {grove::sdk::key("throw_in_create", GROVE_VALUE_BOOL, "false", "throw in the constructor")};
constexpr auto kThrowing = grove::sdk::reward_descriptor<Throwing>("throwing", "1.0.0", "throws", 0, kKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kThrowing)
