// The multi-GPU launch (launch.h): the rank from --gpus or the launcher's variables, the NCCL id's
// hand-over (environment for spawned ranks, TCP on MASTER_ADDR:MASTER_PORT+1 under a launcher: the
// port itself is torchrun's own store), and spawning/reaping the ranks of --gpus N.
#include "cli/launch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/error.h"

extern char** environ;

namespace cm::cli {

namespace {

// This binary's arguments, as the kernel recorded them.
std::vector<std::string> own_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> a;
  std::string cur;
  for (char ch; f.get(ch);)
    if (ch == '\0') a.push_back(cur), cur.clear();
    else cur += ch;
  if (!cur.empty()) a.push_back(cur);
  if (a.empty()) fail("--gpus: cannot read this process's arguments (/proc/self/cmdline)");
  return a;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w <= 0) return;
    off += size_t(w);
  }
}

}  // namespace

std::string to_hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) s += d[c >> 4], s += d[c & 15];
  return s;
}

std::string from_hex(const std::string& hex, const char* what) {
  auto val = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    fail("{}: \"{}\" is not hexadecimal", what, hex.substr(0, 16));
  };
  if (hex.size() % 2) fail("{}: an odd number of hex digits", what);
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out += char(val(hex[i]) * 16 + val(hex[i + 1]));
  return out;
}

void add_launch_options(CLI::App& app, LaunchOptions& o) {
  const char* g = "Multi-GPU launch (set by torchrun-style launchers)";
  app.add_option("--rank", o.rank, "This process's rank")->envname("RANK")->group(g)->check(CLI::NonNegativeNumber);
  app.add_option("--world-size", o.world_size, "Ranks in all")->envname("WORLD_SIZE")->group(g)->check(CLI::PositiveNumber);
  app.add_option("--local-rank", o.local_rank, "This process's GPU on its host")
      ->envname("LOCAL_RANK")
      ->group(g)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", o.master_addr, "Rank 0's host")->envname("MASTER_ADDR")->group(g);
  app.add_option("--master-port", o.master_port, "Rank 0's port (the NCCL id is handed out on the next one)")
      ->envname("MASTER_PORT")
      ->group(g)
      ->check(CLI::Range(1, 65534));
  app.add_option("--nccl-id", o.nccl_id, "The NCCL id in hex (rank 0 sets it for the ranks it starts)")
      ->envname("CLAWMINE_NCCL_ID")
      ->group(g);
}

RankEnv rank_env(int gpus, const LaunchOptions& l) {
  RankEnv e;
  const int rank = l.rank, world = l.world_size, local = l.local_rank;
  if (gpus < 0 || gpus > 1024) fail("--gpus {} (1 to 1,024, or leave it out for one GPU without NCCL)", gpus);
  if (world < 0 && rank < 0) {  // no launcher: --gpus N, this process rank 0
    if (gpus == 0) return e;
    e.distributed = true;
    e.spawned_here = gpus > 1;
    e.world = gpus;
    return e;
  }
  if (world < 1 || rank < 0) fail("incomplete launch: --rank (RANK) {} and --world-size (WORLD_SIZE) {}", rank, world);
  if (rank >= world) fail("rank {} outside a world of {}", rank, world);
  if (gpus > 0 && gpus != world) fail("--gpus {} but the launcher's world size is {}", gpus, world);
  e.distributed = true;
  e.rank = rank;
  e.world = world;
  e.local_rank = local >= 0 ? local : rank;
  e.nccl_id_hex = l.nccl_id;
  e.master_addr = l.master_addr;
  e.master_port = l.master_port;
  if (e.world > 1 && e.nccl_id_hex.empty() && (e.master_addr.empty() || e.master_port <= 0))
    fail("rank {} of {}: set MASTER_ADDR and MASTER_PORT (rank 0 hands the NCCL id out on MASTER_PORT+1)", rank,
         world);
  return e;
}

std::string share_nccl_id(const RankEnv& e, const std::string& made_id, double timeout_s) {
  if (e.world == 1 || e.spawned_here) return made_id;
  if (!e.nccl_id_hex.empty()) return from_hex(e.nccl_id_hex, "--nccl-id");
  const int port = e.master_port + 1;
  if (e.rank == 0) {  // serve the id to the world-1 others
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0)
      fail("rank 0: cannot listen on port {} (MASTER_PORT+1) to hand out the NCCL id: {}", port,
           std::strerror(errno));
    std::thread([fd, n = e.world - 1, id = made_id] {
      for (int i = 0; i < n; ++i) {
        const int c = ::accept(fd, nullptr, nullptr);
        if (c < 0) break;
        write_all(c, id);
        ::close(c);
      }
      ::close(fd);
    }).detach();
    return made_id;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(e.master_addr.c_str(), std::to_string(port).c_str(), &hints, &res) == 0 && res) {
      const int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
      if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        std::string id(made_id.size(), '\0');
        size_t got = 0;
        while (got < id.size()) {
          const ssize_t r = ::recv(fd, &id[got], id.size() - got, 0);
          if (r <= 0) break;
          got += size_t(r);
        }
        ::close(fd);
        ::freeaddrinfo(res);
        if (got == id.size()) return id;
        fail("rank {}: rank 0 at {}:{} sent {} of the NCCL id's {} bytes", e.rank, e.master_addr, port, got,
             id.size());
      }
      if (fd >= 0) ::close(fd);
      ::freeaddrinfo(res);
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
      fail("rank {}: no NCCL id from rank 0 at {}:{} within {:.0f} s", e.rank, e.master_addr, port, timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::vector<pid_t> spawn_ranks(const RankEnv& e, const std::string& nccl_id) {
  const std::vector<std::string> args = own_argv();
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<pid_t> pids;
  for (int r = 1; r < e.world; ++r) {
    std::vector<std::string> env;
    for (char** p = environ; *p; ++p) {
      const std::string kv = *p;
      if (kv.rfind("RANK=", 0) && kv.rfind("WORLD_SIZE=", 0) && kv.rfind("LOCAL_RANK=", 0) &&
          kv.rfind("CLAWMINE_NCCL_ID=", 0))
        env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(e.world));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("CLAWMINE_NCCL_ID=" + to_hex(nccl_id));
    std::vector<char*> envp;
    for (std::string& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
      for (pid_t q : pids) ::kill(q, SIGTERM);
      fail("--gpus {}: cannot start rank {}: {}", e.world, r, std::strerror(errno));
    }
    pids.push_back(pid);
  }
  return pids;
}

int wait_ranks(const std::vector<pid_t>& pids) {
  int first = 0;
  for (pid_t p : pids) {
    int st = 0;
    if (::waitpid(p, &st, 0) < 0) continue;
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (code && !first) first = code;
  }
  return first;
}

}  // namespace cm::cli
