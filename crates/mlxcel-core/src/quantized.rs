//! MLX affine quantization: `value = scale · q + bias` per group of `group_size` weights.
//!
//! A quantized `[out, in]` matrix is stored as `weight: u32 [out, in·bits/32]` (for 4 bits,
//! eight values per u32, lowest nibble first), `scales` and `biases: [out, in/group_size]`.
//! GGUF Q4_0/Q4_1/Q8_0 blocks are this format with `group_size = 32`; GGUF Q6_K/Q3_K/Q2_K are
//! it with `group_size = 16`, which MLX's own quantized ops do not take: such weights always run
//! on mlxcel's kernels (f32 activations), and MLX's ops refuse them by name.

use crate::array::{Array, call};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::kernels::{Activations, Int8Layout, Isa, KernelBackend, Kernels};
use crate::sys::{self, Handle, ffi};

/// The (weight, scales, biases) list an MLX op returns, as arrays; `op` names it in errors.
fn three_arrays(
    op: &'static str,
    f: impl FnOnce() -> Result<cxx::UniquePtr<ffi::ArrayList>, cxx::Exception>,
) -> Result<[Array; 3]> {
    let parts = sys::with_lock(|| -> Result<Vec<Handle>, cxx::Exception> {
        let list = f()?;
        (0..ffi::array_list_len(&list))
            .map(|i| ffi::array_list_get(&list, i).map(Handle::new))
            .collect()
    })
    .map_err(Error::mlx(op))?;
    let parts: [Handle; 3] = parts.try_into().map_err(|parts: Vec<Handle>| Error::Mlx {
        op,
        message: format!(
            "expected 3 outputs (weight, scales, biases), got {}",
            parts.len()
        ),
    })?;
    Ok(parts.map(Array::from_handle))
}

/// What a quantized matmul does to its result `y = x · Wᵀ` before returning it.
#[derive(Debug, Clone, Copy)]
pub enum Epilogue<'a> {
    /// Nothing.
    None,
    /// `y + r` (a skip connection; `r` has `y`'s shape).
    Residual(&'a Array),
    /// `silu(g) · u` where `g` and `u` are the first and second halves of each row of `y`
    /// (gate and up projections stacked with [`QuantizedWeight::concat_rows`]).
    Swiglu,
    /// `gelu_tanh(g) · u` likewise (Gemma's GeGLU).
    Geglu,
}

/// A quantized weight matrix and its layout.
#[derive(Debug, Clone)]
pub struct QuantizedWeight {
    /// Packed quantized values, u32.
    pub weight: Array,
    /// One scale per group (the dtype of the original weights).
    pub scales: Array,
    /// One bias per group.
    pub biases: Array,
    /// Weights per group: 32, 64 or 128, or 16 (mlxcel's kernels only).
    pub group_size: i32,
    /// Bits per weight: 4 or 8 (MLX also accepts 2, 3, 5, 6); 5 or 6 in the compact int8
    /// layout ([`QuantizedWeight::interleave_int8_as`]).
    pub bits: i32,
    /// The arrays are in the interleaved layout of mlxcel's int8-activation kernels
    /// ([`QuantizedWeight::interleave_int8`]), which only those kernels read.
    pub int8: bool,
    /// What this matrix multiplies when a per-matrix policy ([`Activations::Mixed`]) chose for
    /// it at load (a weight in the int8 layout only); `None`: what the caller passes, the
    /// kernels' choice.
    pub activations: Option<Activations>,
}

impl QuantizedWeight {
    /// Quantizes `w` (`[out, in]`, `in` a multiple of `group_size`) with MLX's affine scheme.
    pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<QuantizedWeight> {
        let [weight, scales, biases] =
            three_arrays("quantize", || ffi::quantize(w.raw(), group_size, bits))?;
        Ok(QuantizedWeight {
            weight,
            scales,
            biases,
            group_size,
            bits,
            int8: false,
            activations: None,
        })
    }

    /// Output rows that one int8 tile serves: an int8 weight's row count is a multiple of it.
    pub const INT8_TILE_ROWS: i32 = 16;

    /// Whether [`QuantizedWeight::interleave_int8`] accepts this weight: MLX layout, a layout
    /// mlxcel's kernels cover, and a multiple of 16 output rows.
    pub fn int8_capable(&self) -> bool {
        !self.int8
            && self.native_layout()
            && self
                .weight
                .shape()
                .first()
                .is_some_and(|&rows| rows % Self::INT8_TILE_ROWS == 0)
    }

