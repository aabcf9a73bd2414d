// The manifest: TOML parsing, the schema's validation, --set overrides and the rules across keys
// (what `grove check` runs before it loads plugins). The input is the manifest, optionally followed
// by NUL-separated overrides.
#include <cstring>
#include <vector>

#include "fuzz_support.hpp"
#include "grove/manifest.hpp"
#include "grove/run_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> parts(1);
    for (size_t i = 0; i < size; ++i) {
        if (data[i] == 0)
            parts.emplace_back();
        else
            parts.back() += char(data[i]);
    }
    const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
    grove_fuzz::expect_clean_outcome("manifest", [&] {
        grove::Manifest manifest = grove::Manifest::parse(parts[0], grove_fuzz::work_dir() + "/grove.toml", overrides);
        grove::RunConfig::from(manifest);
        manifest.resolved_toml();
        for (const auto& reward : manifest.rewards()) grove::plugin_config_toml(reward);
    });
    return 0;
}
