// The C++ half of the mlxcel-core cxx bridge (src/sys.rs declares the Rust half).
//
// Rules for this layer:
// - Shim functions are concrete (no templates across the bridge) and take or return only
//   `MlxArray`, `ArrayList`, scalars, slices and strings: no MLX type reaches Rust.
// - Every function that can throw is declared `Result<...>` on the Rust side, so cxx
//   catches the exception and Rust receives MLX's message. The `trycatch` below also
//   catches non-std exceptions, so nothing unwinds into Rust.
// - Dtypes cross as `uint8_t` codes; the table lives in dtype_code()/dtype_from_code()
//   in array.cc and must match `Dtype` in src/dtype.rs.
// - Custom CPU kernels (MLX `Primitive` subclasses whose eval_cpu dispatches through
//   cpu::get_command_encoder(stream()).dispatch(...)) go in cpp/kernels/, with their
//   shims declared here.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"
#include "rust/cxx.h"

namespace rust::behavior {
// Replaces cxx's default exception translation so that exceptions not derived from
// std::exception also become a Rust error instead of std::terminate.
template <typename Try, typename Fail>
static void trycatch(Try&& func, Fail&& fail) noexcept try {
  func();
} catch (const std::exception& e) {
  fail(e.what());
} catch (...) {
  fail("unknown C++ exception thrown by MLX");
}
}  // namespace rust::behavior

