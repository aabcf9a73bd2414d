// Environment "command": each tool call runs an external program, so a tool can be written in Python
// or any language. The model writes
//     <tool>some input</tool>
// (the closing tag ends its turn); the program gets "some input" on stdin, and what it prints on
// stdout comes back as the observation:
//     <output>what it printed</output>
//
// How the program runs:
//   - argv is the program and its arguments, run directly (execve), never through a shell. A
//     program without a '/' is looked up on PATH once, when the run starts; a missing one is a
//     configuration error.
//   - It runs in its own process group, in `working_dir` (default: the folder grove runs in), with
//     an environment holding only PATH, HOME (= working_dir), LANG and LC_ALL.
//   - Limits: `timeout_seconds` of wall time (then the whole process group is killed), `cpu_seconds`
//     (RLIMIT_CPU), `memory_mb` of address space (RLIMIT_AS), and `max_output_bytes` of stdout kept
//     (the rest is read and dropped, and the observation says it was cut). stderr is discarded.
//   - A time-out, a crash, a non-zero exit or an empty call gives an "error: ..." observation and
//     counts as a failed call; the run goes on. A turn without a call ends the episode.
// What it does NOT isolate: the file system, the network, other processes of the same user. It is
// a convenience for trusted tools, not a sandbox; run untrusted code inside a container or VM.
#include <grove/plugin.hpp>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace {
using grove::sdk::config_error;

// The program's path: argv[0] itself when it holds a '/', else the first executable on PATH.
std::string resolve_program(const std::string& name) {
    auto executable = [](const std::string& path) { return access(path.c_str(), X_OK) == 0; };
    if (name.find('/') != std::string::npos) return executable(name) ? name : "";
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin:/bin";
    for (size_t start = 0; start <= dirs.size();) {
        size_t end = dirs.find(':', start);
        if (end == std::string::npos) end = dirs.size();
        std::string candidate = dirs.substr(start, end - start) + "/" + name;
        if (end > start && executable(candidate)) return candidate;
        start = end + 1;
    }
    return "";
}

struct RunResult {
    std::string output;  // stdout, at most max_output_bytes
    bool cut = false, timed_out = false, started = true;
    int status = 0;  // waitpid's
};

