// A rendezvous port for ranks on one machine.
#pragma once

namespace grove {

// A port the kernel just handed out on loopback (torchrun's choice for standalone runs). Throws
// Error(runtime) when none can be had.
int free_loopback_port();

}  // namespace grove