namespace mlxcel {

// One MLX array (a refcounted handle to a graph node).
struct MlxArray {
  mlx::core::array inner;
};

// An ordered list of arrays, for ops that take or return several.
struct ArrayList {
  std::vector<mlx::core::array> items;
};

// The one stream every mlxcel op runs on (array.cc). MLX's default streams are per thread:
// a graph built on one thread and evaluated on another fails with "There is no Stream(cpu, N)
// in current thread". A stream from new_thread_unsafe_stream may be used from any thread;
// mlxcel provides the missing thread safety by serialising every call (src/sys.rs).
mlx::core::Stream mlxcel_stream();

// Construction, metadata, evaluation and read-back (array.cc).
std::unique_ptr<MlxArray> array_from_bytes(rust::Slice<const uint8_t> bytes,
                                           rust::Slice<const int32_t> shape, uint8_t dtype);
// A new array of `shape` whose bytes are not yet written, and the address of its bytes: the
// caller writes every byte before the array is read (quantized.rs, the int8 layout written
// straight from GGUF blocks).
std::unique_ptr<MlxArray> array_alloc(rust::Slice<const int32_t> shape, uint8_t dtype);
// Keeps a mapped file alive (src/sys.rs): dropped when the last array over it is destroyed.
struct MappingKeep;
std::unique_ptr<MlxArray> array_over_mapping(size_t address, rust::Slice<const int32_t> shape,
                                             uint8_t dtype, rust::Box<MappingKeep> keep);
size_t array_data_address(const MlxArray& a);
std::unique_ptr<MlxArray> array_deep_copy(const MlxArray& a);
std::unique_ptr<MlxArray> array_clone(const MlxArray& a);
rust::Vec<int32_t> array_shape(const MlxArray& a);
uint8_t array_dtype(const MlxArray& a);
void array_eval(const MlxArray& a);
void array_list_eval(const ArrayList& list);
void array_read_f32(const MlxArray& a, rust::Slice<float> out);
std::unique_ptr<MlxArray> array_readable_f32(const MlxArray& a);
void array_read_f32_at(const MlxArray& a, size_t offset, rust::Slice<float> out);
void array_read_u32(const MlxArray& a, rust::Slice<uint32_t> out);
void array_read_i32(const MlxArray& a, rust::Slice<int32_t> out);

std::unique_ptr<ArrayList> array_list_new();
void array_list_push(ArrayList& list, const MlxArray& a);
size_t array_list_len(const ArrayList& list);
std::unique_ptr<MlxArray> array_list_get(const ArrayList& list, size_t index);

// Device, memory and version knobs (array.cc).
void set_default_device_cpu();
size_t set_memory_limit(size_t bytes);
// MLX's allocator: bytes in live buffers, bytes freed but kept for reuse; returning those
// (and the C heap's free pages) to the system.
size_t mlx_active_memory();
size_t mlx_cache_memory();
void mlx_release_unused_memory();
bool heap_keep_freed(size_t mmap_threshold, size_t trim_threshold);
rust::String mlx_version();

// Shape and layout ops (ops.cc).
std::unique_ptr<MlxArray> zeros(rust::Slice<const int32_t> shape, uint8_t dtype);
std::unique_ptr<MlxArray> reshape(const MlxArray& a, rust::Slice<const int32_t> shape);
std::unique_ptr<MlxArray> transpose(const MlxArray& a, rust::Slice<const int32_t> axes);
std::unique_ptr<MlxArray> swapaxes(const MlxArray& a, int32_t axis1, int32_t axis2);
std::unique_ptr<MlxArray> astype(const MlxArray& a, uint8_t dtype);
std::unique_ptr<MlxArray> take(const MlxArray& a, const MlxArray& indices, int32_t axis);
std::unique_ptr<MlxArray> concatenate(const ArrayList& list, int32_t axis);
std::unique_ptr<MlxArray> slice(const MlxArray& a, rust::Slice<const int32_t> start,
                                rust::Slice<const int32_t> stop,
                                rust::Slice<const int32_t> strides);
std::unique_ptr<MlxArray> slice_update(const MlxArray& src, const MlxArray& update,
                                       rust::Slice<const int32_t> start,
                                       rust::Slice<const int32_t> stop,
                                       rust::Slice<const int32_t> strides);

// Arithmetic (ops.cc).
std::unique_ptr<MlxArray> add(const MlxArray& a, const MlxArray& b);
std::unique_ptr<MlxArray> subtract(const MlxArray& a, const MlxArray& b);
std::unique_ptr<MlxArray> multiply(const MlxArray& a, const MlxArray& b);
std::unique_ptr<MlxArray> divide(const MlxArray& a, const MlxArray& b);
std::unique_ptr<MlxArray> matmul(const MlxArray& a, const MlxArray& b);
std::unique_ptr<MlxArray> silu(const MlxArray& a);
std::unique_ptr<MlxArray> tanh(const MlxArray& a);
std::unique_ptr<MlxArray> gelu_tanh(const MlxArray& a);
std::unique_ptr<MlxArray> clamped_swiglu(const MlxArray& gate, const MlxArray& up, float alpha,
                                         float limit);
std::unique_ptr<MlxArray> softmax(const MlxArray& a, int32_t axis, bool precise);
std::unique_ptr<MlxArray> argmax(const MlxArray& a, int32_t axis, bool keepdims);

// mlx::core::fast (fast.cc).
std::unique_ptr<MlxArray> rms_norm(const MlxArray& x, const MlxArray& weight, float eps);
std::unique_ptr<MlxArray> rope(const MlxArray& x, int32_t dims, bool traditional, float base,
                               float scale, int32_t offset);
std::unique_ptr<MlxArray> rope_with_freqs(const MlxArray& x, int32_t dims, bool traditional,
                                          float scale, int32_t offset, const MlxArray& freqs);
// `sinks`: one logit per query head joining each softmax's denominator (gpt-oss), or empty.
std::unique_ptr<MlxArray> sdpa(const MlxArray& q, const MlxArray& k, const MlxArray& v,
                               float scale, bool causal, rust::Slice<const float> sinks);
std::unique_ptr<MlxArray> sdpa_with_mask(const MlxArray& q, const MlxArray& k,
                                         const MlxArray& v, float scale, const MlxArray& mask,
                                         rust::Slice<const float> sinks);

// Affine quantization (fast.cc).
std::unique_ptr<MlxArray> quantized_matmul(const MlxArray& x, const MlxArray& w,
                                           const MlxArray& scales, const MlxArray& biases,
                                           bool transpose, int32_t group_size, int32_t bits);
std::unique_ptr<MlxArray> dequantize(const MlxArray& w, const MlxArray& scales,
                                     const MlxArray& biases, int32_t group_size, int32_t bits);
std::unique_ptr<ArrayList> quantize(const MlxArray& w, int32_t group_size, int32_t bits);

// MLX's distributed layer, ring backend (distributed.cc). `dist_init_ring` joins the group
// (blocking until every rank of the hostfile is connected) and returns [rank, size]; send and
// recv are lazy ops that move an array to or from a neighbouring rank when evaluated, and throw
// "[ring] connection to a peer was lost" when the peer's socket closes.
rust::Vec<int32_t> dist_init_ring(rust::Str hostfile, int32_t rank);
std::unique_ptr<MlxArray> dist_send(const MlxArray& a, int32_t dst);
std::unique_ptr<MlxArray> dist_recv(rust::Slice<const int32_t> shape, uint8_t dtype,
                                    int32_t src);
// Sleeps until one of the ring's sockets has bytes to read (1) or `timeout_ms` passes (0;
// negative waits without limit); throws when a peer closed its connection. Touches no MLX state,
// so it is called without the MLX lock.
int32_t dist_wait_readable(int32_t timeout_ms);
// TCP keepalive (after 1 s idle, 1 s apart, dropped after about `timeout_ms`) and
// TCP_USER_TIMEOUT `timeout_ms` on the ring's sockets, so that a silent partition fails them;
// returns how many sockets took them.
int32_t dist_set_link_timeout(int32_t timeout_ms);

// mlxcel's own CPU kernels (kernels/primitive.cc). `isa`: 0 scalar, 1 AVX2, 2 AVX-512 (capped
// at what the CPU supports); `threads`: the most threads one call uses; `epilogue`: 0 none,
// 1 add `residual` (ignored otherwise), 2 SwiGLU over the two halves of each output row;
// `norm`: RMS-normalize x with `norm_weight` and `eps` first (ignored otherwise).
std::unique_ptr<MlxArray> native_quantized_matmul(const MlxArray& x, const MlxArray& w,
                                                  const MlxArray& scales, const MlxArray& biases,
                                                  int32_t group_size, int32_t bits, uint8_t layout,
                                                  uint8_t isa, int32_t threads, uint8_t epilogue,
                                                  const MlxArray& residual, bool norm,
                                                  const MlxArray& norm_weight, float eps);
std::unique_ptr<MlxArray> native_attention(const MlxArray& q, const MlxArray& k,
                                           const MlxArray& v, float scale, bool causal,
                                           int32_t window, float softcap, int32_t keys,
                                           bool tokens_major, rust::Slice<const float> sinks,
                                           uint8_t isa, int32_t threads);
// native_attention over a KV cache's blocks ([1, kv_heads, 256, D] each; the first `keys`
// positions are read) instead of whole arrays; the output is tokens-major, [n, heads·D].
std::unique_ptr<MlxArray> native_attention_blocks(const MlxArray& q, const ArrayList& k_blocks,
                                                  const ArrayList& v_blocks, float scale,
                                                  bool causal, int32_t window, float softcap,
                                                  int32_t keys, rust::Slice<const float> sinks,
                                                  uint8_t isa, int32_t threads);
std::unique_ptr<MlxArray> split_heads(const MlxArray& qkv, const MlxArray& inv_freq, int32_t row0,
                                      int32_t n, int32_t col0, int32_t heads, int32_t dim,
                                      bool rope, int32_t offset, float scale);
// A layer's routed experts checked and held for native_routed_experts (kernels/moe_node.cc),
// made once at load: the plan (every expert's matrices, the router, the shape) is shared with
// the nodes that run it, which keeps the matrices alive.
struct RoutedExpertsPlan;
struct RoutedExperts {
  std::shared_ptr<const RoutedExpertsPlan> plan;
};
// The routed experts of a decoder stack's routed layers, in layer order.
struct ExpertsList {
  std::vector<std::shared_ptr<const RoutedExpertsPlan>> items;
};
std::unique_ptr<ExpertsList> experts_list_new();
void experts_list_push(ExpertsList& list, const RoutedExperts& experts);
namespace kernels {
struct MoePlan;
}
// The kernel's plan inside (kernels/moe.h), for the decoder stack's routed layers.
const kernels::MoePlan& routed_experts_kernel_plan(const RoutedExpertsPlan& plan);
// The llama decoder layers of a model, one after the other, over every sequence of a step, as
// one MLX node (kernels/layer.cc). `tensors`: x [tokens, hidden], then per layer: input norm,
// qkv (w, scales, biases), o (3), post norm, inv_freq, gate/up (3) and down (3) unless the
// layer has routed experts, then the q and k norms when `qk_norm`, the post-attention and post-MLP norms when `sandwich`, the stacked q/k/v
// biases when `qkv_bias`, k's and v's (w, scales, biases) when `split_qkv` (qkv then holds q), o's bias ([hidden])
// when `o_bias`;
// `caches`: per layer, per sequence its key blocks then its value blocks, written in place at
// the sequence's positions (each must be a buffer of its own); `dims`: per layer hidden, heads,
// kv_heads, head_dim, intermediate, qk_norm (0: none, 1: per head, 2: over the whole q
// and k projections), rope (0/1), sliding window (0: none),
// sandwich (0/1), GeGLU (0/1), rotary width (RoPE's leading features per head), qkv_bias (0/1),
// split_qkv (0/1), sinks (0/1), mlp (0: dense; 1 or 2: routed experts with x in f32 or
// quantized to int8), o_bias (0/1); `quant`: per layer (group, bits, layout) of qkv (or q), o, then gate/up
// and down on a dense layer, then k and v when split; `experts`: per routed layer, in layer
// order, its experts (the MLP of kernels/moe.h, which norms x1 and adds its residual); `seqs`: per layer, (n, position, blocks) per sequence
// in x's row order; `softcaps`: per layer, the attention scores' soft-cap (0: none); `sinks`:
// per layer with sinks, in layer order, its heads' sink logits (kernels/attention.h);
// `rope_mscale`: the factor on the rotated features (1: none); `lora`, `lora_pairs`,
// `lora_factors`, `lora_scales`: LoRA deltas (kernels/lora.h), per pair (layer, target 0-6 for
// q, k, v, o, gate, up, down, adapter) with its Aᵀ [in, rank] and Bᵀ [rank, out] (f32) in
// `lora` and its alpha / rank in `lora_factors`, and each adapter's scale per row of x
// ([adapters, tokens]); all empty without adapters.
std::unique_ptr<MlxArray> native_decoder_stack(const ArrayList& tensors, const ArrayList& caches,
                                               rust::Slice<const int32_t> dims,
                                               rust::Slice<const int32_t> quant,
                                               rust::Slice<const int32_t> seqs,
                                               rust::Slice<const float> softcaps,
                                               rust::Slice<const float> sinks,
                                               const ExpertsList& experts,
                                               const ArrayList& lora,
                                               rust::Slice<const int32_t> lora_pairs,
                                               rust::Slice<const float> lora_factors,
                                               rust::Slice<const float> lora_scales, float eps,
                                               float scale, float rope_scale, float rope_mscale,
                                               rust::Slice<const int32_t> keep, uint8_t isa,
                                               int32_t threads);
// `matrices`: per routed expert, then for the shared expert if any, gate/up stacked (w, scales,
// biases; [2·intermediate, hidden]) and down (w, scales, biases; [hidden, intermediate]), or
// with `split` each routed expert's gate, up and down apart (the shared expert stays stacked);
// `quant`: per matrix (group, bits, int8 layout 0/1); `biases`: empty, or (split only) per routed
// expert its gate's, up's and down's f32 biases; `router`: [experts (+ 1), hidden] f32 rows,
// the shared expert's gate last; `router_bias`: empty or one f32 per routed expert, added to its
// logit; `routing`: 0 softmax then top k, 1 the same renormalized, 2 top k then softmax;
// `activation`: 0 SwiGLU, 1 GeGLU, 2 gpt-oss's clamped SwiGLU with `alpha` and `limit`.
std::unique_ptr<RoutedExperts> routed_experts_new(const ArrayList& matrices,
                                                  rust::Slice<const int32_t> quant,
                                                  const ArrayList& biases,
                                                  rust::Slice<const float> router,
                                                  rust::Slice<const float> router_bias,
                                                  int32_t hidden, int32_t experts, int32_t top_k,
                                                  uint8_t routing, uint8_t activation,
                                                  float alpha, float limit, bool shared,
                                                  bool split);
// The routed-expert MLP of x [tokens, hidden] as one MLX node (kernels/moe.h): normed by `norm`,
// plus x when `residual`; `int8x`: weights in the int8 layout multiply int8 activations.
std::unique_ptr<MlxArray> native_routed_experts(const MlxArray& x, const MlxArray& norm,
                                                const RoutedExperts& experts, float eps,
                                                bool residual, bool int8x, uint8_t isa,
                                                int32_t threads);
// A quantized weight rewritten for the int8-activation kernels (kernels/qmatmul.h): the same
// shapes and dtypes, interleaved 16 output rows at a time; with `compact`, 8-bit codes that fit
// in 5 or 6 bits take that many, and f32 scales and biases that factor exactly are stored
// factored (uint8 buffers).
std::unique_ptr<ArrayList> interleave_int8(const MlxArray& w, const MlxArray& scales,
                                           const MlxArray& biases, int32_t group_size,
                                           int32_t bits, bool compact, int32_t threads);
// One tile of kernels::kInt8TileRows rows of MLX-layout codes (`bits` 4 or 8, K values a row)
// rewritten into the int8 layout's code bytes with `out_bits` (kernels::interleave_int8);
// `out` holds exactly the tile's 2 · K · out_bits bytes.
void kernels_interleave_tile(rust::Slice<const uint32_t> codes, int32_t k, int32_t bits,
                             int32_t out_bits, rust::Slice<uint8_t> out);
// Rows `ids` (uint32, any shape) of an int8-layout weight, dequantized to f32 [ids..., K].
std::unique_ptr<MlxArray> int8_rows(const MlxArray& ids, const MlxArray& w,
                                    const MlxArray& scales, const MlxArray& biases,
                                    int32_t group_size, int32_t bits);
// kernels::factor_int8_superblock of `values` (at most 16, as many as `c`): d, and true.
bool kernels_factor_superblock(rust::Slice<const float> values, float& d,
                               rust::Slice<int8_t> c);
bool kernels_has_vnni();
// The IEEE halves the fused layer writes into f16 caches for `values` (round to nearest even).
void kernels_float_to_half(rust::Slice<const float> values, rust::Slice<uint16_t> out);
uint8_t kernels_best_isa();
// The gated delta rule over a run of tokens (kernels/delta_rule.h): q and k [n, key_heads,
// key_dim], v and y [n, value_heads, value_dim], log_decay and beta [n, value_heads], state
// [value_heads, value_dim, key_dim] updated in place; the chunked form on the grid of absolute
// positions from `position`, else token by token.
void kernels_delta_rule(rust::Slice<const float> q, rust::Slice<const float> k,
                        rust::Slice<const float> v, rust::Slice<const float> log_decay,
                        rust::Slice<const float> beta, rust::Slice<float> state,
                        rust::Slice<float> y, int32_t key_heads, int32_t value_heads,
                        int32_t key_dim, int32_t value_dim, bool tiled, int64_t position,
                        bool chunked, uint8_t isa, int32_t threads);
// The causal depthwise convolution then SiLU of x [n, channels] after the `taps - 1` rows of
// `tail`, weight [channels, taps], into out [n, channels].
void kernels_causal_conv_silu(rust::Slice<const float> x, rust::Slice<const float> tail,
                              rust::Slice<const float> weight, int32_t channels, int32_t taps,
                              rust::Slice<float> out, uint8_t isa, int32_t threads);
int32_t kernels_available_cores();

}  // namespace mlxcel
