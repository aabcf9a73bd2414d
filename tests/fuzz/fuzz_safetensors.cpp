// The safetensors reader: header validation, then every tensor's bytes touched as the model loader
// would read them.
#include "fuzz_support.hpp"
#include "grove/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = grove_fuzz::write_input("model.safetensors", data, size);
    grove_fuzz::expect_clean_outcome("safetensors", [&] {
        grove::SafetensorsFile file(path);
        volatile uint8_t sink = 0;
        for (const grove::TensorEntry& t : file.tensors()) {
            const uint64_t bytes = uint64_t(t.numel()) * grove::dtype_size(t.dtype);
            if (bytes) sink = sink ^ t.data[0] ^ t.data[bytes - 1];
        }
    });
    return 0;
}
