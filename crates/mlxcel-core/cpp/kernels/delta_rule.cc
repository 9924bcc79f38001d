// The gated delta rule and its convolution over all heads (or rows) of a run: the work shared
// out over the kernel pool, the path chosen by instruction set, and the bridge's entry points.
#include "mlxcel-core/cpp/kernels/delta_rule.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlxcel-core/cpp/bridge.h"
#include "mlxcel-core/cpp/kernels/pool.h"

namespace mlxcel {
namespace kernels {

int64_t delta_chunk_scratch(int dk, int dv) {
  const int64_t c = kDeltaChunk;
  return 3 * c * c + c * dk + static_cast<int64_t>(dk) * dv + c * (dv + dk) + 3 * c;
}

namespace {

Isa path(uint8_t isa) { return std::min(static_cast<Isa>(std::min<uint8_t>(isa, 2)), best_isa()); }

// Rows of the convolution per task: enough work to cover a task hand-out.
constexpr int kConvRows = 8;

}  // namespace
}  // namespace kernels

void kernels_delta_rule(rust::Slice<const float> q, rust::Slice<const float> k,
                        rust::Slice<const float> v, rust::Slice<const float> log_decay,
                        rust::Slice<const float> beta, rust::Slice<float> state,
                        rust::Slice<float> y, int32_t key_heads, int32_t value_heads,
                        int32_t key_dim, int32_t value_dim, bool tiled, int64_t position,
                        bool chunked, uint8_t isa, int32_t threads) {
  using namespace kernels;
  if (key_heads <= 0 || value_heads <= 0 || key_dim <= 0 || value_dim <= 0 ||
      value_heads % key_heads != 0)
    throw std::invalid_argument("delta rule: bad head sizes");
  const size_t heads = value_heads;
  const size_t n = beta.size() / heads;
  const size_t key = static_cast<size_t>(key_heads) * key_dim;
  const size_t value = heads * value_dim;
  if (beta.size() != n * heads || log_decay.size() != beta.size() || q.size() != n * key ||
      k.size() != q.size() || v.size() != n * value || y.size() != n * value ||
      state.size() != value * key_dim)
    throw std::invalid_argument("delta rule: the slices' lengths disagree with the shape (" +
                                std::to_string(n) + " tokens)");
  if (n == 0) return;
  const Isa p = path(isa);
  const int per = value_heads / key_heads;
  const int64_t scratch = delta_chunk_scratch(key_dim, value_dim);
  // A decode step's heads are small tasks: one thread unless the run is long enough to pay the
  // hand-out (as the matmuls, the pool's workers are usually spinning by then).
  const int workers = n * value * key_dim < (1u << 16) ? 1 : threads;
  parallel_for(workers, value_heads, [&](int hd) {
    const int kh = tiled ? hd % key_heads : hd / per;
    const DeltaHead h{key_dim,
                      value_dim,
                      q.data() + static_cast<int64_t>(kh) * key_dim,
                      k.data() + static_cast<int64_t>(kh) * key_dim,
                      static_cast<int64_t>(key),
                      v.data() + static_cast<int64_t>(hd) * value_dim,
                      static_cast<int64_t>(value),
                      log_decay.data() + hd,
                      beta.data() + hd,
                      value_heads,
                      y.data() + static_cast<int64_t>(hd) * value_dim,
                      static_cast<int64_t>(value),
                      state.data() + static_cast<int64_t>(hd) * value_dim * key_dim};
    if (!chunked) {
      if (p == Isa::Avx512) return delta_recurrent_avx512(h, static_cast<int>(n));
      if (p == Isa::Avx2) return delta_recurrent_avx2(h, static_cast<int>(n));
      return delta_recurrent_scalar(h, static_cast<int>(n));
    }
    thread_local std::vector<float> buffer;
    if (static_cast<int64_t>(buffer.size()) < scratch) buffer.resize(scratch);
    if (p == Isa::Avx512) return delta_chunked_avx512(h, static_cast<int>(n), position, buffer.data());
    if (p == Isa::Avx2) return delta_chunked_avx2(h, static_cast<int>(n), position, buffer.data());
    delta_chunked_scalar(h, static_cast<int>(n), position, buffer.data());
  });
}

void kernels_causal_conv_silu(rust::Slice<const float> x, rust::Slice<const float> tail,
                              rust::Slice<const float> weight, int32_t channels, int32_t taps,
                              rust::Slice<float> out, uint8_t isa, int32_t threads) {
  using namespace kernels;
  if (channels <= 0 || taps <= 0) throw std::invalid_argument("causal conv: bad sizes");
  const size_t c = channels;
  const size_t n = x.size() / c;
  if (x.size() != n * c || out.size() != x.size() || weight.size() != c * taps ||
      tail.size() != (taps - 1) * c)
    throw std::invalid_argument("causal conv: the slices' lengths disagree with the shape");
  if (n == 0) return;
  // The taps as rows, [taps, channels].
  std::vector<float> w(weight.size());
  for (size_t ch = 0; ch < c; ++ch)
    for (int j = 0; j < taps; ++j) w[j * c + ch] = weight[ch * taps + j];
  const Isa p = path(isa);
  const int tasks = static_cast<int>((n + kConvRows - 1) / kConvRows);
  parallel_for(threads, tasks, [&](int task) {
    const int t0 = task * kConvRows;
    const int t1 = std::min<int>(static_cast<int>(n), t0 + kConvRows);
    auto run = p == Isa::Avx512 ? delta_conv_avx512 : p == Isa::Avx2 ? delta_conv_avx2 : delta_conv_scalar;
    run(x.data(), tail.data(), w.data(), channels, taps, t0, t1, out.data());
  });
}

}  // namespace mlxcel
