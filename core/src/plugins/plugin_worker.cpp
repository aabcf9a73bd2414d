#include "grove/plugin_worker.hpp"

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "grove/error.hpp"
#include "plugins/worker_protocol.hpp"

extern char** environ;

namespace grove {

namespace fs = std::filesystem;

namespace {
// A failure frame's error kind (an unknown one read as a plugin error) and message; nullopt when
// the payload does not decode.
std::optional<std::pair<ErrorKind, std::string>> failure_of(const std::string& payload) {
    try {
        worker::Reader r(payload);
        const uint32_t kind = r.u32();
        std::string message = r.bytes();
        const bool known = kind >= uint32_t(ErrorKind::runtime) && kind <= uint32_t(ErrorKind::input);
        return std::make_pair(known ? ErrorKind(kind) : ErrorKind::plugin, std::move(message));
    } catch (const worker::MalformedFrame&) {
        return std::nullopt;
    }
}

std::string seconds_text(double seconds) {
    std::ostringstream text;
    text << seconds;  // 1, 0.5, 30: no trailing zeros
    return text.str();
}
}  // namespace

std::string plugin_worker_path() {
    if (const char* path = std::getenv("GROVE_PLUGIN_WORKER")) return path;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&plugin_worker_path), &info) == 0 || !info.dli_fname)
        throw Error(ErrorKind::runtime, "cannot locate libgrove_core to find grove-plugin-worker; set GROVE_PLUGIN_WORKER");
    return (fs::path(info.dli_fname).parent_path() / "grove" / "grove-plugin-worker").string();
}

PluginWorker::PluginWorker(const PluginInfo& plugin, const PluginUse& use, uint32_t kind)
        : plugin_(plugin),
          kind_(kind),
          config_toml_(plugin_config_toml(use)),
          origin_(use.origin),
          base_dir_(use.base_dir),
          options_(use.isolation) {
    PluginConfig(plugin, use.config.get(), use.origin + " config", use.base_dir);  // key errors at the manifest's line
    start();
}

PluginWorker::~PluginWorker() { stop(); }

void PluginWorker::start() {
    const std::string worker = plugin_worker_path();
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
        throw Error(ErrorKind::runtime, std::string("socketpair: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, ends[1], 3);  // the protocol's socket is fd 3
    posix_spawn_file_actions_adddup2(&actions, 2, 1);        // what the plugin prints goes to stderr, not the socket
    std::string fd_argument = "3";
    char* argv[] = {const_cast<char*>(worker.c_str()), fd_argument.data(), nullptr};
    const int spawned = ::posix_spawn(&pid_, worker.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(ends[1]);
    if (spawned != 0) {
        ::close(ends[0]);
        pid_ = -1;
        throw Error(ErrorKind::runtime, "cannot start the plugin worker " + worker + ": " + std::strerror(spawned) +
                                            " (set GROVE_PLUGIN_WORKER, or reinstall Grove)");
    }
    socket_ = ends[0];
    worker::Writer w;
    w.u32(worker::kProtocolVersion);
    w.u32(kind_);
    w.bytes(plugin_.file);
    w.bytes(config_toml_);
    w.bytes(origin_);
    w.bytes(base_dir_);
    bool timed_out = false;
    std::optional<worker::Frame> reply;
    try {
        if (!worker::write_frame(socket_, worker::FrameType::start, w.payload())) fail("starting", false);
        reply = worker::read_frame(socket_, options_.timeout_seconds, &timed_out);
    } catch (const Error&) {
        fail("starting", timed_out);
    }
    if (!reply) fail("starting", false);
    if (reply->type == worker::FrameType::failure) {
        auto failure = failure_of(reply->payload);
        if (!failure) distrust("starting", "a failure that does not decode");
        stop();
        throw Error(failure->first, failure->second);
    }
    if (reply->type != worker::FrameType::ready) fail("starting", false);
    ready_ = std::move(reply->payload);
}

void PluginWorker::stop() {
    if (socket_ >= 0) ::close(socket_);  // the worker reads the end of its input and exits
    socket_ = -1;
    if (pid_ <= 0) return;
    for (int i = 0; i < 100; ++i) {
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
            pid_ = -1;
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
}

void PluginWorker::fail(const std::string& what, bool timed_out) {
    int status = 0;
    if (timed_out) ::kill(pid_, SIGKILL);
    const bool ended = pid_ > 0 && ::waitpid(pid_, &status, timed_out ? 0 : WNOHANG) == pid_;
    if (!ended && pid_ > 0) {  // it closed its socket but lives on: end it
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
    }
    pid_ = -1;
    stop();
    std::string how;
    if (timed_out)
        how = "did not answer within its timeout of " + seconds_text(options_.timeout_seconds) + " s and was killed";
    else if (WIFSIGNALED(status))
        how = "crashed with signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
    else if (WIFEXITED(status))
        how = "exited with status " + std::to_string(WEXITSTATUS(status));
    else
        how = "broke the worker protocol";
    // a worker from an older build misreads the start frame and ends
    const std::string build_question =
        what == "starting" && !timed_out ? " (is " + plugin_worker_path() + " from this build of Grove?)" : "";
    const bool reward = kind_ == GROVE_PLUGIN_KIND_REWARD;
    throw Error(ErrorKind::plugin, origin_ + ": " + plugin_kind_name(kind_) + " plugin " + plugin_.display() + " " + how +
                                       " while " + what + build_question + " (isolation = \"process\"" +
                                       (reward ? "; on_failure = \"nan\" would score such a batch NaN and go on" : "") + ")");
}

std::string PluginWorker::call(uint32_t request_type, uint32_t reply_type, const std::string& payload,
                               const std::string& what) {
    if (pid_ <= 0) start();  // the first call after a failure
    bool timed_out = false;
    std::optional<worker::Frame> reply;
    try {
        if (!worker::write_frame(socket_, worker::FrameType(request_type), payload)) fail(what, false);
        reply = worker::read_frame(socket_, options_.timeout_seconds, &timed_out);
    } catch (const worker::MalformedFrame& e) {
        distrust(what, e.what());
    } catch (const Error&) {
        if (!timed_out) throw;  // fail() already named what happened to the worker
        fail(what, true);
    }
    if (!reply) fail(what, false);
    if (reply->type == worker::FrameType::failure) {  // the plugin returned an error: its message, as in-process
        auto failure = failure_of(reply->payload);
        if (!failure) distrust(what, "a failure that does not decode");
        throw Error(failure->first, failure->second);
    }
    if (uint32_t(reply->type) != reply_type) distrust(what, "a reply of the wrong kind");
    return std::move(reply->payload);
}

void PluginWorker::distrust(const std::string& what, const std::string& why) {
    stop();
    throw Error(ErrorKind::plugin, origin_ + ": the worker of " + plugin_kind_name(kind_) + " plugin " + plugin_.display() +
                                       " answered " + what + " with " + why +
                                       "; it was stopped, and the next call starts a new one");
}

}  // namespace grove
