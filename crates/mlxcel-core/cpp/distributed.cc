// MLX's distributed layer (mlx/distributed): the ring backend's group, and send/recv of arrays
// between ranks, for pipeline-parallel stages (src/distributed.rs).
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

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
  dist::Group group = dist::init(true, "ring");
  world() = group;
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

}  // namespace mlxcel
