// grove train, grove sft: a manifest's run (one process, or --nproc local ranks).
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "cli.hpp"
#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/run_config.hpp"
#include "grove/sft.hpp"
#include "grove/trainer.hpp"

namespace grove::cli {

using nlohmann::json;

int train(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("manifest", po::value<std::string>()->required(), "the run's TOML manifest")(
        "set", po::value<std::vector<std::string>>()->composing(), "override a key: --set section.key=value (repeatable)")(
        "resume", po::value<std::string>()->implicit_value("latest"), "continue from the latest checkpoint, or from DIR")(
        "overwrite", "replace an output folder that holds another run")(
        "nproc", po::value<int>()->default_value(1),
        "train with N local processes (torch.distributed: NCCL, one GPU each, or Gloo)");
    po::positional_options_description positional;
    positional.add("manifest", 1);
    auto vm =
        parse("train", args, options, positional, "MANIFEST [--set k=v ...] [--resume [DIR|latest]] [--overwrite] [--nproc N]");
    std::vector<std::string> overrides;
    if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
    int nproc = vm["nproc"].as<int>();
    if (nproc < 1) throw Error(ErrorKind::usage, "grove train: --nproc must be >= 1");
    if (nproc > 1) {
        // one clear error before any rank starts
        auto manifest = Manifest::load(vm["manifest"].as<std::string>(), overrides, nproc);
        RunConfig::from(manifest);  // the rules across keys (a reward, ...)
        place_rank(manifest.path(), manifest.string("model.device"),
                   ddp_backend_from_name(manifest.string("train.ddp_backend")), 0);
        std::vector<std::string> command{"train"};
        for (size_t i = 0; i < args.size(); ++i) {
            if (args[i] == "--nproc")
                ++i;  // the ranks run one process each
            else if (args[i].rfind("--nproc=", 0) != 0)
                command.push_back(args[i]);
        }
        return launch_local_processes(nproc, command);
    }
    auto manifest = Manifest::load(vm["manifest"].as<std::string>(), overrides, world_size_from_environment());
    TrainerOptions o;
    o.overwrite = vm.count("overwrite") > 0;
    if (vm.count("resume")) o.resume = vm["resume"].as<std::string>();
    o.world_size = manifest.world_size();
    std::unique_ptr<ProcessGroup> group;
    if (o.world_size > 1) {  // torchrun's environment (or --nproc's)
        ProcessGroupConfig c;
        c.world_size = o.world_size;
        c.rank = integer_from_environment("RANK", -1, 0);
        if (c.rank < 0) throw Error(ErrorKind::usage, "WORLD_SIZE=" + std::to_string(o.world_size) + " needs RANK as well");
        if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) c.master_addr = addr;
        c.master_port = integer_from_environment("MASTER_PORT", c.master_port, 1);
        // torchrun's LOCAL_RANK; without it, every rank on this machine
        const int local_rank = integer_from_environment("LOCAL_RANK", c.rank, 0);
        RankPlacement placed = place_rank(manifest.path(), manifest.string("model.device"),
                                          ddp_backend_from_name(manifest.string("train.ddp_backend")), local_rank);
        c.backend = placed.backend;
        c.device = placed.device;
        c.nccl_required_by = placed.nccl_required_by;
        c.timeout_seconds = int(RunConfig::from(manifest).train.ddp_timeout);
        o.device = placed.device;
        group = std::make_unique<ProcessGroup>(c);
        o.rank = c.rank;
        o.group = group.get();
    }
    o.log = &std::cerr;
    o.progress_bar = ::isatty(2) != 0;
    Trainer trainer(manifest, o);
    if (o.rank == 0)
        std::cerr << "grove: training " << manifest.path() << ": " << trainer.total_steps() << " steps, output "
                  << manifest.string("output.dir")
                  << (o.world_size > 1
                          ? ", " + std::to_string(o.world_size) + " processes over " + backend_name(group->backend())
                          : std::string())
                  << "\n";
    trainer.run();  // prints its own summary
    // stopped by a signal: the shell's convention, 128 + the signal, so a script can tell it from done
    return trainer.stop_signal() ? 128 + trainer.stop_signal() : 0;
}

int sft(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("manifest", po::value<std::string>()->required(),
                          "model, data (with a completion column), train, output")(
        "set", po::value<std::vector<std::string>>()->composing(), "override a key: --set section.key=value (repeatable)")(
        "resume", po::value<std::string>()->implicit_value("latest"), "continue from the latest checkpoint, or from DIR")(
        "overwrite", "replace an output folder that holds another run");
    po::positional_options_description positional;
    positional.add("manifest", 1);
    auto vm =
        parse("sft", args, options, positional, "MANIFEST [--set section.key=value ...] [--resume [DIR|latest]] [--overwrite]");
    std::vector<std::string> overrides;
    if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
    auto manifest =
        Manifest::load(vm["manifest"].as<std::string>(), overrides, world_size_from_environment(), ManifestUse::sft);
    SftOptions o;
    o.overwrite = vm.count("overwrite") > 0;
    if (vm.count("resume")) o.resume = vm["resume"].as<std::string>();
    auto result = run_sft(manifest, &std::cerr, o);
    if (result.losses.empty())  // resumed at its last step: only the model was written
        std::cerr << "grove: sft had no steps left; model in " << result.output << "\n";
    else
        std::cerr << "grove: sft done: loss " << result.losses.front() << " -> " << result.losses.back() << "; model in "
                  << result.output << "\n";
    return 0;
}

}  // namespace grove::cli
