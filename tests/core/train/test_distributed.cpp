// Several processes: where each rank trains and which backend carries its collectives (place_rank),
// and the collectives themselves on every backend and device this machine has. Ranks run as threads
// of this process, each with its own c10d group over a loopback rendezvous.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <optional>
#include <chrono>
#include <thread>
#include <vector>

#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/loopback_port.hpp"
#include "grove/optimizer.hpp"
#include "plugin_test_support.hpp"

using grove::CollectiveBackend;
using grove::DdpBackend;
using grove::place_rank;

namespace {

// Torch's flight recorder (a process-wide record of collectives) is not safe for several process
// groups enqueueing at once in one process, as these tests' threads do: 6 of 6 runs of 40 repeats
// crashed under load. Real ranks are processes of their own, so only the tests turn it off.
const bool kFlightRecorderOff = [] { return ::setenv("TORCH_FR_BUFFER_SIZE", "0", 1) == 0; }();

}  // namespace

// --- placement: pure rules, any GPU count simulated -----------------------------------------------

TEST(Placement, CpuRanksTalkOverGloo) {
    auto p = place_rank("g.toml", "cpu", DdpBackend::automatic, 1, 0, true);
    EXPECT_EQ(p.device, "cpu");
    EXPECT_EQ(p.backend, CollectiveBackend::gloo);
    p = place_rank("g.toml", "auto", DdpBackend::automatic, 1, 0, true);
    EXPECT_EQ(p.device, "cpu") << "auto without a GPU";
    EXPECT_EQ(p.backend, CollectiveBackend::gloo);
}

TEST(Placement, GpusAreDealtRoundRobinAndNcclWaitsForTheRendezvous) {
    for (const char* device : {"cuda", "auto"}) {
        auto p = place_rank("g.toml", device, DdpBackend::automatic, 3, 8, true);
        EXPECT_EQ(p.device, "cuda:3") << device;
        EXPECT_EQ(p.backend, CollectiveBackend::nccl) << device << ": tentative, the ranks compare GPUs";
        EXPECT_EQ(p.nccl_required_by, "") << "auto may fall back to Gloo";
    }
    EXPECT_EQ(place_rank("g.toml", "cuda", DdpBackend::automatic, 2, 2, true).device, "cuda:0") << "round-robin";
    EXPECT_EQ(place_rank("g.toml", "cuda:1", DdpBackend::automatic, 0, 4, true).device, "cuda:1") << "every rank's";
    EXPECT_EQ(place_rank("g.toml", "cuda", DdpBackend::gloo, 1, 2, true).backend, CollectiveBackend::gloo) << "asked for";
    EXPECT_EQ(place_rank("g.toml", "cuda", DdpBackend::automatic, 1, 2, false).backend, CollectiveBackend::gloo)
        << "auto without NCCL in the build";
    auto named = place_rank("run/g.toml", "cuda", DdpBackend::nccl, 0, 1, true);
    EXPECT_EQ(named.backend, CollectiveBackend::nccl);
    EXPECT_EQ(named.nccl_required_by, "run/g.toml: train.ddp_backend = \"nccl\"") << "named in a later error";
}

TEST(Placement, NcclThatCannotWorkIsRefusedWithTheKeyAndTheFix) {
    std::string cpu = grove::test::error_message([] { place_rank("run/g.toml", "cpu", DdpBackend::nccl, 0, 1, true); });
    EXPECT_NE(cpu.find("run/g.toml: train.ddp_backend = \"nccl\""), std::string::npos) << cpu;
    EXPECT_NE(cpu.find("model.device is \"cpu\""), std::string::npos) << cpu;
    EXPECT_NE(cpu.find("\"gloo\""), std::string::npos) << cpu;
    std::string unbuilt = grove::test::error_message([] { place_rank("g.toml", "cuda", DdpBackend::nccl, 0, 2, false); });
    EXPECT_NE(unbuilt.find("built without NCCL"), std::string::npos) << unbuilt;
}