    /// This weight rewritten for mlxcel's int8-activation kernels (`MLXCEL_ACTIVATIONS=int8`):
    /// the same shapes, dtypes and bytes, interleaved 16 output rows at a time so that one
    /// AVX-512 VNNI instruction multiplies 16 rows by four values of x. x is then quantized
    /// to int8 per row and block of 32 inside each matmul (docs/kernels.md). Only mlxcel's
    /// native matmul reads the result; MLX's ops refuse it.
    pub fn interleave_int8(&self) -> Result<QuantizedWeight> {
        self.interleave_int8_as(Int8Layout::Wide)
    }

    /// [`QuantizedWeight::interleave_int8`] in `layout`: with [`Int8Layout::Compact`], 8-bit
    /// codes that all fit in 5 or 6 bits are stored in that many (`bits` becomes 5 or 6), and
    /// f32 scales and biases that factor exactly into a per-256-value f32 times an int8 per
    /// group are stored factored (u8 buffers), and biases that are one power of two times the
    /// scales are kept as that multiple ([`QuantizedWeight::derived_biases`]): what a GGUF
    /// K-quant, Q4_0, Q5 or Q8_0 file holds, at close to its size. Every product the kernels
    /// compute is the same bits either way. Rewrites on one
    /// thread per available core ([`QuantizedWeight::interleave_int8_on`] takes a count).
    pub fn interleave_int8_as(&self, layout: Int8Layout) -> Result<QuantizedWeight> {
        self.interleave_int8_on(layout, crate::kernels::available_cores())
    }

    /// [`QuantizedWeight::interleave_int8_as`] on up to `threads` threads (a model load passes
    /// its kernels' count, `MLXCEL_THREADS`).
    pub fn interleave_int8_on(
        &self,
        layout: Int8Layout,
        threads: usize,
    ) -> Result<QuantizedWeight> {
        if self.int8 {
            return Err(Error::Mlx {
                op: "interleave_int8",
                message: "the weight is already interleaved".into(),
            });
        }
        let [weight, scales, biases] = three_arrays("interleave_int8", || {
            ffi::interleave_int8(
                self.weight.raw(),
                self.scales.raw(),
                self.biases.raw(),
                self.group_size,
                self.bits,
                layout == Int8Layout::Compact,
                i32::try_from(threads.max(1)).unwrap_or(i32::MAX),
            )
        })?;
        // The code width chosen: the packed row's words over the input width.
        let words = |w: &Array| w.shape().get(1).copied().unwrap_or(0);
        let bits = if words(&self.weight) == 0 {
            self.bits
        } else {
            words(&weight) * self.bits / words(&self.weight)
        };
        Ok(QuantizedWeight {
            weight,
            scales,
            biases,
            group_size: self.group_size,
            bits,
            int8: true,
            activations: self.activations,
        })
    }

    /// Rows `ids` (u32, any shape) of an int8-layout weight, dequantized to f32
    /// (`[ids..., in]`): `fl(fl(scale · q) + bias)` per value, the values
    /// [`QuantizedWeight::dequantize`] gives for the weight before interleaving. This lets a
    /// tied embedding table live in the int8 layout alone (its lookups and the output
    /// projection read one copy). An id past the rows gives a row of NaN.
    pub fn int8_rows(&self, ids: &Array) -> Result<Array> {
        if !self.int8 {
            return Err(Error::Mlx {
                op: "int8_rows",
                message: "the weight is not in the int8 layout".into(),
            });
        }
        call("int8_rows", || {
            ffi::int8_rows(
                ids.raw(),
                self.weight.raw(),
                self.scales.raw(),
                self.biases.raw(),
                self.group_size,
                self.bits,
            )
        })
    }

    /// Whether the scales and biases are stored factored ([`Int8Layout::Compact`]).
    pub fn factored(&self) -> bool {
        self.int8 && self.scales.dtype() == Dtype::U8
    }

    /// Whether the int8 layout keeps the biases as one power of two times the scales (a
    /// symmetric format's code offset: GGUF Q4_0, Q5_0, Q8_0, Q6_K, Q3_K): `biases` is then
    /// that multiple, a `[1]` f32 array, and the kernels compute each bias from its scale,
    /// the same bits. (`[m, 1]` when the codes are E2M1 indices: [`QuantizedWeight::e2m1_codes`].)
    pub fn derived_biases(&self) -> bool {
        self.int8
            && self.biases.dtype() == Dtype::F32
            && (self.biases.shape() == [1] || self.biases.shape() == [2])
    }

