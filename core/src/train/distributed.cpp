#include "grove/distributed.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <map>

#include "grove/error.hpp"

namespace grove {

struct ProcessGroup::Impl {
    c10::intrusive_ptr<c10d::TCPStore> store;
    c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
};

ProcessGroup::ProcessGroup(const ProcessGroupConfig& config) : config_(config), impl_(new Impl) {
    if (config.world_size < 1 || config.rank < 0 || config.rank >= config.world_size)
        throw Error(ErrorKind::usage, "rank " + std::to_string(config.rank) + " is not inside world size " +
                                          std::to_string(config.world_size) + " (RANK, WORLD_SIZE)");
    try {
        c10d::TCPStoreOptions store_options;
        store_options.port = uint16_t(config.master_port);
        store_options.isServer = config.rank == 0;
        store_options.numWorkers = config.world_size;
        store_options.waitWorkers = true;
        store_options.timeout = std::chrono::seconds(config.timeout_seconds);
        impl_->store = c10::make_intrusive<c10d::TCPStore>(config.master_addr, store_options);
        auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(config.timeout_seconds));
        // one machine: loopback; several: the interface this host's name resolves to
        bool local = config.master_addr == "127.0.0.1" || config.master_addr == "localhost";
        options->devices.push_back(local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                         : c10d::ProcessGroupGloo::createDefaultDevice());
        impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, config.rank, config.world_size, options);
    } catch (const std::exception& e) {
        throw Error(ErrorKind::runtime, "rank " + std::to_string(config.rank) + " could not join the process group at " +
                                            config.master_addr + ":" + std::to_string(config.master_port) +
                                            " (MASTER_ADDR, "
                                            "MASTER_PORT): " +
                                            e.what());
    }
}

ProcessGroup::~ProcessGroup() = default;

namespace {
// collectives run on contiguous CPU tensors; results are copied back into the callers' tensors
at::Tensor staged(const at::Tensor& t) { return t.detach().to(at::kCPU).contiguous(); }
}  // namespace

void ProcessGroup::all_reduce(std::vector<at::Tensor>& tensors, bool max) {
    if (config_.world_size == 1 || tensors.empty()) return;
    std::map<at::ScalarType, std::vector<size_t>> by_dtype;  // one flat buffer per dtype
    for (size_t i = 0; i < tensors.size(); ++i) by_dtype[tensors[i].scalar_type()].push_back(i);
    for (auto& [dtype, indices] : by_dtype) {
        std::vector<at::Tensor> flat;
        for (size_t i : indices) flat.push_back(staged(tensors[i]).view(-1));
        std::vector<at::Tensor> buffer{at::cat(flat)};
        c10d::AllreduceOptions options;
        options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
        impl_->group->allreduce(buffer, options)->wait();
        int64_t offset = 0;
        for (size_t i : indices) {
            int64_t n = tensors[i].numel();
            tensors[i].detach().copy_(buffer[0].narrow(0, offset, n).view(tensors[i].sizes()));
            offset += n;
        }
    }
}

void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors) { all_reduce(tensors, false); }
void ProcessGroup::all_reduce_max(std::vector<at::Tensor>& tensors) { all_reduce(tensors, true); }

at::Tensor ProcessGroup::all_gather_rows(const at::Tensor& local) {
    if (config_.world_size == 1) return local;
    at::Tensor input = staged(local);
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < config_.world_size; ++r) outputs[0].push_back(at::empty_like(input));
    std::vector<at::Tensor> inputs{input};
    impl_->group->allgather(outputs, inputs)->wait();
    return at::cat(outputs[0], 0).to(local.device());
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
    if (config_.world_size == 1) return;
    for (at::Tensor& t : tensors) {
        std::vector<at::Tensor> buffer{staged(t)};
        c10d::BroadcastOptions options;
        options.rootRank = root;
        impl_->group->broadcast(buffer, options)->wait();
        t.detach().copy_(buffer[0]);
    }
}

void ProcessGroup::barrier() {
    if (config_.world_size > 1) impl_->group->barrier()->wait();
}

double ProcessGroup::sum(double value) {
    std::vector<at::Tensor> t{at::full({1}, value, at::kDouble)};
    all_reduce_sum(t);
    return t[0].item<double>();
}

double ProcessGroup::max(double value) {
    std::vector<at::Tensor> t{at::full({1}, value, at::kDouble)};
    all_reduce_max(t);
    return t[0].item<double>();
}

}  // namespace grove