TEST(Placement, RanksShareAGpuWhenTheirHostAndPciAddressAgree) {
    using grove::first_shared_gpu;
    EXPECT_EQ(first_shared_gpu({"h 0000:65:00", "h 0000:66:00"}), std::make_pair(-1, -1));
    EXPECT_EQ(first_shared_gpu({"h 0000:65:00", "g 0000:65:00"}), std::make_pair(-1, -1)) << "two machines";
    EXPECT_EQ(first_shared_gpu({"h a", "h b", "h c", "h b", "h a"}), std::make_pair(1, 3)) << "the first repeat";
    EXPECT_EQ(first_shared_gpu({"h a"}), std::make_pair(-1, -1));
}

// --- ZeRO stage 1: who updates which tensor ---------------------------------------------------------

TEST(ShardedOptimizer, OwnersShareTheElementsAboutEqually) {
    std::vector<at::Tensor> params;
    for (int64_t n : {100, 10, 10, 50, 30}) params.push_back(at::zeros({n}));
    EXPECT_EQ(grove::shard_owners(params, 1), (std::vector<int>{0, 0, 0, 0, 0}));
    // largest first, each to the least loaded: 100 | 50 + 30 + 10 + 10
    EXPECT_EQ(grove::shard_owners(params, 2), (std::vector<int>{0, 1, 1, 1, 1}));
    EXPECT_EQ(grove::shard_owners(params, 3), (std::vector<int>{0, 2, 2, 1, 2}));
    auto more_ranks_than_tensors = grove::shard_owners({at::zeros({4}), at::zeros({4})}, 4);
    EXPECT_EQ(more_ranks_than_tensors, (std::vector<int>{0, 1}));
}

// Two optimizers that each keep the state of, and update, their share give the update of one
// that does all, bit for bit, and keep no state for the rest: AdamW and Adafactor.
TEST(ShardedOptimizer, SharesTogetherMakeTheWholeUpdate) {
    for (grove::OptimizerKind kind : {grove::OptimizerKind::adamw, grove::OptimizerKind::adafactor}) {
        SCOPED_TRACE(grove::optimizer_name(kind));
        at::manual_seed(0);
        std::vector<at::Tensor> initial{at::randn({6, 4}), at::randn({4}), at::randn({3, 3})};
        auto copy = [&] {
            std::vector<at::Tensor> out;
            for (const auto& t : initial) out.push_back(t.clone());
            return out;
        };
        std::vector<at::Tensor> whole = copy(), rank0 = copy(), rank1 = copy();
        grove::TrainSection settings;
        settings.optim = kind;
        settings.adam_beta2 = 0.99;
        settings.weight_decay = 0.1;
        const std::vector<int> owners = grove::shard_owners(whole, 2);
        std::vector<bool> mine0, mine1;
        for (int o : owners) mine0.push_back(o == 0), mine1.push_back(o == 1);
        auto named = [](const std::vector<at::Tensor>& tensors) {  // a matrix, a norm, a matrix
            const char* names[] = {"a.weight", "a.norm.weight", "b.weight"};
            std::vector<std::pair<std::string, at::Tensor>> out;
            for (size_t i = 0; i < tensors.size(); ++i) out.emplace_back(names[i], tensors[i]);
            return out;
        };
        auto all = grove::make_optimizer(settings, named(whole)), first = grove::make_optimizer(settings, named(rank0), mine0),
             second = grove::make_optimizer(settings, named(rank1), mine1);
        for (int step = 0; step < 3; ++step) {
            for (size_t i = 0; i < initial.size(); ++i) {
                at::Tensor grad = at::randn(initial[i].sizes());
                for (auto* params : {&whole, &rank0, &rank1}) (*params)[i].mutable_grad() = grad.clone();
            }
            std::vector<at::Tensor> before;
            for (const auto& t : whole) before.push_back(t.clone());
            for (auto* optimizer : {all.get(), first.get(), second.get()}) optimizer->step(1e-2), optimizer->zero_grad();
            for (size_t i = 0; i < initial.size(); ++i) {
                const at::Tensor& updated = owners[i] == 0 ? rank0[i] : rank1[i];
                const at::Tensor& untouched = owners[i] == 0 ? rank1[i] : rank0[i];
                EXPECT_TRUE(at::equal(updated, whole[i])) << "tensor " << i << " step " << step;
                EXPECT_TRUE(at::equal(untouched, before[i])) << "tensor " << i << ": the other rank's, left alone";
                EXPECT_FALSE(at::equal(whole[i], before[i])) << "tensor " << i << ": the step moved it";
            }
            for (size_t i = 0; i < initial.size(); ++i) {  // what the broadcast from the owners does
                rank0[i].copy_(whole[i]);
                rank1[i].copy_(whole[i]);
            }
        }
        EXPECT_EQ(first->state().size() + second->state().size(), all->state().size()) << "state of its own share only";
        for (size_t i = 0; i < initial.size(); ++i) {
            EXPECT_EQ(first->state_of(i).empty(), owners[i] != 0) << i;
            EXPECT_EQ(second->state_of(i).empty(), owners[i] != 1) << i;
        }
    }
}

