#include "grove/distributed.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef GROVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <stdexcept>

#include "grove/error.hpp"

namespace grove {

const char* backend_name(CollectiveBackend backend) { return backend == CollectiveBackend::nccl ? "nccl" : "gloo"; }

bool nccl_available() {
#ifdef GROVE_NCCL
    return true;
#else
    return false;
#endif
}

RankPlacement place_rank(const std::string& manifest_path, const std::string& device, DdpBackend requested, int local_rank,
                         int cuda_devices, bool nccl_built) {
    const std::string key = manifest_path + ": train.ddp_backend = \"nccl\"";
    const bool on_cuda = device == "cuda" || device.rfind("cuda:", 0) == 0 || (device == "auto" && cuda_devices > 0);
    if (!on_cuda) {
        if (requested == DdpBackend::nccl)
            throw Error(ErrorKind::manifest, key + " runs between GPUs, but model.device is \"" + device +
                                                 "\" here; set ddp_backend = \"gloo\" (or \"auto\") or put the model on CUDA");
        return {device == "auto" ? "cpu" : device, CollectiveBackend::gloo, ""};
    }
    if (requested == DdpBackend::nccl && !nccl_built)
        throw Error(ErrorKind::manifest, key +
                                             ": this Grove was built without NCCL (it needs torch's CUDA wheel and the "
                                             "CUDA toolkit when built); set ddp_backend = \"gloo\"");
    RankPlacement p{device, CollectiveBackend::gloo, ""};
    if ((device == "cuda" || device == "auto") && cuda_devices > 0)
        p.device = "cuda:" + std::to_string(local_rank % cuda_devices);
    if (requested == DdpBackend::nccl || (requested == DdpBackend::automatic && nccl_built))
        p.backend = CollectiveBackend::nccl;
    if (requested == DdpBackend::nccl) p.nccl_required_by = key;
    return p;
}

RankPlacement place_rank(const std::string& manifest_path, const std::string& device, DdpBackend requested, int local_rank) {
    return place_rank(manifest_path, device, requested, local_rank, int(at::getNumGPUs()), nccl_available());
}

std::pair<int, int> first_shared_gpu(const std::vector<std::string>& identities) {
    for (size_t b = 1; b < identities.size(); ++b)
        for (size_t a = 0; a < b; ++a)
            if (identities[a] == identities[b]) return {int(a), int(b)};
    return {-1, -1};
}

struct ProcessGroup::Impl {
    c10::intrusive_ptr<c10d::TCPStore> store;
    c10::intrusive_ptr<c10d::Backend> group;
    at::Device device{at::kCPU};  // where the collectives' buffers live

    // collectives run on contiguous tensors on the backend's device; results are copied back
    at::Tensor staged(const at::Tensor& t) const { return t.detach().to(device).contiguous(); }
};

namespace {
c10::intrusive_ptr<c10d::Backend> gloo_group(const c10::intrusive_ptr<c10d::TCPStore>& store,
                                             const ProcessGroupConfig& config) {
    auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(config.timeout_seconds));
    // one machine: loopback; several: the interface this host's name resolves to
    bool local = config.master_addr == "127.0.0.1" || config.master_addr == "localhost";
    options->devices.push_back(local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                     : c10d::ProcessGroupGloo::createDefaultDevice());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, config.rank, config.world_size, options);
}

#ifdef GROVE_NCCL
// This rank's GPU as host and PCI address: equal for two ranks exactly when they share a GPU,
// whatever each of them sees through CUDA_VISIBLE_DEVICES.
std::string gpu_identity(at::Device device) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
    char pci[64];
    std::snprintf(pci, sizeof(pci), "%04x:%02x:%02x", p->pciDomainID, p->pciBusID, p->pciDeviceID);
    return std::string(host) + " " + pci;
}

// Every rank's GPU identity, through the store (each rank reads them all, so all decide alike).
std::vector<std::string> gpu_identities(c10d::Store& store, const ProcessGroupConfig& config, at::Device device) {
    auto as_bytes = [](const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); };
    store.set("grove/gpu/" + std::to_string(config.rank), as_bytes(gpu_identity(device)));
    std::vector<std::string> identities;
    for (int r = 0; r < config.world_size; ++r) {
        const std::vector<uint8_t> bytes = store.get("grove/gpu/" + std::to_string(r));
        identities.emplace_back(bytes.begin(), bytes.end());
    }
    // rank 0 serves the store: it waits until every rank has read, so none loses it mid-way when
    // all of them stop at a shared GPU
    store.set("grove/gpu-read/" + std::to_string(config.rank), as_bytes("1"));
    if (config.rank == 0) {
        std::vector<std::string> read;
        for (int r = 0; r < config.world_size; ++r) read.push_back("grove/gpu-read/" + std::to_string(r));
        store.wait(read);
    }
    return identities;
}
#endif

