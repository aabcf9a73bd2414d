// What trains beside an adapter: PEFT's additional trainable modules, set by LoraConfig fields that
// are [adapter] keys of the manifest (not the plugin's config) and saved with the adapter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace grove {

struct BesideAdapter {
    // whole modules, named by an ending of their names (PEFT's modules_to_save)
    std::vector<std::string> modules_to_save;
    // with modules_to_save = ["embed_tokens"] on a model that ties lm_head to it: the tied matrix
    bool ensure_weight_tying = false;
    // single rows of the token embedding (PEFT's trainable_token_indices, its list form): new
    // tokens' embeddings, without training the whole matrix
    std::vector<int64_t> trainable_token_indices;

    bool empty() const { return modules_to_save.empty() && trainable_token_indices.empty(); }
};

}  // namespace grove
