// What the python plugins are, said once: their names and configuration keys, shared by the plugin
// library Grove lists (python_plugin.cpp, no Python) and the library that embeds Python
// (python_embed.cpp).
#pragma once

#include <grove/plugin.hpp>

namespace grove::python {

constexpr const char* kVersion = "1.0.0";

constexpr const char* kRewardName = "python";
constexpr const char* kRewardDescription = "a reward function written in Python, called as TRL calls it";
constexpr grove_config_key kRewardKeys[] = {
    grove::sdk::required_key("module", GROVE_VALUE_STRING,
                             "a .py file (relative to the manifest) or an importable module, e.g. \"trl.rewards\""),
    grove::sdk::required_key("function", GROVE_VALUE_STRING,
                             "the reward function in the module (TRL's signature), or a factory with factory_args"),
    grove::sdk::key("kwargs", GROVE_VALUE_TABLE, "{}", "keyword arguments added to every call"),
    grove::sdk::key("factory_args", GROVE_VALUE_TABLE, "-",
                    "call `function` once with these arguments and score with the function it returns "
                    "(e.g. get_soft_overlong_punishment)"),
};

constexpr const char* kEnvironmentName = "python_environment";
constexpr const char* kEnvironmentDescription =
    "an environment written in Python: TRL's environment_factory classes and tools, or Grove's contract";
constexpr grove_config_key kEnvironmentKeys[] = {
    grove::sdk::required_key("module", GROVE_VALUE_STRING, "a .py file (relative to the manifest) or an importable module"),
    grove::sdk::key("class", GROVE_VALUE_STRING, "-",
                    "TRL's environment_factory (a class with reset() and tool methods), or a class with step() "
                    "(Grove's environment contract); this or `classes`"),
    grove::sdk::key("classes", GROVE_VALUE_TABLE, "-",
                    "several TRL environment_factory classes by name, { NAME = \"Class\", ... }, each row choosing one "
                    "by its \"environment\" column (TRL's environment_factory={name: factory}); this or `class`"),
    grove::sdk::key("tools", GROVE_VALUE_STRING_ARRAY, "[]",
                    "functions of the module every episode may call as tools (TRL's tools=[...]), listed before a "
                    "class's methods; alone, an environment of tools without state or reward"),
    grove::sdk::key("kwargs", GROVE_VALUE_TABLE, "{}", "keyword arguments of the class (or factory) call"),
};

}  // namespace grove::python