// --- the collectives ------------------------------------------------------------------------------

namespace {

// What rank `rank` of `world` sees from every collective the trainer uses, checked against the sums,
// maxima and orders the ranks' inputs imply.
void check_collectives(grove::ProcessGroup& group, at::Device device) {
    const int rank = group.rank(), world = group.world_size();
    auto on = at::TensorOptions().device(device);
    // mixed dtypes in one call: packed into buckets of one dtype; a transposed (non-contiguous) and an
    // empty tensor among them
    std::vector<at::Tensor> tensors{at::full({2, 3}, rank + 1.0, on.dtype(at::kFloat)),
                                    at::full({4}, 10.0 * (rank + 1), on.dtype(at::kDouble)),
                                    at::arange(5, on.dtype(at::kLong)) * (rank + 1),
                                    at::full({1}, -rank - 0.5, on.dtype(at::kFloat)),
                                    (at::arange(6, on.dtype(at::kFloat)).view({2, 3}) * (rank + 1)).t(),
                                    at::empty({0}, on.dtype(at::kFloat))};
    group.all_reduce_sum(tensors);
    EXPECT_TRUE(at::equal(tensors[4].cpu(), (at::arange(6, at::kFloat).view({2, 3}) * float(world * (world + 1) / 2)).t()));
    EXPECT_EQ(tensors[5].numel(), 0);
    const double ranks_summed = world * (world + 1) / 2.0;  // sum of rank + 1
    EXPECT_TRUE(at::equal(tensors[0].cpu(), at::full({2, 3}, ranks_summed, at::kFloat)));
    EXPECT_TRUE(at::equal(tensors[1].cpu(), at::full({4}, 10.0 * ranks_summed, at::kDouble)));
    EXPECT_TRUE(at::equal(tensors[2].cpu(), at::arange(5, at::kLong) * int64_t(ranks_summed)));
    EXPECT_FLOAT_EQ(tensors[3].item<float>(), float(-ranks_summed + world * 0.5));
    EXPECT_EQ(tensors[0].device(), device) << "results land where the caller's tensors are";

    std::vector<at::Tensor> maxima{at::tensor({double(rank), -double(rank)}, on.dtype(at::kDouble))};
    group.all_reduce_max(maxima);
    EXPECT_TRUE(at::equal(maxima[0].cpu(), at::tensor({double(world - 1), 0.0}, at::kDouble)));

    at::Tensor rows = at::full({2, 3}, double(rank), on.dtype(at::kFloat));
    at::Tensor gathered = group.all_gather_rows(rows);
    ASSERT_EQ(gathered.sizes(), (std::vector<int64_t>{2 * world, 3}));
    for (int r = 0; r < world; ++r)
        EXPECT_TRUE(at::equal(gathered.narrow(0, 2 * r, 2).cpu(), at::full({2, 3}, double(r), at::kFloat))) << "rank order";
    EXPECT_EQ(gathered.device(), device);

    const int root = world - 1;
    // a CPU tensor among them, as a checkpoint's gathered moments are (staged to the backend's device)
    std::vector<at::Tensor> shared{at::full({3}, 100.0 + rank, on.dtype(at::kFloat)), at::full({2}, rank, on.dtype(at::kLong)),
                                   at::full({2}, 7.0 * rank, at::kFloat)};
    group.broadcast(shared, root);
    EXPECT_TRUE(at::equal(shared[0].cpu(), at::full({3}, 100.0 + root, at::kFloat)));
    EXPECT_TRUE(at::equal(shared[1].cpu(), at::full({2}, int64_t(root), at::kLong)));
    EXPECT_TRUE(at::equal(shared[2], at::full({2}, 7.0 * root, at::kFloat)));

    // ZeRO stage 1's exchange: tensor i from rank i mod world
    std::vector<at::Tensor> updated;
    std::vector<int> owners;
    for (int i = 0; i < 5; ++i) {
        updated.push_back(at::full({i + 1}, 10.0 * rank + i, on.dtype(at::kFloat)));
        owners.push_back(i % world);
    }
    group.broadcast_from_owners(updated, owners);
    for (int i = 0; i < 5; ++i)
        EXPECT_TRUE(at::equal(updated[size_t(i)].cpu(), at::full({i + 1}, 10.0 * (i % world) + i, at::kFloat))) << i;

    EXPECT_DOUBLE_EQ(group.sum(0.25 * (rank + 1)), 0.25 * ranks_summed);
    EXPECT_DOUBLE_EQ(group.max(double(rank)), double(world - 1));
    group.barrier();
}

// Rank `rank` of `world` meeting on the loopback `port`.
grove::ProcessGroupConfig rank_config(int rank, int world, int port, CollectiveBackend backend, const std::string& device,
                                      const std::string& nccl_required_by) {
    grove::ProcessGroupConfig c;
    c.rank = rank;
    c.world_size = world;
    c.master_port = port;
    c.timeout_seconds = 60;
    c.backend = backend;
    c.device = device;
    c.nccl_required_by = nccl_required_by;
    return c;
}

// Runs check_collectives on `world` ranks, one thread each, rank r on devices[r], asking for
// `backend` and expecting `expected_backend` after the ranks compared their GPUs; `bucket_bytes`
// unset keeps the default (every tensor of the checks in one bucket per dtype).
void run_ranks(int world, CollectiveBackend backend, const std::vector<std::string>& devices,
               CollectiveBackend expected_backend, std::optional<size_t> bucket_bytes = std::nullopt) {
    const int port = grove::free_loopback_port();
    std::vector<std::thread> ranks;
    std::vector<std::string> errors(static_cast<size_t>(world));
    for (int rank = 0; rank < world; ++rank)
        ranks.emplace_back([&, rank] {
            try {
                auto config = rank_config(rank, world, port, backend, devices[size_t(rank)],
                                          expected_backend == CollectiveBackend::nccl ? "the test" : "");
                if (bucket_bytes) config.bucket_bytes = *bucket_bytes;
                grove::ProcessGroup group(config);
                EXPECT_EQ(group.backend(), expected_backend);
                check_collectives(group, at::Device(devices[size_t(rank)]));
            } catch (const std::exception& e) {
                errors[size_t(rank)] = e.what();
            }
        });
    for (auto& t : ranks) t.join();
    for (int rank = 0; rank < world; ++rank) EXPECT_EQ(errors[size_t(rank)], "") << "rank " << rank;
}

}  // namespace