// NCCL when every rank has a GPU of its own; else Gloo, or an error when NCCL was asked for by name.
c10::intrusive_ptr<c10d::Backend> nccl_group(const c10::intrusive_ptr<c10d::TCPStore>& store, ProcessGroupConfig& config,
                                             at::Device device) {
#ifdef GROVE_NCCL
    const std::vector<std::string> identities = gpu_identities(*store, config, device);
    const auto [a, b] = first_shared_gpu(identities);
    if (a >= 0) {
        if (!config.nccl_required_by.empty())
            throw Error(ErrorKind::manifest,
                        config.nccl_required_by + " needs one GPU per process, but ranks " + std::to_string(a) + " and " +
                            std::to_string(b) + " share the GPU " + identities[size_t(a)] +
                            " (NCCL refuses two ranks on one device); start at most as many processes as GPUs, "
                            "or set ddp_backend = \"gloo\" (\"auto\" falls back to it)");
        config.backend = CollectiveBackend::gloo;
        return gloo_group(store, config);
    }
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::chrono::seconds(config.timeout_seconds);
    auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, config.rank, config.world_size, options);
    group->setBoundDeviceId(device);
    group->eagerConnectSingleDevice(device);  // the communicator now: a rank that cannot join fails here, not mid-step
    return group;
#else
    (void)store, (void)config, (void)device;
    throw Error(ErrorKind::usage, "this Grove was built without NCCL; use the gloo backend");
#endif
}
}  // namespace

ProcessGroup::ProcessGroup(const ProcessGroupConfig& config) : config_(config), impl_(new Impl) {
    if (config.world_size < 1 || config.rank < 0 || config.rank >= config.world_size)
        throw Error(ErrorKind::usage, "rank " + std::to_string(config.rank) + " is not inside world size " +
                                          std::to_string(config.world_size) + " (RANK, WORLD_SIZE)");
    const at::Device device = [&] {
        try {
            return at::Device(config.device);
        } catch (const c10::Error&) {
            throw Error(ErrorKind::usage, "rank " + std::to_string(config.rank) + ": unknown device \"" + config.device + "\"");
        }
    }();
    if (config.backend == CollectiveBackend::nccl && !(device.is_cuda() && device.has_index()))
        throw Error(ErrorKind::usage, "the NCCL process group needs one GPU as cuda:N, not \"" + config.device + "\"");
#ifdef GROVE_NCCL
    if (device.is_cuda() && device.has_index()) c10::cuda::set_device(device.index());  // context and allocations there
#endif
    try {
        c10d::TCPStoreOptions store_options;
        store_options.port = uint16_t(config.master_port);
        store_options.isServer = config.rank == 0;
        store_options.numWorkers = config.world_size;
        store_options.waitWorkers = true;
        store_options.timeout = std::chrono::seconds(config.timeout_seconds);
        impl_->store = c10::make_intrusive<c10d::TCPStore>(config.master_addr, store_options);
        impl_->group = config_.backend == CollectiveBackend::nccl ? nccl_group(impl_->store, config_, device)
                                                                  : gloo_group(impl_->store, config_);
        if (config_.backend == CollectiveBackend::nccl) impl_->device = device;
    } catch (const Error&) {
        throw;  // already says what is wrong and what to do
    } catch (const std::exception& e) {
        throw Error(ErrorKind::runtime, "rank " + std::to_string(config.rank) + " could not join the process group at " +
                                            config.master_addr + ":" + std::to_string(config.master_port) +
                                            " (MASTER_ADDR, MASTER_PORT) over " + backend_name(config_.backend) + ": " +
                                            e.what());
    }
}

ProcessGroup::~ProcessGroup() {
    // NCCL's watchdog thread and communicators are released here rather than at exit (where torch
    // warns). While an error unwinds, abort: a graceful shutdown would wait for collectives the
    // other ranks may never finish, and the error would not be printed.
    if (!impl_ || !impl_->group || config_.backend != CollectiveBackend::nccl) return;
    try {
        if (std::uncaught_exceptions() > 0)
            impl_->group->abort();
        else
            impl_->group->shutdown();
    } catch (const std::exception&) {  // a destructor must not throw; the process is ending anyway
    }
}

