// Autocast on one device type for a scope's life: by default bfloat16 autocast on (TRL's bf16 = True:
// matrix products run in bf16 while weights, gradients and optimizer state keep their dtype), or any
// given state (off, for code whose weights already have their dtype; a forward's state, for its
// recomputation in a backward pass). No-op without a device. Casts cached inside are cleared when
// the outermost scope ends, so no stale bf16 weight outlives an optimizer step.
#pragma once

#include <ATen/autocast_mode.h>

#include <optional>

namespace grove {

class AutocastScope {
public:
    explicit AutocastScope(std::optional<at::DeviceType> device) : AutocastScope(device, true, at::kBFloat16) {}
    AutocastScope(std::optional<at::DeviceType> device, bool enabled, at::ScalarType dtype) : device_(device) {
        if (!device_) return;
        was_enabled_ = at::autocast::is_autocast_enabled(*device_);
        previous_dtype_ = at::autocast::get_autocast_dtype(*device_);
        at::autocast::set_autocast_enabled(*device_, enabled);
        at::autocast::set_autocast_dtype(*device_, dtype);
        at::autocast::increment_nesting();
    }
    ~AutocastScope() {
        if (!device_) return;
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();  // cached bf16 weight casts
        at::autocast::set_autocast_enabled(*device_, was_enabled_);
        at::autocast::set_autocast_dtype(*device_, previous_dtype_);
    }
    AutocastScope(const AutocastScope&) = delete;
    AutocastScope& operator=(const AutocastScope&) = delete;

private:
    std::optional<at::DeviceType> device_;
    bool was_enabled_ = false;
    at::ScalarType previous_dtype_ = at::kBFloat16;
};

}  // namespace grove