class Command {
public:
    explicit Command(const grove::sdk::Config& c)
            : argv_(c.get_strings("argv", {})),
              open_(c.get_string("open_tag", "<tool>")),
              close_(c.get_string("close_tag", "</tool>")),
              result_open_(c.get_string("result_open_tag", "<output>")),
              result_close_(c.get_string("result_close_tag", "</output>")),
              working_dir_(c.get_string("working_dir", ".")),
              timeout_seconds_(c.get_float("timeout_seconds", 5.0)),
              cpu_seconds_(c.get_int("cpu_seconds", 5)),
              memory_mb_(c.get_int("memory_mb", 1024)),
              max_output_bytes_(c.get_int("max_output_bytes", 4096)) {
        if (argv_.empty()) throw config_error("argv", "needs the program to run, e.g. [\"python3\", \"tool.py\"]");
        program_ = resolve_program(argv_[0]);
        if (program_.empty())
            throw config_error("argv", "program '" + argv_[0] + "' is not an executable file" +
                                           (argv_[0].find('/') == std::string::npos ? " on PATH" : ""));
        struct stat st{};
        if (stat(working_dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
            throw config_error("working_dir", "'" + working_dir_ + "' is not a folder");
        if (open_.empty() || close_.empty()) throw config_error(open_.empty() ? "open_tag" : "close_tag", "must not be empty");
        if (!(timeout_seconds_ > 0)) throw config_error("timeout_seconds", "must be > 0");
        if (cpu_seconds_ < 1 || memory_mb_ < 16 || max_output_bytes_ < 1)
            throw config_error(cpu_seconds_ < 1  ? "cpu_seconds"
                               : memory_mb_ < 16 ? "memory_mb"
                                                 : "max_output_bytes",
                               "is too small");
        stops_[0] = close_.c_str();
        for (const char* name : {"PATH", "LANG", "LC_ALL"}) {
            const char* value = std::getenv(name);
            environment_.push_back(std::string(name) + "=" + (value ? value : name[0] == 'P' ? "/usr/bin:/bin" : "C.UTF-8"));
        }
        environment_.push_back("HOME=" + working_dir_);
    }

    const char* const* stop_strings() const { return stops_; }

    void step(const grove_environment_batch& batch, grove_environment_output& out) const {
        grove::sdk::answer_tool_calls(batch, out, open_, close_, [&](std::string_view input, bool& failed) {
            return result_open_ + call(std::string(input), failed) + result_close_;
        });
    }

private:
    std::string call(const std::string& input, bool& failed) const {
        RunResult r = run(input);
        failed = true;
        if (!r.started) return "error: the tool could not be started";
        if (r.timed_out) return "error: timed out after " + std::to_string(timeout_seconds_) + " s";
        if (WIFSIGNALED(r.status)) return "error: the tool was killed by signal " + std::to_string(WTERMSIG(r.status));
        if (WEXITSTATUS(r.status) != 0) return "error: the tool exited with status " + std::to_string(WEXITSTATUS(r.status));
        failed = false;
        return r.output + (r.cut ? "[output cut at " + std::to_string(max_output_bytes_) + " bytes]" : "");
    }

    // fork + execve with pipes; only async-signal-safe calls between fork and exec
    RunResult run(const std::string& input) const {
        RunResult r;
        std::vector<char*> argv, envp;
        for (const auto& a : argv_) argv.push_back(const_cast<char*>(a.c_str()));
        argv[0] = const_cast<char*>(program_.c_str());
        argv.push_back(nullptr);
        for (const auto& e : environment_) envp.push_back(const_cast<char*>(e.c_str()));
        envp.push_back(nullptr);
        int in[2], out[2];
        if (pipe2(in, O_CLOEXEC) != 0) return r.started = false, r;
        if (pipe2(out, O_CLOEXEC) != 0) {
            close(in[0]), close(in[1]);
            return r.started = false, r;
        }
        const rlim_t cpu = rlim_t(cpu_seconds_), memory = rlim_t(memory_mb_) << 20;
        const pid_t pid = fork();
        if (pid == 0) {
            setpgid(0, 0);
            const struct rlimit cpu_limit{cpu, cpu + 1}, memory_limit{memory, memory};
            setrlimit(RLIMIT_CPU, &cpu_limit);
            setrlimit(RLIMIT_AS, &memory_limit);
            int null = open("/dev/null", O_WRONLY);
            if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || null < 0 || dup2(null, 2) < 0 || chdir(working_dir_.c_str()) != 0)
                _exit(127);
            execve(argv[0], argv.data(), envp.data());
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        if (pid < 0) {
            close(in[1]), close(out[0]);
            return r.started = false, r;
        }
        setpgid(pid, pid);  // also from here, so the group exists before any kill
        write_input(in[1], input);
        close(in[1]);
        read_output(out[0], pid, r);
        close(out[0]);
        return r;
    }

    // The call goes to stdin without blocking (it is small; a tool that never reads it loses it).
    // A tool that already exited would raise SIGPIPE: it is blocked in this thread and consumed,
    // so grove's own handling of SIGPIPE stays as it was.
    static void write_input(int fd, const std::string& input) {
        sigset_t pipe_signal, previous;
        sigemptyset(&pipe_signal);
        sigaddset(&pipe_signal, SIGPIPE);
        pthread_sigmask(SIG_BLOCK, &pipe_signal, &previous);
        fcntl(fd, F_SETFL, O_NONBLOCK);
        const bool broken = write(fd, input.data(), input.size()) < 0 && errno == EPIPE;
        if (broken) {
            const timespec now{0, 0};
            sigtimedwait(&pipe_signal, nullptr, &now);
        }
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    }

    void read_output(int fd, pid_t pid, RunResult& r) const {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds_);
        char buffer[4096];
        for (;;) {
            const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
            if (left <= 0) {
                r.timed_out = true;
                break;
            }
            pollfd p{fd, POLLIN, 0};
            const int ready = poll(&p, 1, int(left * 1000) + 1);
            if (ready < 0 && errno == EINTR) continue;
            if (ready <= 0) continue;  // the deadline check above decides
            const ssize_t n = read(fd, buffer, sizeof buffer);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;  // end of output
            const size_t room = size_t(max_output_bytes_) - std::min(r.output.size(), size_t(max_output_bytes_));
            r.output.append(buffer, std::min(size_t(n), room));
            r.cut = r.cut || size_t(n) > room;
        }
        if (r.timed_out) kill(-pid, SIGKILL);
        // the output ended: the tool has a moment to exit before its group is killed
        for (int waited = 0; waitpid(pid, &r.status, WNOHANG) == 0; ++waited) {
            if (waited == 200 || r.timed_out) {
                kill(-pid, SIGKILL);
                waitpid(pid, &r.status, 0);
                break;
            }
            usleep(5000);
        }
        kill(-pid, SIGKILL);  // anything it left running in its group
    }

    std::vector<std::string> argv_;
    std::string program_, open_, close_, result_open_, result_close_, working_dir_;
    double timeout_seconds_;
    int64_t cpu_seconds_, memory_mb_, max_output_bytes_;
    std::vector<std::string> environment_;
    const char* stops_[2] = {nullptr, nullptr};
};

const grove_config_key kKeys[] = {
    grove::sdk::required_key("argv", GROVE_VALUE_STRING_ARRAY,
                             "the program and its arguments, e.g. [\"python3\", \"tool.py\"]"),
    grove::sdk::key("open_tag", GROVE_VALUE_STRING, "\"<tool>\"", "text that opens a call"),
    grove::sdk::key("close_tag", GROVE_VALUE_STRING, "\"</tool>\"", "text that closes a call; it ends the model's turn"),
    grove::sdk::key("result_open_tag", GROVE_VALUE_STRING, "\"<output>\"", "text before the program's output"),
    grove::sdk::key("result_close_tag", GROVE_VALUE_STRING, "\"</output>\"", "text after it"),
    grove::sdk::key("working_dir", GROVE_VALUE_STRING, "\".\"", "the folder the program runs in (also its HOME)"),
    grove::sdk::key("timeout_seconds", GROVE_VALUE_FLOAT, "5.0", "wall time per call; then its process group is killed"),
    grove::sdk::key("cpu_seconds", GROVE_VALUE_INT, "5", "CPU time per call (RLIMIT_CPU)"),
    grove::sdk::key("memory_mb", GROVE_VALUE_INT, "1024", "address space per call (RLIMIT_AS)"),
    grove::sdk::key("max_output_bytes", GROVE_VALUE_INT, "4096", "stdout kept per call; the rest is dropped"),
};
constexpr auto kCommand = grove::sdk::environment_descriptor<Command>(
    "command", "1.0.0", "runs a program for each <tool>input</tool> call; its stdout is the observation", 0, kKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kCommand)