TEST(Collectives, GlooOnTheCpu) {
    const auto gloo = CollectiveBackend::gloo;
    run_ranks(1, gloo, {"cpu"}, gloo);  // one rank still runs every collective
    run_ranks(2, gloo, {"cpu", "cpu"}, gloo);
    run_ranks(3, gloo, {"cpu", "cpu", "cpu"}, gloo);
    // 16-byte buckets: most calls span several buckets, and tensors larger than one go alone
    run_ranks(2, gloo, {"cpu", "cpu"}, gloo, 16);
    run_ranks(3, gloo, {"cpu", "cpu", "cpu"}, gloo, 16);
}

// A rank that does not join a collective within the timeout (the manifest's train.ddp_timeout)
// stops the waiting one with an error that names the setting, not Gloo's bare timeout.
TEST(Collectives, ACollectiveTheOthersDoNotJoinInTimeNamesTheTimeoutSetting) {
    const int port = grove::free_loopback_port();
    std::vector<std::string> errors(2);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank)
        ranks.emplace_back([&, rank] {
            try {
                auto config = rank_config(rank, 2, port, CollectiveBackend::gloo, "cpu", "");
                config.timeout_seconds = 2;
                grove::ProcessGroup group(config);
                if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(5));  // busy past the timeout
                group.barrier();
            } catch (const std::exception& e) {
                errors[size_t(rank)] = e.what();
            }
        });
    for (auto& t : ranks) t.join();
    EXPECT_CONTAINS(errors[0],
                    "rank 0 waited 2 s (train.ddp_timeout) for the other ranks to join a barrier: one has "
                    "stopped, or is still busy");
    EXPECT_FALSE(errors[1].empty()) << "the late rank finds the others gone";
}