    /// Whether the int8 layout's 4-bit codes are MXFP4's E2M1 indices, which the kernels look
    /// up as the codes the compact 5-bit form stores (4..=28; the same bits either way): what
    /// an MXFP4 weight written from its GGUF blocks holds, a fifth fewer code bytes than 5 bits.
    /// The derived biases' placeholder is then `[m, 1]`.
    pub fn e2m1_codes(&self) -> bool {
        self.bits == 4 && self.derived_biases() && self.biases.shape() == [2]
    }

    /// Whether only mlxcel's kernels can read this weight, whatever the chosen kernels: the int8
    /// layout, or groups of 16 (MLX's group sizes start at 32).
    pub fn native_only(&self) -> bool {
        self.int8 || self.group_size == 16
    }

    /// MLX's own ops read the MLX layout only.
    fn mlx_layout(&self, op: &'static str) -> Result<()> {
        if self.group_size == 16 {
            return Err(Error::Mlx {
                op,
                message: "this weight has groups of 16 (GGUF Q6_K/Q3_K/Q2_K), which MLX's \
                          quantized ops do not support; only mlxcel's native matmul reads it"
                    .into(),
            });
        }
        if self.int8 {
            return Err(Error::Mlx {
                op,
                message: "this weight is interleaved for mlxcel's int8 kernels \
                          (MLXCEL_ACTIVATIONS=int8); only the native matmul reads it"
                    .into(),
            });
        }
        Ok(())
    }

    /// The full-precision matrix `scale · q + bias`, in the scales' dtype.
    pub fn dequantize(&self) -> Result<Array> {
        if self.group_size == 16 && !self.int8 {
            return self.dequantize_group16();
        }
        self.mlx_layout("dequantize")?;
        call("dequantize", || {
            ffi::dequantize(
                self.weight.raw(),
                self.scales.raw(),
                self.biases.raw(),
                self.group_size,
                self.bits,
            )
        })
    }

    /// Groups of 16, which MLX's `dequantize` refuses: MLX unpacks the values (as groups of 32
    /// with scale 1 and bias 0, exact), then `scale · q + bias` per group of 16 with two
    /// separate ops, each rounded once in f32: llama.cpp's values for GGUF Q6_K/Q3_K/Q2_K.
    fn dequantize_group16(&self) -> Result<Array> {
        let shape = self.weight.shape();
        let (rows, cols) = match shape[..] {
            [rows, words] => (rows, words * 32 / self.bits),
            _ => {
                return Err(Error::Mlx {
                    op: "dequantize",
                    message: format!("expected a 2-D packed weight, got shape {shape:?}"),
                });
            }
        };
        let dtype = self.scales.dtype();
        let ones =
            Array::zeros(&[rows, cols / 32], dtype)?.add(&Array::scalar_f32(1.0).astype(dtype)?)?;
        let zeros = Array::zeros(&[rows, cols / 32], dtype)?;
        let q = call("dequantize", || {
            ffi::dequantize(self.weight.raw(), ones.raw(), zeros.raw(), 32, self.bits)
        })?
        .reshape(&[rows, cols / 16, 16])?;
        let scales = self.scales.reshape(&[rows, cols / 16, 1])?;
        let biases = self.biases.reshape(&[rows, cols / 16, 1])?;
        q.multiply(&scales)?.add(&biases)?.reshape(&[rows, cols])
    }

    /// `x · Wᵀ` (the linear-layer case, `W: [out, in]`) with `kernels`: mlxcel's own kernel
    /// when chosen and it covers the layout (4 or 8 bits, groups of 16, 32, 64 or 128, f32 `x`,
    /// scales and biases), MLX's otherwise. A weight only mlxcel's kernels read
    /// ([`QuantizedWeight::native_only`]) takes them whatever the choice.
    pub fn linear(&self, x: &Array, kernels: &Kernels) -> Result<Array> {
        if self.native_only() || (kernels.backend == KernelBackend::Native && self.native_covers(x))
        {
            self.matmul_native_full(
                x,
                None,
                kernels.isa,
                kernels.threads,
                kernels.activations,
                Epilogue::None,
            )
        } else {
            self.matmul(x, true)
        }
    }

