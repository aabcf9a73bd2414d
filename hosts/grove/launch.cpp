// `grove train --nproc N`: a local launcher in torchrun's manner. It starts N copies of this program
// with RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, forwards
// SIGINT and SIGTERM to them (each rank checkpoints and stops at the same step), and if one rank
// fails, ends the others, which would otherwise wait in a collective until its timeout.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "grove/error.hpp"
#include "grove/loopback_port.hpp"

namespace grove::cli {

namespace {

// the ranks' pids, 0 once reaped: a reaped pid may already belong to another process
std::vector<pid_t> g_children;
volatile sig_atomic_t g_forwarded = 0;  // the SIGINT or SIGTERM passed on to the ranks, if any
extern "C" void forward_signal(int signal) {
    g_forwarded = signal;
    for (pid_t pid : g_children)
        if (pid > 0) ::kill(pid, signal);
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// the rank of a child just reaped, whose pid is then forgotten
size_t reaped(pid_t pid) {
    const auto child = std::find(g_children.begin(), g_children.end(), pid);
    if (child == g_children.end()) return g_children.size();  // not a rank (none is expected)
    *child = 0;
    return size_t(child - g_children.begin());
}

struct RankExit {
    size_t rank;
    int status;  // as waitpid gives it
};

// "exit 4" or "killed by signal 9, Killed"
std::string exit_text(int status) {
    if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
    return "killed by signal " + std::to_string(WTERMSIG(status)) + ", " + ::strsignal(WTERMSIG(status));
}

// A rank whose peer died fails in its next collective, so it may exit, and be reaped, before the
// rank that caused it. Such a rank exits with an error or aborts (SIGABRT: an unhandled error, NCCL's
// watchdog); one killed by another signal (SIGKILL, SIGSEGV, ...) did not end itself: it comes first.
void order_by_likely_cause(std::vector<RankExit>& failed) {
    std::stable_partition(failed.begin(), failed.end(),
                          [](const RankExit& e) { return WIFSIGNALED(e.status) && WTERMSIG(e.status) != SIGABRT; });
}

std::string failure_report(const std::vector<RankExit>& failed, int nproc) {
    std::string report = "grove: rank " + std::to_string(failed.front().rank) + " of " + std::to_string(nproc) + " failed (" +
                         exit_text(failed.front().status) + ")";
    for (size_t i = 1; i < failed.size(); ++i)
        report += "; rank " + std::to_string(failed[i].rank) + " also failed (" + exit_text(failed[i].status) +
                  "), perhaps in consequence";
    return report + "; the other ranks were stopped\n";
}

}  // namespace

int launch_local_processes(int nproc, const std::vector<std::string>& command) {
    if (std::getenv("RANK")) throw Error(ErrorKind::usage, "--nproc starts the ranks itself; do not combine it with RANK set");
    int port = free_loopback_port();
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    std::string threads = std::to_string(std::max(1u, cores / unsigned(nproc)));  // the cores shared out, as torchrun's 1
    std::vector<std::string> argv_storage{"/proc/self/exe"};
    argv_storage.insert(argv_storage.end(), command.begin(), command.end());
    auto previous_int = ::signal(SIGINT, forward_signal), previous_term = ::signal(SIGTERM, forward_signal);
    for (int rank = 0; rank < nproc; ++rank) {
        pid_t pid = ::fork();
        if (pid < 0) throw Error(ErrorKind::runtime, std::string("--nproc: fork failed: ") + std::strerror(errno));
        if (pid == 0) {
            ::setenv("RANK", std::to_string(rank).c_str(), 1);
            ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
            ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
            ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
            ::setenv("MASTER_ADDR", "127.0.0.1", 1);
            ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
            ::setenv("OMP_NUM_THREADS", threads.c_str(), 0);
            std::vector<char*> argv;
            for (auto& a : argv_storage) argv.push_back(a.data());
            argv.push_back(nullptr);
            ::execv("/proc/self/exe", argv.data());
            std::cerr << "grove: --nproc: could not start rank " << rank << ": " << std::strerror(errno) << "\n";
            ::_exit(127);
        }
        g_children.push_back(pid);
    }
    int worst = 0, stopped = 0;
    size_t running = g_children.size();
    while (running > 0) {
        int status = 0;
        pid_t pid = ::waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;
        }
        --running;
        const size_t rank = reaped(pid);
        if (exit_code(status) == 0 || worst != 0) continue;
        if (g_forwarded != 0 && exit_code(status) == 128 + g_forwarded) {  // checkpointed and stopped, as asked:
            stopped = exit_code(status);                                   // the others finish theirs
            continue;
        }
        // the first failure: whatever else has already failed, then the rest stopped, as they would
        // wait for the failed ranks until the collective's timeout
        std::vector<RankExit> failed{{rank, status}};
        while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
            --running;
            const size_t other = reaped(pid);
            if (exit_code(status) != 0) failed.push_back({other, status});
        }
        for (pid_t other : g_children)
            if (other > 0) ::kill(other, SIGKILL);
        order_by_likely_cause(failed);
        worst = exit_code(failed.front().status);
        std::cerr << failure_report(failed, nproc);
    }
    ::signal(SIGINT, previous_int);
    ::signal(SIGTERM, previous_term);
    g_children.clear();
    g_forwarded = 0;
    return worst != 0 ? worst : stopped;
}

}  // namespace grove::cli
