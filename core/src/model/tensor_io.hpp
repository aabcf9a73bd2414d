// Bridges between safetensors entries and at::Tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include "grove/safetensors.hpp"

namespace grove {

// A CPU tensor holding a copy of the entry's bytes, in the file's dtype.
at::Tensor tensor_from_entry(const TensorEntry& entry, const std::string& file);
at::ScalarType scalar_type_of(DType dtype);
DType dtype_of(at::ScalarType type);  // throws for types safetensors cannot hold

// Saves named tensors with write_safetensors (atomic), moving one at a time to the CPU.
void save_tensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata = {});

}  // namespace grove