    /// The layout code the native kernels take: 0 for MLX's layout; for the int8 layout, 1
    /// when this matrix multiplies int8 activations (x quantized per block of 32), 2 when f32
    /// (x multiplied as it is, over the same compact codes). The matrix's own choice
    /// ([`QuantizedWeight::activations`]) comes before `activations`; `mixed` with none of its
    /// own (a weight the load did not assign) multiplies f32.
    pub fn layout_code(&self, activations: Activations) -> u8 {
        match (self.int8, self.activations.unwrap_or(activations)) {
            (false, _) => 0,
            (true, Activations::Int8) => 1,
            (true, Activations::F32 | Activations::Mixed) => 2,
        }
    }

    /// Whether mlxcel's kernel covers `x · Wᵀ` for this weight.
    pub fn native_covers(&self, x: &Array) -> bool {
        self.native_layout() && x.dtype() == Dtype::F32
    }

    /// Whether mlxcel's kernels cover this weight's layout (for f32 activations): 4 or 8 bits,
    /// groups of 16, 32, 64 or 128 (rows of whole 32-value chunks), scales and biases both f32
    /// or both f16; in the int8 layout also 5 or 6 bits and factored scales.
    pub fn native_layout(&self) -> bool {
        let scales = self.scales.dtype();
        if self.factored() {
            return matches!(self.bits, 4 | 5 | 6 | 8)
                && (self.biases.dtype() == Dtype::U8 || self.derived_biases());
        }
        (matches!(self.bits, 4 | 8) || (self.int8 && matches!(self.bits, 5 | 6)))
            && matches!(self.group_size, 16 | 32 | 64 | 128)
            && self
                .weight
                .shape()
                .get(1)
                .is_some_and(|&words| (words * 32 / self.bits) % 32 == 0)
            && matches!(scales, Dtype::F32 | Dtype::F16)
            && (self.biases.dtype() == scales || self.derived_biases())
    }

    /// `x · Wᵀ` with mlxcel's CPU kernel on the best path at or below `isa`, using at most
    /// `threads` threads; a weight in the int8 layout multiplies int8 activations
    /// ([`QuantizedWeight::matmul_native_full`] chooses). Errors name the unsupported layout.
    pub fn matmul_native(&self, x: &Array, isa: Isa, threads: usize) -> Result<Array> {
        self.matmul_native_then(x, isa, threads, Epilogue::None)
    }

    /// [`QuantizedWeight::matmul_native`] followed by `epilogue`, in the same MLX op.
    pub fn matmul_native_then(
        &self,
        x: &Array,
        isa: Isa,
        threads: usize,
        epilogue: Epilogue<'_>,
    ) -> Result<Array> {
        self.matmul_native_full(x, None, isa, threads, Activations::Int8, epilogue)
    }

    /// [`QuantizedWeight::matmul_native_then`] of `rms_norm(x, weight, eps)` when `norm` is
    /// given (the norm computed inside the same op), with a weight in the int8 layout
    /// multiplying `activations` (f32: x as it is; int8: x quantized per block of 32).
    /// `activations` does not matter for a weight in MLX's layout, which always multiplies f32.
    pub fn matmul_native_full(
        &self,
        x: &Array,
        norm: Option<(&Array, f32)>,
        isa: Isa,
        threads: usize,
        activations: Activations,
        epilogue: Epilogue<'_>,
    ) -> Result<Array> {
        let (has_norm, norm_weight, eps) = match norm {
            Some((w, eps)) => (true, w, eps),
            None => (false, x, 0.0),
        };
        let (code, residual) = match epilogue {
            Epilogue::None => (0, x),
            Epilogue::Residual(r) => (1, r),
            Epilogue::Swiglu => (2, x),
            Epilogue::Geglu => (3, x),
        };
        call("native_quantized_matmul", || {
            ffi::native_quantized_matmul(
                x.raw(),
                self.weight.raw(),
                self.scales.raw(),
                self.biases.raw(),
                self.group_size,
                self.bits,
                self.layout_code(activations),
                isa as u8,
                threads.min(i32::MAX as usize) as i32,
                code,
                residual.raw(),
                has_norm,
                norm_weight.raw(),
                eps,
            )
        })
    }

