// The processes of one training run, on torch.distributed's c10d: a TCPStore rendezvous (the
// MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE that torchrun sets) and a Gloo or NCCL process group.
// Every rank runs the same loop; they meet only in these collectives, so each call must be made by
// every rank in the same order. Gloo stages tensors through host memory; NCCL keeps them on the GPU
// and needs one GPU per process (docs/training.md#several-processes).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "grove/run_config.hpp"

namespace grove {

enum class CollectiveBackend { gloo, nccl };
const char* backend_name(CollectiveBackend backend);
// Whether this build has torch's NCCL process group (a CUDA wheel and the CUDA toolkit at build time).
bool nccl_available();

// Where one rank trains and how the ranks talk, from [model] device and [train] ddp_backend:
// `cuda` (or `auto` on a GPU machine) gives local rank r GPU r when every local rank has its own,
// else the ranks share the GPUs round-robin; `auto` picks NCCL only when each rank has a GPU to
// itself (NCCL refuses two ranks on one device) and Gloo otherwise. Throws Error(manifest) naming
// the key and the fix when `nccl` cannot work.
struct RankPlacement {
    std::string device;  // "cpu", "cuda:N", or the manifest's own value
    CollectiveBackend backend = CollectiveBackend::gloo;
};
RankPlacement place_rank(const std::string& manifest_path, const std::string& device, DdpBackend requested, int local_rank,
                         int local_world_size, int cuda_devices, bool nccl_built);
// The same on this machine: its GPUs counted, this build's NCCL.
RankPlacement place_rank(const std::string& manifest_path, const std::string& device, DdpBackend requested, int local_rank,
                         int local_world_size);

struct ProcessGroupConfig {
    int rank = 0, world_size = 1;
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    int timeout_seconds = 600;  // a rank that never arrives fails the collective after this long
    CollectiveBackend backend = CollectiveBackend::gloo;
    std::string device = "cpu";  // NCCL: this rank's GPU ("cuda:N"), where collectives run
};

class ProcessGroup {
public:
    explicit ProcessGroup(const ProcessGroupConfig& config);
    ~ProcessGroup();
    ProcessGroup(const ProcessGroup&) = delete;
    ProcessGroup& operator=(const ProcessGroup&) = delete;

    int rank() const { return config_.rank; }
    int world_size() const { return config_.world_size; }
    CollectiveBackend backend() const { return config_.backend; }

    // In place: every tensor becomes the element-wise sum (or max) over ranks. Tensors are packed into
    // one buffer per dtype, so a call is one collective whatever their number.
    void all_reduce_sum(std::vector<at::Tensor>& tensors);
    void all_reduce_max(std::vector<at::Tensor>& tensors);
    // Every rank's `local` ([n, ...], the same shape on every rank) stacked in rank order: [ranks*n, ...].
    at::Tensor all_gather_rows(const at::Tensor& local);
    // In place: rank `root`'s values everywhere.
    void broadcast(std::vector<at::Tensor>& tensors, int root = 0);
    // In place: tensors[i] from rank owners[i] (ZeRO stage 1: each tensor from the rank that updated it).
    void broadcast_from_owners(const std::vector<at::Tensor>& tensors, const std::vector<int>& owners);
    void barrier();

    // Convenience for scalars: the sum / max over ranks.
    double sum(double value);
    double max(double value);

private:
    struct Impl;
    void all_reduce(std::vector<at::Tensor>& tensors, bool max);
    ProcessGroupConfig config_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace grove
