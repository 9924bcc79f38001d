// MLX's distributed layer (mlx/distributed): the ring backend's group, and send/recv of arrays
// between ranks, for pipeline-parallel stages (src/distributed.rs).
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlxcel-core/cpp/bridge.h"

#include "mlx/distributed/distributed.h"
#include "mlx/distributed/ops.h"

namespace mx = mlx::core;
namespace dist = mlx::core::distributed;

namespace mlxcel {

// Defined in array.cc.
mx::Dtype dtype_from_code(uint8_t code);
mx::Shape to_shape(rust::Slice<const int32_t> dims);
std::unique_ptr<MlxArray> wrap(mx::array a);

namespace {
// The process's one group: set once by dist_init_ring, read by every send and recv. Callers
// hold mlxcel's MLX lock (src/sys.rs), so no two threads touch it at once.
std::optional<dist::Group>& world() {
  static std::optional<dist::Group> group;
  return group;
}

const dist::Group& group_or_throw() {
  if (!world()) throw std::runtime_error("mlxcel: the distributed group is not initialised");
  return *world();
}

// The ring's own connections to its neighbours: the connected stream sockets that joining the
// ring opened. Written once by dist_init_ring, before any dist_wait_readable reads it.
std::vector<int>& ring_sockets() {
  static std::vector<int> fds;
  return fds;
}

// This process's connected stream sockets (listening ones excluded), read from /proc/self/fd.
std::vector<int> connected_stream_sockets() {
  std::vector<int> out;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (struct dirent* entry = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int type = 0, listening = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
        type != SOCK_STREAM) {
      continue;
    }
    len = sizeof(listening);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
        listening != 0) {
      continue;
    }
    struct sockaddr_storage peer;
    socklen_t peer_len = sizeof(peer);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<struct sockaddr*>(&peer),
                    &peer_len) != 0) {
      continue;
    }
    if (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) continue;
    out.push_back(static_cast<int>(fd));
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

// MLX's ring backend reads its hosts and this process's rank from MLX_HOSTFILE and MLX_RANK
// only; setting them here (before init, under the MLX lock) is how a hostfile and rank given on
// the command line reach it. An empty `hostfile` keeps the environment's (mlx.launch's).
rust::Vec<int32_t> dist_init_ring(rust::Str hostfile, int32_t rank) {
  if (hostfile.size() > 0) {
    std::string file(hostfile.data(), hostfile.size());
    std::string r = std::to_string(rank);
    if (setenv("MLX_HOSTFILE", file.c_str(), 1) != 0 || setenv("MLX_RANK", r.c_str(), 1) != 0) {
      throw std::runtime_error("mlxcel: cannot set MLX_HOSTFILE/MLX_RANK for MLX's ring backend");
    }
  }
  std::vector<int> before = connected_stream_sockets();
  dist::Group group = dist::init(true, "ring");
  world() = group;
  std::vector<int> after = connected_stream_sockets();
  std::vector<int>& ring = ring_sockets();
  ring.clear();
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(),
                      std::back_inserter(ring));
  rust::Vec<int32_t> out;
  out.push_back(group.rank());
  out.push_back(group.size());
  return out;
}

std::unique_ptr<MlxArray> dist_send(const MlxArray& a, int32_t dst) {
  return wrap(dist::send(a.inner, dst, group_or_throw(), mlxcel_stream()));
}

std::unique_ptr<MlxArray> dist_recv(rust::Slice<const int32_t> shape, uint8_t dtype,
                                    int32_t src) {
  return wrap(
      dist::recv(to_shape(shape), dtype_from_code(dtype), src, group_or_throw(), mlxcel_stream()));
}

