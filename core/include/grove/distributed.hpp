// The processes of one training run, on torch.distributed's c10d: a TCPStore rendezvous (the
// MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE that torchrun sets) and a Gloo process group. Every
// rank runs the same loop; they meet only in these collectives, so each call must be made by every
// rank in the same order. Tensors on a GPU are staged through host memory (Gloo); NCCL is the
// planned GPU transport.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace grove {

struct ProcessGroupConfig {
    int rank = 0, world_size = 1;
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    int timeout_seconds = 600;  // a rank that never arrives fails the collective after this long
};

class ProcessGroup {
public:
    explicit ProcessGroup(const ProcessGroupConfig& config);
    ~ProcessGroup();
    ProcessGroup(const ProcessGroup&) = delete;
    ProcessGroup& operator=(const ProcessGroup&) = delete;

    int rank() const { return config_.rank; }
    int world_size() const { return config_.world_size; }

    // In place: every tensor becomes the element-wise sum (or max) over ranks. Tensors are packed into
    // one buffer per dtype, so a call is one collective whatever their number.
    void all_reduce_sum(std::vector<at::Tensor>& tensors);
    void all_reduce_max(std::vector<at::Tensor>& tensors);
    // Every rank's `local` ([n, ...], the same shape on every rank) stacked in rank order: [ranks*n, ...].
    at::Tensor all_gather_rows(const at::Tensor& local);
    // In place: rank `root`'s values everywhere.
    void broadcast(std::vector<at::Tensor>& tensors, int root = 0);
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
