// grove-plugin-worker: runs one reward plugin for a host that isolates it ([[rewards]] isolation =
// "process"; docs/reliability.md#isolated-plugins). The host starts it with the protocol's socket as
// fd 3 (core/src/plugins/worker_protocol.hpp); it loads the plugin file, creates the instance, then
// answers one batch per frame until the host closes the socket. A plugin that crashes or hangs
// takes only this process with it. Links grove_core only, no libtorch.
#include <sys/prctl.h>

#include <csignal>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>

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

// The instance the start frame names; nullopt after a failure was sent.
std::optional<PluginInstance> create(int fd, const std::string& payload) {
    worker::Reader r(payload);
    const std::string file = r.bytes(), config_toml = r.bytes(), origin = r.bytes(), base_dir = r.bytes();
    try {
        PluginHost host({});
        PluginInfo info = host.find(file, GROVE_PLUGIN_KIND_REWARD, origin);
        PluginConfig config = PluginConfig::from_toml_text(info, config_toml, origin + " config", base_dir);
        return PluginInstance(std::move(info), std::move(config));
    } catch (const Error& e) {
        send_failure(fd, e.kind(), e.what());
    } catch (const std::exception& e) {
        send_failure(fd, ErrorKind::plugin, e.what());
    }
    return std::nullopt;
}

int serve(int fd) {
    auto start = worker::read_frame(fd, 0);
    if (!start || start->type != worker::FrameType::start) return 2;
    std::optional<PluginInstance> instance = create(fd, start->payload);
    if (!instance) return 1;
    worker::write_frame(fd, worker::FrameType::ready, "");
    while (auto frame = worker::read_frame(fd, 0)) {
        if (frame->type != worker::FrameType::score) return 2;
        try {
            RewardRows rows = worker::decode_batch(frame->payload);
            worker::ScoredBatch scored;
            instance->score(rows.view(), scored.scores, scored.metrics, &scored.logged);
            if (!worker::write_frame(fd, worker::FrameType::scored, worker::encode_scored(scored))) return 0;
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
        std::cerr << "grove-plugin-worker: started by grove for [[rewards]] isolation = \"process\"; not for direct use\n";
        return 2;
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the host's death ends the worker too
    std::signal(SIGINT, SIG_IGN);        // Ctrl-C reaches the whole group: the host decides, then closes the socket
    try {
        return serve(std::atoi(argv[1]));
    } catch (const std::exception& e) {
        std::cerr << "grove-plugin-worker: " << e.what() << "\n";
        return 1;
    }
}