    /// `rms_norm(x, norm_weight, eps) · Wᵀ` followed by `epilogue`: one op on mlxcel's kernels,
    /// the equivalent MLX ops otherwise.
    pub fn linear_normed_then(
        &self,
        x: &Array,
        norm_weight: &Array,
        eps: f32,
        kernels: &Kernels,
        epilogue: Epilogue<'_>,
    ) -> Result<Array> {
        if self.native_only()
            || (kernels.backend == KernelBackend::Native
                && self.native_covers(x)
                && norm_weight.dtype() == Dtype::F32)
        {
            return self.matmul_native_full(
                x,
                Some((norm_weight, eps)),
                kernels.isa,
                kernels.threads,
                kernels.activations,
                epilogue,
            );
        }
        let h = crate::fast::rms_norm(x, norm_weight, eps)?;
        self.linear_then(&h, kernels, epilogue)
    }

    /// [`QuantizedWeight::linear`] followed by `epilogue`: one MLX op on mlxcel's kernel, the
    /// equivalent MLX ops otherwise.
    pub fn linear_then(
        &self,
        x: &Array,
        kernels: &Kernels,
        epilogue: Epilogue<'_>,
    ) -> Result<Array> {
        if self.native_only() || (kernels.backend == KernelBackend::Native && self.native_covers(x))
        {
            return self.matmul_native_full(
                x,
                None,
                kernels.isa,
                kernels.threads,
                kernels.activations,
                epilogue,
            );
        }
        let y = self.matmul(x, true)?;
        match epilogue {
            Epilogue::None => Ok(y),
            Epilogue::Residual(r) => y.add(r),
            Epilogue::Swiglu | Epilogue::Geglu => {
                let shape = y.shape();
                let last = shape.len() - 1;
                let half = shape[last] / 2;
                let (mut start, mut stop) = (vec![0; shape.len()], shape.clone());
                stop[last] = half;
                let gate = y.slice(&start, &stop)?;
                start[last] = half;
                stop[last] = shape[last];
                let up = y.slice(&start, &stop)?;
                let activated = match epilogue {
                    Epilogue::Geglu => gate.gelu_tanh()?,
                    _ => gate.silu()?,
                };
                activated.multiply(&up)
            }
        }
    }

    /// The rows of several weights stacked into one (`[Σ out, in]`), so that one matmul computes
    /// all their outputs side by side. All must share `in`, `group_size` and `bits`.
    pub fn concat_rows(parts: &[&QuantizedWeight]) -> Result<QuantizedWeight> {
        let first = parts.first().ok_or_else(|| Error::Mlx {
            op: "concat_rows",
            message: "no weights given".into(),
        })?;
        // Stacking rows is layout-agnostic for groups of 16; the int8 layout interleaves rows.
        if parts.iter().any(|p| p.int8) {
            return Err(Error::Mlx {
                op: "concat_rows",
                message: "this weight is interleaved for mlxcel's int8 kernels \
                          (MLXCEL_ACTIVATIONS=int8); only the native matmul reads it"
                    .into(),
            });
        }
        if parts
            .iter()
            .any(|p| p.group_size != first.group_size || p.bits != first.bits)
        {
            return Err(Error::Mlx {
                op: "concat_rows",
                message: "weights differ in group size or bits".into(),
            });
        }
        let stack = |field: fn(&QuantizedWeight) -> &Array| -> Result<Array> {
            Array::concatenate(&parts.iter().map(|p| field(p)).collect::<Vec<_>>(), 0)
        };
        Ok(QuantizedWeight {
            weight: stack(|p| &p.weight)?,
            scales: stack(|p| &p.scales)?,
            biases: stack(|p| &p.biases)?,
            group_size: first.group_size,
            bits: first.bits,
            int8: false,
            activations: None,
        })
    }

    /// `x · Wᵀ` when `transpose` (the linear-layer case, `W: [out, in]`), else `x · W`, with
    /// MLX's stock kernel (which refuses groups of 16 and the int8 layout, by name).
    pub fn matmul(&self, x: &Array, transpose: bool) -> Result<Array> {
        self.mlx_layout("quantized_matmul")?;
        call("quantized_matmul", || {
            ffi::quantized_matmul(
                x.raw(),
                self.weight.raw(),
                self.scales.raw(),
                self.biases.raw(),
                transpose,
                self.group_size,
                self.bits,
            )
        })
    }
}