// A silent partition (a host gone or a link cut: no FIN, no RST) leaves a socket open and quiet.
// TCP's keepalive probes the idle connection every second after one idle second and drops it
// after about `timeout_ms` of unanswered probes; TCP_USER_TIMEOUT drops it when sent bytes stay
// unacknowledged for `timeout_ms`. Either way the socket then fails, and the wait below or MLX's recv reports
// the peer lost. Returns how many of the ring's sockets took the settings.
int32_t dist_set_link_timeout(int32_t timeout_ms) {
  int32_t set = 0;
  const int on = 1, idle = 1, interval = 1;
  const int probes = std::max(1, timeout_ms / 1000 - idle);
  const unsigned int user_timeout = static_cast<unsigned int>(std::max(timeout_ms, 1));
  for (int fd : ring_sockets()) {
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout)) != 0) {
      throw std::runtime_error(std::string("mlxcel: setting the ring's link timeout: ") +
                               std::strerror(errno));
    }
    ++set;
  }
  return set;
}

// MLX's ring reads a pending recv by polling its non-blocking socket in a loop, so a rank that
// posts a recv before its peer has sent keeps a core busy for the whole wait (on a machine that
// runs two ranks, the core the computing rank needs). Callers wait here first, asleep in poll(2),
// until one of the ring's sockets has bytes to read; the recv they post then finds its data.
// Returns 1 when bytes are waiting and 0 after `timeout_ms` (negative: no limit); throws when a
// peer closed its connection or the socket failed, since the pipeline cannot go on without it.
namespace {
using Clock = std::chrono::steady_clock;

// How long a closed peer socket is tolerated while another of the ring's sockets may still
// bring bytes: when a pipeline ends, rank 0 closes its sockets as soon as it has sent the end,
// and a rank further down the ring, still waiting for that end from its other neighbour, sees
// rank 0's socket close first. A peer that died is reported this much later than its close.
constexpr auto kClosedGrace = std::chrono::milliseconds(1000);

// When each ring socket was first seen closed (or failed), with the error to report.
std::mutex closed_mutex;
std::map<int, std::pair<Clock::time_point, std::string>>& closed_sockets() {
  static std::map<int, std::pair<Clock::time_point, std::string>> closed;
  return closed;
}
}  // namespace

int32_t dist_wait_readable(int32_t timeout_ms) {
  const std::vector<int>& ring = ring_sockets();
  if (ring.empty()) return 1;
  const Clock::time_point start = Clock::now();
  for (;;) {
    // The sockets still open; the earliest close among the others, and its error.
    std::vector<struct pollfd> fds;
    std::optional<std::pair<Clock::time_point, std::string>> first_closed;
    {
      std::lock_guard<std::mutex> lock(closed_mutex);
      for (int fd : ring) {
        auto closed = closed_sockets().find(fd);
        if (closed == closed_sockets().end()) {
          fds.push_back({fd, POLLIN, 0});
        } else if (!first_closed || closed->second.first < first_closed->first) {
          first_closed = closed->second;
        }
      }
    }
    const Clock::time_point now = Clock::now();
    if (first_closed && (fds.empty() || now - first_closed->first >= kClosedGrace)) {
      throw std::runtime_error(first_closed->second);
    }
    int wait = timeout_ms;
    if (timeout_ms >= 0) {
      auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
      wait = spent >= timeout_ms ? 0 : static_cast<int>(timeout_ms - spent);
    }
    if (first_closed) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      kClosedGrace - (now - first_closed->first))
                      .count() +
                  1;
      if (wait < 0 || wait > left) wait = static_cast<int>(left);
    }
    int ready = poll(fds.data(), fds.size(), wait);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      throw std::runtime_error(std::string("mlxcel: waiting on the ring's sockets: ") +
                               std::strerror(errno));
    }
    if (ready == 0) {
      // The caller's time is up (a socket seen closed is judged again on its next call), or
      // only the grace ran out: judged at the top.
      if (timeout_ms >= 0 && Clock::now() - start >= std::chrono::milliseconds(timeout_ms)) {
        return 0;
      }
      continue;
    }
    for (const struct pollfd& p : fds) {
      if (p.revents == 0) continue;
      char byte;
      ssize_t n = recv(p.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return 1;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      std::string error =
          n == 0 ? std::string("[ring] connection to a peer was lost (it closed its socket)")
                 : std::string("[ring] connection to a peer was lost: ") + std::strerror(errno);
      std::lock_guard<std::mutex> lock(closed_mutex);
      closed_sockets().emplace(p.fd, std::make_pair(Clock::now(), error));
    }
  }
}

}  // namespace mlxcel
