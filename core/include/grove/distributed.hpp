// The processes of one training run, on torch.distributed's c10d: a TCPStore rendezvous (the
// MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE that torchrun sets) and a Gloo or NCCL process group.
// Every rank runs the same loop; they meet only in these collectives, so each call must be made by
// every rank in the same order. Gloo stages tensors through host memory; NCCL keeps them on the GPU
// and needs one GPU per process (docs/training.md#several-processes).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grove/run_config.hpp"

namespace grove {

enum class CollectiveBackend { gloo, nccl };
const char* backend_name(CollectiveBackend backend);
// Whether this build has torch's NCCL process group (a CUDA wheel and the CUDA toolkit at build time).
bool nccl_available();

// Where one rank trains and how the ranks talk, from [model] device and [train] ddp_backend:
// `cuda` (or `auto` on a GPU machine) gives local rank r the GPU r modulo the GPUs it sees. NCCL
// (asked for, or `auto` on CUDA in a build with NCCL) is tentative until the ranks have compared
// their GPUs at the rendezvous, since only they know whether two share one (a launcher may show
// each rank a GPU of its own). Throws Error(manifest) naming the key and the fix where `nccl`
// cannot work at all: the model on the CPU, or a build without NCCL.
struct RankPlacement {
    std::string device;  // "cpu", "cuda:N", or the manifest's own value
    CollectiveBackend backend = CollectiveBackend::gloo;
    std::string nccl_required_by;  // non-empty (the manifest's key) when NCCL was asked for by name
};
RankPlacement place_rank(const std::string& manifest_path, const std::string& device, DdpBackend requested, int local_rank,
                         int cuda_devices, bool nccl_built);
// The same on this machine: the GPUs this process sees, this build's NCCL.
RankPlacement place_rank(const std::string& manifest_path, const std::string& device, DdpBackend requested, int local_rank);

// Two ranks whose GPU identities (host and PCI address, one per rank) are equal, the lowest pair;
// {-1, -1} when every rank has a GPU of its own.
std::pair<int, int> first_shared_gpu(const std::vector<std::string>& identities);

struct ProcessGroupConfig {
    int rank = 0, world_size = 1;
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    // A rank that never arrives fails the rendezvous or a Gloo collective after this long (the
    // manifest's train.ddp_timeout; transformers' default); under NCCL, torch's watchdog aborts the
    // process (SIGABRT) instead.
    int timeout_seconds = 1800;
    CollectiveBackend backend = CollectiveBackend::gloo;
    std::string device = "cpu";  // this rank's device; a GPU ("cuda:N") becomes the process's current one
    // NCCL only: when two ranks turn out to share a GPU, empty falls back to Gloo, else the error
    // names this setting
    std::string nccl_required_by;
    // All-reduces and broadcasts pack tensors of one dtype into flat buckets of at most this many
    // bytes (DDP's default size): few calls, and one bucket's copy in memory at a time, not one of
    // every tensor. A tensor larger than a bucket goes alone.
    size_t bucket_bytes = size_t(25) << 20;
};

class ProcessGroup {
public:
    explicit ProcessGroup(const ProcessGroupConfig& config);
    ~ProcessGroup();
    ProcessGroup(const ProcessGroup&) = delete;
    ProcessGroup& operator=(const ProcessGroup&) = delete;

    int rank() const { return config_.rank; }
    int world_size() const { return config_.world_size; }
    CollectiveBackend backend() const { return config_.backend; }  // after the GPUs were compared

    // In place: every tensor becomes the element-wise sum (or max) over ranks (in buckets, above).
    void all_reduce_sum(std::vector<at::Tensor>& tensors);
    void all_reduce_max(std::vector<at::Tensor>& tensors);
    // Every rank's `local` ([n, ...], the same shape on every rank) stacked in rank order: [ranks*n, ...].
    at::Tensor all_gather_rows(const at::Tensor& local);
    // In place: rank `root`'s values everywhere (in buckets).
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
    // Runs `collective` on each bucket of `tensors` (a flat copy on the backend's device), then copies
    // the bucket's result back into its tensors.
    void bucketed(const std::vector<at::Tensor>& tensors, const std::function<void(std::vector<at::Tensor>&)>& collective);
    ProcessGroupConfig config_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace grove