namespace {
// Indices of `tensors` in buckets of one dtype each, filled in order up to `bucket_bytes` (a tensor
// larger than that alone).
std::vector<std::vector<size_t>> buckets_of(const std::vector<at::Tensor>& tensors, size_t bucket_bytes) {
    std::map<at::ScalarType, std::vector<size_t>> by_dtype;
    for (size_t i = 0; i < tensors.size(); ++i) by_dtype[tensors[i].scalar_type()].push_back(i);
    std::vector<std::vector<size_t>> buckets;
    for (const auto& entry : by_dtype) {
        size_t bytes = 0;
        bool open = false;
        for (size_t i : entry.second) {
            const size_t size = size_t(tensors[i].numel()) * tensors[i].element_size();
            if (!open || (bytes > 0 && bytes + size > bucket_bytes)) {
                buckets.emplace_back();
                bytes = 0;
                open = true;
            }
            buckets.back().push_back(i);
            bytes += size;
        }
    }
    return buckets;
}
}  // namespace

void ProcessGroup::bucketed(const std::vector<at::Tensor>& tensors,
                            const std::function<void(std::vector<at::Tensor>&)>& collective) {
    for (const auto& bucket : buckets_of(tensors, config_.bucket_bytes)) {
        std::vector<at::Tensor> flat;
        for (size_t i : bucket) flat.push_back(impl_->staged(tensors[i]).view(-1));
        std::vector<at::Tensor> buffer{flat.size() == 1 ? flat[0] : at::cat(flat)};
        flat.clear();  // a tensor staged from another device is freed before the collective
        collective(buffer);
        int64_t offset = 0;
        for (size_t i : bucket) {
            const int64_t n = tensors[i].numel();
            tensors[i].detach().copy_(buffer[0].narrow(0, offset, n).view(tensors[i].sizes()));
            offset += n;
        }
    }
}

namespace {
// A collective's end. When the other ranks do not join it within the timeout, the error names the
// setting (train.ddp_timeout): a rank still busy with a long generation or reward looks alike.
void finish(c10d::Work& work, const ProcessGroupConfig& config, const char* collective) {
    try {
        work.wait();
    } catch (const std::exception& e) {
        const std::string what = e.what();
        if (what.find("imed out") == std::string::npos && what.find("imeout") == std::string::npos) throw;
        throw Error(ErrorKind::runtime,
                    "rank " + std::to_string(config.rank) + " waited " + std::to_string(config.timeout_seconds) +
                        " s (train.ddp_timeout) for the other ranks to join a " + collective +
                        ": one has stopped, or is still busy (a long generation, evaluation or reward); if a step can take "
                        "that long, raise train.ddp_timeout (" +
                        what.substr(0, what.find('\n')) + ")");
    }
}
}  // namespace

// With one rank the collectives still run (nothing short-circuits), so a one-rank group checks the
// backend itself: the device kit's NCCL check on a machine with one GPU.
void ProcessGroup::all_reduce(std::vector<at::Tensor>& tensors, bool max) {
    bucketed(tensors, [&](std::vector<at::Tensor>& buffer) {
        c10d::AllreduceOptions options;
        options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
        finish(*impl_->group->allreduce(buffer, options), config_, "sum or maximum");
    });
}

void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors) { all_reduce(tensors, false); }
void ProcessGroup::all_reduce_max(std::vector<at::Tensor>& tensors) { all_reduce(tensors, true); }

at::Tensor ProcessGroup::all_gather_rows(const at::Tensor& local) {
    at::Tensor input = impl_->staged(local);
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < config_.world_size; ++r) outputs[0].push_back(at::empty_like(input));
    std::vector<at::Tensor> inputs{input};
    finish(*impl_->group->allgather(outputs, inputs), config_, "gather");
    return at::cat(outputs[0], 0).to(local.device());
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
    bucketed(tensors, [&](std::vector<at::Tensor>& buffer) {
        c10d::BroadcastOptions options;
        options.rootRank = root;
        finish(*impl_->group->broadcast(buffer, options), config_, "broadcast");
    });
}

void ProcessGroup::broadcast_from_owners(const std::vector<at::Tensor>& tensors, const std::vector<int>& owners) {
    if (owners.size() != tensors.size()) throw std::logic_error("broadcast_from_owners: one owner per tensor");
    for (int root = 0; root < config_.world_size; ++root) {
        std::vector<at::Tensor> owned;
        for (size_t i = 0; i < tensors.size(); ++i)
            if (owners[i] == root) owned.push_back(tensors[i]);
        broadcast(owned, root);
    }
}

void ProcessGroup::barrier() { finish(*impl_->group->barrier(), config_, "barrier"); }

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
