// grove-plugin-worker: runs one reward or environment plugin for a host that isolates it
// (isolation = "process"; docs/reliability.md#isolated-plugins). The host starts it with the protocol's socket as
// fd 3 (core/src/plugins/worker_protocol.hpp); it loads the plugin file, creates the instance, then
// answers one call per frame until the host closes the socket. A plugin that crashes or hangs
// takes only this process with it. Links grove_core only, no libtorch.
#include <sys/prctl.h>

#include <csignal>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>

#include "grove/environment_host.hpp"
#include "grove/error.hpp"
#include "grove/plugin_host.hpp"
#include "plugins/worker_protocol.hpp"

namespace {

using namespace grove;

void send_failure(int fd, ErrorKind kind, const std::string& message) {
    worker::Writer w;
    w.u32(uint32_t(kind));
    w.bytes(message);
    worker::write_frame(fd, worker::FrameType::failure, w.payload());
}

// The plugin the start frame names, created: a reward instance or an environment.
struct Created {
    std::optional<PluginInstance> reward;
    std::unique_ptr<Environment> environment;
};

// nullopt after a failure was sent.
std::optional<Created> create(int fd, const std::string& payload, const std::string& program) {
    worker::Reader r(payload);
    if (const uint32_t version = r.u32(); version != worker::kProtocolVersion) {
        send_failure(fd, ErrorKind::runtime,
                     "the plugin worker " + program + " speaks worker protocol " + std::to_string(worker::kProtocolVersion) +
                         " but Grove sent version " + std::to_string(version) +
                         ": the worker and Grove come from different builds (reinstall Grove, or point "
                         "GROVE_PLUGIN_WORKER at the grove-plugin-worker of this build)");
        return std::nullopt;
    }
    const uint32_t kind = r.u32();
    const std::string file = r.bytes(), config_toml = r.bytes(), origin = r.bytes(), base_dir = r.bytes();
    try {
        PluginHost host({});
        PluginInfo info = host.find(file, kind, origin);
        PluginConfig config = PluginConfig::from_toml_text(info, config_toml, origin + " config", base_dir);
        PluginInstance instance(std::move(info), std::move(config));
        Created created;
        if (kind == GROVE_PLUGIN_KIND_ENVIRONMENT)
            created.environment = std::make_unique<Environment>(std::move(instance));
        else
            created.reward.emplace(std::move(instance));
        return created;
    } catch (const Error& e) {
        send_failure(fd, e.kind(), e.what());
    } catch (const std::exception& e) {
        send_failure(fd, ErrorKind::plugin, e.what());
    }
    return std::nullopt;
}

// One call: the reply's type and payload.
std::pair<worker::FrameType, std::string> answer(Created& plugin, const worker::Frame& frame) {
    using worker::FrameType;
    if (frame.type == FrameType::score && plugin.reward) {
        RewardRows rows = worker::decode_batch(frame.payload);
        worker::ScoredBatch scored;
        plugin.reward->score(rows.view(), scored.scores, scored.metrics, &scored.logs);
        return {FrameType::scored, worker::encode_scored(scored)};
    }
    if (!plugin.environment) throw Error(ErrorKind::plugin, "the host asked a reward worker for an environment call");
    EnvironmentTurns turns = worker::decode_turns(frame.payload);
    switch (frame.type) {
        case FrameType::environment_step:
            return {FrameType::answers, worker::encode_answers(plugin.environment->step(turns))};
        case FrameType::environment_begin: {
            EnvironmentAnswers begun;
            begun.observations = plugin.environment->begin_episodes(turns);
            const size_t n = begun.observations.size();
            begun.done.assign(n, 0);
            begun.tool_calls.assign(n, 0);
            begun.tool_failures.assign(n, 0);
            return {FrameType::answers, worker::encode_answers(begun)};
        }
        case FrameType::environment_score:
            return {FrameType::episode_scores, worker::encode_floats(plugin.environment->score_episodes(turns))};
        default:
            throw Error(ErrorKind::plugin, "the host sent an unknown call");
    }
}

int serve(int fd, const std::string& program) {
    auto start = worker::read_frame(fd, 0);
    if (!start || start->type != worker::FrameType::start) return 2;
    std::optional<Created> plugin = create(fd, start->payload, program);
    if (!plugin) return 1;
    std::string ready;
    if (plugin->environment) {
        const Environment& e = *plugin->environment;
        ready = worker::encode_traits({e.stop_strings(), e.tools_json(), e.scores_episodes(), e.begins_episodes(),
                                       e.reward_by_default(), e.default_reward_name()});
    }
    worker::write_frame(fd, worker::FrameType::ready, ready);
    while (auto frame = worker::read_frame(fd, 0)) {
        try {
            auto [type, payload] = answer(*plugin, *frame);
            if (!worker::write_frame(fd, type, payload)) return 0;
        } catch (const Error& e) {
            send_failure(fd, e.kind(), e.what());
        } catch (const std::exception& e) {
            send_failure(fd, ErrorKind::plugin, e.what());
        }
    }
    return 0;  // the host closed the socket
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "grove-plugin-worker: started by grove for isolation = \"process\"; not for direct use\n";
        return 2;
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the host's death ends the worker too
    std::signal(SIGINT, SIG_IGN);        // Ctrl-C reaches the whole group: the host decides, then closes the socket
    try {
        return serve(std::atoi(argv[1]), argv[0]);
    } catch (const std::exception& e) {
        std::cerr << "grove-plugin-worker: " << e.what() << "\n";
        return 1;
    }
}