TEST(Collectives, GlooWithTwoRanksSharingOneGpu) {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; the device kit runs this on a GPU";
    run_ranks(2, CollectiveBackend::gloo, {"cuda:0", "cuda:0"}, CollectiveBackend::gloo);
}

TEST(Collectives, NcclOnOneGpu) {
    if (!grove::nccl_available()) GTEST_SKIP() << "this build has no NCCL (no CUDA toolkit when it was configured)";
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; the device kit runs this on a GPU";
    // NCCL refuses two ranks on one device, so one GPU checks a one-rank group
    run_ranks(1, CollectiveBackend::nccl, {"cuda:0"}, CollectiveBackend::nccl);
}

TEST(Collectives, NcclWithOneGpuPerRank) {
    if (!grove::nccl_available()) GTEST_SKIP() << "this build has no NCCL (no CUDA toolkit when it was configured)";
    if (at::getNumGPUs() < 2) GTEST_SKIP() << "fewer than 2 GPUs here: NCCL needs one per rank";
    run_ranks(2, CollectiveBackend::nccl, {"cuda:0", "cuda:1"}, CollectiveBackend::nccl);
}

// Two ranks on one GPU: `auto` (NCCL not named) falls back to Gloo after the ranks compared their
// GPUs; NCCL named is refused on every rank with the GPU they share.
TEST(Collectives, RanksSharingAGpuFallBackToGlooOrRefuseNamedNccl) {
    if (!grove::nccl_available()) GTEST_SKIP() << "this build has no NCCL (no CUDA toolkit when it was configured)";
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; the device kit runs this on a GPU";
    run_ranks(2, CollectiveBackend::nccl, {"cuda:0", "cuda:0"}, CollectiveBackend::gloo);
    const int port = grove::free_loopback_port();
    std::vector<std::string> errors(2);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank)
        ranks.emplace_back([&, rank] {
            const auto c =
                rank_config(rank, 2, port, CollectiveBackend::nccl, "cuda:0", "g.toml: train.ddp_backend = \"nccl\"");
            errors[size_t(rank)] = grove::test::error_message([&] { grove::ProcessGroup group(c); });
        });
    for (auto& t : ranks) t.join();
    for (const std::string& e : errors) {
        EXPECT_NE(e.find("g.toml: train.ddp_backend = \"nccl\" needs one GPU per process, but ranks 0 and 1 share the GPU"),
                  std::string::npos)
            << e;
    }
}
