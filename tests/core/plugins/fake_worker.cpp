// A stand-in for grove-plugin-worker that breaks the protocol in one chosen way, so the host's side
// can be tested (GROVE_PLUGIN_WORKER points here). GROVE_FAKE_WORKER_LOG: a file that gets a line per
// start. GROVE_FAKE_WORKER_MODE: "undecodable" (ready, then every reply well framed but too short to
// decode), "bad_failure" (ready, then failure frames too short to decode) or "exit" (exits with
// status 1 on the start frame, as a worker from an older build does).
#include <cstdlib>
#include <fstream>
#include <string>

#include "plugins/worker_protocol.hpp"

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    const int fd = std::atoi(argv[1]);
    const char* log = std::getenv("GROVE_FAKE_WORKER_LOG");
    const std::string mode = std::getenv("GROVE_FAKE_WORKER_MODE") ? std::getenv("GROVE_FAKE_WORKER_MODE") : "";
    if (log) std::ofstream(log, std::ios::app) << "start\n";
    auto start = grove::worker::read_frame(fd, 0);
    if (!start || mode == "exit") return 1;
    grove::worker::write_frame(fd, grove::worker::FrameType::ready, "");
    const auto reply = mode == "bad_failure" ? grove::worker::FrameType::failure : grove::worker::FrameType::scored;
    while (auto frame = grove::worker::read_frame(fd, 0))
        if (!grove::worker::write_frame(fd, reply, "xy")) return 0;
    return 0;
}
