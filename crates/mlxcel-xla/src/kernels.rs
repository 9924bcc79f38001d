//! mlxcel's own packed-weight matrix products, linked into IREE modules under
//! [`WeightFormat::Kernel`](crate::WeightFormat::Kernel).
//!
//! IREE 3.13's CPU code generation does not make a fast kernel of a matmul that dequantizes
//! 4- or 8-bit weights (docs/xla.md measures the forms tried), so the `f16` format reads 2.7×
//! the checkpoint's bytes. Instead, `kernels/qmm.c` (compiled by `build.rs` into a freestanding
//! object, embedded here) multiplies the packed codes directly; the emitted program declares it
//! as an external executable (a `stream.executable` whose exports call the C functions) and
//! reaches it with `flow.dispatch`, and `iree-compile` links the object into the module's
//! embedded ELF. The rest of the program stays StableHLO.
//!
//! ```text
//! y[r][o] = Σ_k x[r][k] · (scale[o][k / group] · code[o][k] + bias[o][k / group])
//! ```
//!
//! in f32, each workgroup a range of output columns. Supported: 4-bit codes in groups of a
//! multiple of 32, 8-bit in groups of a multiple of 16, f16 or f32 scales, on x86-64 with
//! AVX-512 (F, BW, VL, VNNI), FMA and F16C ([`supported`]).
//!
//! Under [`WeightFormat::KernelInt8`](crate::WeightFormat::KernelInt8) the activations are
//! quantized to int8 per row and block of 32 values (`dx = max|x| / 127`, as the MLX backend's
//! int8 path and llama.cpp's Q8 activations) by one more dispatch per linear input
//! (`quantize_x`), and the products are integer dot products (`vpdpbusd`) scaled per block:
//!
//! ```text
//! y[r][o] = Σ_blocks float(Σ code · xq) · dx · scale + bias · dx · Σ xq
//! ```
//!
//! (the biases meet the quantized x as the codes do: with the exact `Σx` instead, a large bias,
//! as 8-bit codes around 128 from a symmetric format have, amplifies the quantization error:
//! logits 2.4 from the MLX backend's int8 activations against 0.84)
//!
//! for groups of 32, 64 or 128 ([`fits_int8`]).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::abi::Packing;
use crate::hlo::ElementType;

/// The executable's symbol in emitted programs.
pub const EXECUTABLE: &str = "mlxcel_qmm";

#[cfg(mlxcel_qmm)]
const OBJECT: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/mlxcel-qmm.o")));
#[cfg(not(mlxcel_qmm))]
const OBJECT: Option<&[u8]> = None;

/// The compiled kernels (an x86-64 ELF object), if this build has them.
pub fn object() -> Option<&'static [u8]> {
    OBJECT
}

/// Whether this build has the kernels and this CPU can run them.
pub fn supported() -> bool {
    OBJECT.is_some() && cpu_supported()
}

#[cfg(target_arch = "x86_64")]
fn cpu_supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_supported() -> bool {
    false
}

/// The object's file name: named by its content, so a changed kernel is a changed program text
/// and so a new module cache key.
pub fn object_file_name() -> Option<String> {
    let bytes = OBJECT?;
    let digest = Sha256::digest(bytes);
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("mlxcel-qmm-{hex}.o"))
}

/// Writes the object into `dir` (where `iree-compile` is told to look for objects) unless it is
/// already there; returns its path.
pub fn write_object(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let (Some(bytes), Some(name)) = (OBJECT, object_file_name()) else {
        return Ok(None);
    };
    let path = dir.join(&name);
    if std::fs::read(&path).is_ok_and(|existing| existing == bytes) {
        return Ok(Some(path));
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.{}.partial", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &path)?;
    Ok(Some(path))
}

/// Whether the kernels multiply a weight packed as `p`.
pub fn fits(p: &Packing) -> bool {
    let group_ok = match p.bits {
        4 => p.group.is_multiple_of(32),
        8 => p.group.is_multiple_of(16),
        _ => false,
    };
    group_ok && p.group > 0 && matches!(p.scales, ElementType::F16 | ElementType::F32)
}

/// Whether the int8-activation kernels multiply a weight packed as `p`: [`fits`], in groups of
/// 32, 64 or 128.
pub fn fits_int8(p: &Packing) -> bool {
    fits(p) && matches!(p.group, 32 | 64 | 128)
}

/// The export that multiplies weights packed as `p` (which [`fits`]), with f32 activations, or
/// with int8 activations from [`quantize_export`] when `int8`.
pub fn export(p: &Packing, int8: bool) -> String {
    let scales = if p.scales == ElementType::F16 {
        "f16"
    } else {
        "f32"
    };
    let int8 = if int8 { "i" } else { "" };
    format!("qmm{}{int8}_{scales}", p.bits)
}

/// The most weights one product dispatch takes (q, k and v).
pub const MAX_FUSED: usize = 3;

/// The export that multiplies `weights` (1 to [`MAX_FUSED`]) weights packed as `p`, of one
/// input, side by side ([`export`] for one).
pub fn fused_export(p: &Packing, int8: bool, weights: usize) -> String {
    match weights {
        1 => export(p, int8),
        k => format!("{}_x{k}", export(p, int8)),
    }
}

/// The export that quantizes rows of x for the int8 products of `bits`-bit weights.
pub fn quantize_export(bits: u32) -> String {
    format!("quantize_x{bits}")
}

/// Bytes of one row of `input` values quantized for `bits`-bit weights (`quantize_x` in
/// `kernels/qmm.c`): the codes in pieces of 128 (4-bit) or 64 (8-bit) values, then 16 lane
/// scales and 16 lane sums (f32) per piece.
pub fn quantized_row_bytes(input: usize, bits: u32) -> usize {
    let values = if bits == 4 { 128 } else { 64 };
    input.div_ceil(values) * (values + 128)
}

/// Output columns per workgroup for a product with `out` columns: about 32 workgroups, each a
/// multiple of 4 columns (the kernel's widest tile) and at least 16.
pub fn columns_per_workgroup(out: usize) -> usize {
    out.div_ceil(32).next_multiple_of(4).max(16)
}

/// The module-level declaration of the executable (every export), for a program that
/// dispatches to it. `object` is the file name `iree-compile` finds on its object search path.
pub fn executable_text(object: &str) -> String {
    let mut exports = String::new();
    let mut functions = String::new();
    for (bits, int8) in [(4, false), (8, false), (4, true), (8, true)] {
        for (scales, scale_bytes) in [("f16", 2), ("f32", 4)] {
            let base = format!("qmm{bits}{}_{scales}", if int8 { "i" } else { "" });
            for weights in 1..=MAX_FUSED {
                product_export(
                    &mut exports,
                    &mut functions,
                    &base,
                    weights,
                    bits,
                    int8,
                    scale_bytes,
                );
            }
        }
    }
    for bits in [4, 8] {
        let name = quantize_export(bits);
        let row = quantized_row_map(bits);
        exports.push_str(&format!(
            "    stream.executable.export public @{name} workgroups(%n: index, %in: index) -> (index, index, index) {{\n\
             \x20     %c1 = arith.constant 1 : index\n\
             \x20     stream.return %n, %c1, %c1 : index, index, index\n\
             \x20   }}\n"
        ));
        functions.push_str(&format!(
            "      func.func private @mlxcel_{name}(memref<?xi8>, memref<?xi8>, index, index, index) attributes {{hal.import.static}}\n\
             \x20     func.func @{name}(%bx: !stream.binding, %bo: !stream.binding, %n: index, %in: index) {{\n\
             \x20       %c0 = arith.constant 0 : index\n\
             \x20       %wg = hal.interface.workgroup.id[0] : index\n\
             \x20       %xs = affine.apply affine_map<()[s0, s1] -> (s0 * s1 * 4)>()[%n, %in]\n\
             \x20       %os = affine.apply affine_map<()[s0, s1] -> (s0 * {row})>()[%n, %in]\n\
             \x20       %mx = stream.binding.subspan %bx[%c0] : !stream.binding -> memref<?xi8>{{%xs}}\n\
             \x20       %mo = stream.binding.subspan %bo[%c0] : !stream.binding -> memref<?xi8>{{%os}}\n\
             \x20       func.call @mlxcel_{name}(%mx, %mo, %n, %in, %wg) : (memref<?xi8>, memref<?xi8>, index, index, index) -> ()\n\
             \x20       return\n\
             \x20     }}\n"
        ));
    }
    format!(
        "  stream.executable private @{EXECUTABLE} attributes {{\n\
         \x20   hal.executable.objects = #hal.executable.objects<{{\n\
         \x20     #hal.executable.target<\"llvm-cpu\", \"embedded-elf-x86_64\"> = [#hal.executable.object<{{path = \"{object}\"}}>]\n\
         \x20   }}>\n\
         \x20 }} {{\n\
         {exports}\
         \x20   builtin.module {{\n\
         {functions}\
         \x20   }}\n\
         \x20 }}\n"
    )
}

/// Bytes of one quantized row as an affine expression of `s1` (the input width), matching
/// [`quantized_row_bytes`].
fn quantized_row_map(bits: u32) -> String {
    let values = if bits == 4 { 128 } else { 64 };
    format!("((s1 ceildiv {values}) * {})", values + 128)
}

/// One product export over `weights` weights (1: `base`; 2, 3: `base_x2`, `base_x3`): bindings
/// x, then codes, scales and biases per weight, then each weight's y; operands n, in, each
/// weight's columns, group, columns per workgroup. Workgroups cover all the columns.
#[allow(clippy::too_many_arguments)]
fn product_export(
    exports: &mut String,
    functions: &mut String,
    base: &str,
    weights: usize,
    bits: u32,
    int8: bool,
    scale_bytes: usize,
) {
    let name = if weights == 1 {
        base.to_owned()
    } else {
        format!("{base}_x{weights}")
    };
    let outs: Vec<String> = (0..weights).map(|k| format!("%out{k}")).collect();
    let out_args = outs
        .iter()
        .map(|o| format!("{o}: index"))
        .collect::<Vec<_>>()
        .join(", ");
    // Σ outs as an affine sum of symbols s0 .. s(k-1).
    let total_map = format!(
        "affine_map<()[{}] -> ({})>",
        (0..weights)
            .map(|k| format!("s{k}"))
            .collect::<Vec<_>>()
            .join(", "),
        (0..weights)
            .map(|k| format!("s{k}"))
            .collect::<Vec<_>>()
            .join(" + ")
    );
    exports.push_str(&format!(
        "    stream.executable.export public @{name} workgroups(%n: index, %in: index, {out_args}, \
         %group: index, %per: index) -> (index, index, index) {{\n\
         \x20     %total = affine.apply {total_map}()[{}]\n\
         \x20     %x = affine.apply affine_map<()[s0, s1] -> (s0 ceildiv s1)>()[%total, %per]\n\
         \x20     %c1 = arith.constant 1 : index\n\
         \x20     stream.return %x, %c1, %c1 : index, index, index\n\
         \x20   }}\n",
        outs.join(", ")
    ));
    let memrefs = vec!["memref<?xi8>"; 1 + 4 * weights].join(", ");
    let indices = vec!["index"; 5 + weights].join(", ");
    let x_bytes = if int8 {
        format!(
            "affine_map<()[s0, s1] -> (s0 * {})>",
            quantized_row_map(bits)
        )
    } else {
        "affine_map<()[s0, s1] -> (s0 * s1 * 4)>".to_owned()
    };
    let mut bindings = vec!["%bx: !stream.binding".to_owned()];
    let mut body = String::new();
    let mut call = vec!["%mx".to_owned()];
    body.push_str(&format!(
        "        %xs = affine.apply {x_bytes}()[%n, %in]\n\
         \x20       %mx = stream.binding.subspan %bx[%c0] : !stream.binding -> memref<?xi8>{{%xs}}\n"
    ));
    for k in 0..weights {
        bindings.extend([
            format!("%bq{k}: !stream.binding"),
            format!("%bs{k}: !stream.binding"),
            format!("%bb{k}: !stream.binding"),
        ]);
        body.push_str(&format!(
            "        %qs{k} = affine.apply affine_map<()[s0, s1] -> ((s0 * s1 * {bits}) floordiv 8)>()[%out{k}, %in]\n\
             \x20       %ss{k} = affine.apply affine_map<()[s0, s1, s2] -> ((s1 floordiv s2) * s0 * {scale_bytes})>()[%out{k}, %in, %group]\n\
             \x20       %mq{k} = stream.binding.subspan %bq{k}[%c0] : !stream.binding -> memref<?xi8>{{%qs{k}}}\n\
             \x20       %ms{k} = stream.binding.subspan %bs{k}[%c0] : !stream.binding -> memref<?xi8>{{%ss{k}}}\n\
             \x20       %mb{k} = stream.binding.subspan %bb{k}[%c0] : !stream.binding -> memref<?xi8>{{%ss{k}}}\n"
        ));
        call.extend([format!("%mq{k}"), format!("%ms{k}"), format!("%mb{k}")]);
    }
    for k in 0..weights {
        bindings.push(format!("%by{k}: !stream.binding"));
        body.push_str(&format!(
            "        %ys{k} = affine.apply affine_map<()[s0, s1] -> (s0 * s1 * 4)>()[%n, %out{k}]\n\
             \x20       %my{k} = stream.binding.subspan %by{k}[%c0] : !stream.binding -> memref<?xi8>{{%ys{k}}}\n"
        ));
        call.push(format!("%my{k}"));
    }
    call.extend(["%n".to_owned(), "%in".to_owned()]);
    call.extend(outs.iter().cloned());
    call.extend(["%group".to_owned(), "%per".to_owned(), "%wg".to_owned()]);
    functions.push_str(&format!(
        "      func.func private @mlxcel_{name}({memrefs}, {indices}) attributes {{hal.import.static}}\n\
         \x20     func.func @{name}({}, %n: index, %in: index, {out_args}, %group: index, %per: index) {{\n\
         \x20       %c0 = arith.constant 0 : index\n\
         \x20       %wg = hal.interface.workgroup.id[0] : index\n\
         {body}\
         \x20       func.call @mlxcel_{name}({}) : ({memrefs}, {indices}) -> ()\n\
         \x20       return\n\
         \x20     }}\n",
        bindings.join(", "),
        call.join(", ")
    ));
}

#[cfg(all(test, mlxcel_qmm))]
mod tests {
    use super::*;

    /// A rank-1 memref as the kernels take it: base, aligned, offset, size, stride.
    type Memref = (*const u8, *const u8, usize, usize, usize);
    /// x, codes, scales, biases, y; then n, in, out, group, columns per workgroup, workgroup.
    type Product = unsafe fn([Memref; 5], [usize; 6]);
    type Quantize = unsafe fn(Memref, Memref, usize, usize, usize);

    // The memref arguments are passed as five scalars each, so each entry is declared with the
    // scalars spelled out, and wrapped to take `Memref` tuples.
    macro_rules! entries {
        ($($name:ident),*) => {
            unsafe extern "C" {
                $(fn $name(
                    xb: *const u8, x: *const u8, xo: usize, xs: usize, xt: usize,
                    qb: *const u8, q: *const u8, qo: usize, qs: usize, qt: usize,
                    sb: *const u8, s: *const u8, so: usize, ss: usize, st: usize,
                    bb: *const u8, b: *const u8, bo: usize, bs: usize, bt: usize,
                    yb: *const u8, y: *const u8, yo: usize, ys: usize, yt: usize,
                    n: usize, input: usize, out: usize, group: usize, per: usize, wg: usize,
                );)*
            }
        };
    }
    entries!(
        mlxcel_qmm4_f16,
        mlxcel_qmm4_f32,
        mlxcel_qmm8_f16,
        mlxcel_qmm8_f32,
        mlxcel_qmm4i_f16,
        mlxcel_qmm4i_f32,
        mlxcel_qmm8i_f16,
        mlxcel_qmm8i_f32
    );
    macro_rules! quantize_entries {
        ($($name:ident),*) => {
            unsafe extern "C" {
                $(fn $name(
                    xb: *const u8, x: *const u8, xo: usize, xs: usize, xt: usize,
                    ob: *const u8, o: *const u8, oo: usize, os: usize, ot: usize,
                    n: usize, input: usize, row: usize,
                );)*
            }
        };
    }
    quantize_entries!(mlxcel_quantize_x4, mlxcel_quantize_x8);

    unsafe extern "C" {
        // x, (codes, scales, biases) × 3, y × 3 as five scalars each, then the dimensions.
        #[rustfmt::skip]
        fn mlxcel_qmm4i_f16_x3(
            x0: *const u8,
            x1: *const u8,
            x2: usize,
            x3: usize,
            x4: usize,
            q00: *const u8,
            q01: *const u8,
            q02: usize,
            q03: usize,
            q04: usize,
            s00: *const u8,
            s01: *const u8,
            s02: usize,
            s03: usize,
            s04: usize,
            b00: *const u8,
            b01: *const u8,
            b02: usize,
            b03: usize,
            b04: usize,
            q10: *const u8,
            q11: *const u8,
            q12: usize,
            q13: usize,
            q14: usize,
            s10: *const u8,
            s11: *const u8,
            s12: usize,
            s13: usize,
            s14: usize,
            b10: *const u8,
            b11: *const u8,
            b12: usize,
            b13: usize,
            b14: usize,
            q20: *const u8,
            q21: *const u8,
            q22: usize,
            q23: usize,
            q24: usize,
            s20: *const u8,
            s21: *const u8,
            s22: usize,
            s23: usize,
            s24: usize,
            b20: *const u8,
            b21: *const u8,
            b22: usize,
            b23: usize,
            b24: usize,
            y00: *const u8,
            y01: *const u8,
            y02: usize,
            y03: usize,
            y04: usize,
            y10: *const u8,
            y11: *const u8,
            y12: usize,
            y13: usize,
            y14: usize,
            y20: *const u8,
            y21: *const u8,
            y22: usize,
            y23: usize,
            y24: usize,
            n: usize,
            input: usize,
            out0: usize,
            out1: usize,
            out2: usize,
            group: usize,
            per: usize,
            wg: usize,
        );
    }

    /// A deterministic pseudo-random stream.
    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    struct Case {
        n: usize,
        input: usize,
        out: usize,
        group: usize,
        bits: u32,
        half: bool,
    }

    /// Runs one product through the kernels (every workgroup of `per` columns) and returns y.
    fn run(
        c: &Case,
        int8: bool,
        x: &[f32],
        packed: &[u8],
        scales: &[u8],
        biases: &[u8],
    ) -> Vec<f32> {
        let m = |p: *const u8| -> Memref { (p, p, 0, 0, 1) };
        let x_arg: Vec<u8> = if int8 {
            let row = quantized_row_bytes(c.input, c.bits);
            let mut out = vec![0u8; c.n * row];
            let q: Quantize = if c.bits == 4 { q4 } else { q8 };
            for r in 0..c.n {
                // SAFETY: x holds n × input f32; out n rows of `row` bytes.
                unsafe { q(m(x.as_ptr() as _), m(out.as_mut_ptr()), c.n, c.input, r) };
            }
            out
        } else if c.bits == 4 {
            // Each block of 32 as [evens, odds].
            let mut p = vec![0f32; x.len()];
            for (k, &v) in x.iter().enumerate() {
                let (block, j) = (k / 32, k % 32);
                p[block * 32 + if j % 2 == 0 { j / 2 } else { 16 + j / 2 }] = v;
            }
            p.iter().flat_map(|v| v.to_le_bytes()).collect()
        } else {
            x.iter().flat_map(|v| v.to_le_bytes()).collect()
        };
        let f: Product = match (c.bits, int8, c.half) {
            (4, false, true) => p4h,
            (4, false, false) => p4f,
            (8, false, true) => p8h,
            (8, false, false) => p8f,
            (4, true, true) => p4ih,
            (4, true, false) => p4if,
            (8, true, true) => p8ih,
            _ => p8if,
        };
        let mut y = vec![0f32; c.n * c.out];
        let per = 12;
        for wg in 0..c.out.div_ceil(per) {
            // SAFETY: every buffer has the bytes the kernel reads or writes for these dims.
            unsafe {
                f(
                    [
                        m(x_arg.as_ptr()),
                        m(packed.as_ptr()),
                        m(scales.as_ptr()),
                        m(biases.as_ptr()),
                        m(y.as_mut_ptr() as _),
                    ],
                    [c.n, c.input, c.out, c.group, per, wg],
                )
            };
        }
        y
    }

    macro_rules! wrap {
        ($($w:ident => $name:ident),*) => {
            $(unsafe fn $w(m: [Memref; 5], d: [usize; 6]) {
                let [x, q, s, b, y] = m;
                // SAFETY: forwarded from `run`'s contract.
                unsafe {
                    $name(x.0, x.1, x.2, x.3, x.4, q.0, q.1, q.2, q.3, q.4, s.0, s.1, s.2, s.3,
                        s.4, b.0, b.1, b.2, b.3, b.4, y.0, y.1, y.2, y.3, y.4, d[0], d[1], d[2],
                        d[3], d[4], d[5])
                }
            })*
        };
    }
    wrap!(p4h => mlxcel_qmm4_f16, p4f => mlxcel_qmm4_f32, p8h => mlxcel_qmm8_f16,
        p8f => mlxcel_qmm8_f32, p4ih => mlxcel_qmm4i_f16, p4if => mlxcel_qmm4i_f32,
        p8ih => mlxcel_qmm8i_f16, p8if => mlxcel_qmm8i_f32);
    unsafe fn q4(x: Memref, o: Memref, n: usize, input: usize, row: usize) {
        // SAFETY: forwarded from `run`'s contract.
        unsafe {
            mlxcel_quantize_x4(
                x.0, x.1, x.2, x.3, x.4, o.0, o.1, o.2, o.3, o.4, n, input, row,
            )
        }
    }
    unsafe fn q8(x: Memref, o: Memref, n: usize, input: usize, row: usize) {
        // SAFETY: forwarded from `run`'s contract.
        unsafe {
            mlxcel_quantize_x8(
                x.0, x.1, x.2, x.3, x.4, o.0, o.1, o.2, o.3, o.4, n, input, row,
            )
        }
    }

    #[test]
    fn products_match_dequantize_then_dot_and_the_documented_int8_arithmetic() {
        if !cpu_supported() {
            eprintln!("skipped: this CPU lacks AVX-512 F/BW/VL/VNNI, FMA or F16C");
            return;
        }
        let mut seed = 7u64;
        let mut cases = Vec::new();
        for bits in [4, 8] {
            for half in [true, false] {
                for (n, input, out, group) in [
                    (1, 64, 13, 32),
                    (2, 576, 40, 32),
                    (5, 192, 22, 64),
                    (9, 384, 6, 128),
                    (3, 96, 17, 32),
                ] {
                    cases.push(Case {
                        n,
                        input,
                        out,
                        group,
                        bits,
                        half,
                    });
                }
            }
        }
        for c in &cases {
            let groups = c.input / c.group;
            let codes: Vec<u8> = (0..c.out * c.input)
                .map(|_| (lcg(&mut seed) % (1 << c.bits)) as u8)
                .collect();
            let packed: Vec<u8> = if c.bits == 4 {
                codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect()
            } else {
                codes.clone()
            };
            let mut scale = |lo: f32, span: f32| -> f32 {
                half::f16::from_f32(lo + span * (lcg(&mut seed) % 1000) as f32 / 1000.0).to_f32()
            };
            let s: Vec<f32> = (0..c.out * groups).map(|_| scale(-0.05, 0.1)).collect();
            let b: Vec<f32> = (0..c.out * groups).map(|_| scale(-0.25, 0.5)).collect();
            let bytes = |v: &[f32]| -> Vec<u8> {
                if c.half {
                    v.iter()
                        .flat_map(|&f| half::f16::from_f32(f).to_le_bytes())
                        .collect()
                } else {
                    v.iter().flat_map(|f| f.to_le_bytes()).collect()
                }
            };
            let x: Vec<f32> = (0..c.n * c.input)
                .map(|_| (lcg(&mut seed) % 2000) as f32 / 1000.0 - 1.0)
                .collect();
            let label = format!(
                "{}-bit, {} scales, n={} in={} out={} group={}",
                c.bits,
                if c.half { "f16" } else { "f32" },
                c.n,
                c.input,
                c.out,
                c.group
            );
            let w = |o: usize, k: usize| {
                let g = o * groups + k / c.group;
                s[g] * codes[o * c.input + k] as f32 + b[g]
            };
            let y = run(c, false, &x, &packed, &bytes(&s), &bytes(&b));
            let yi = run(c, true, &x, &packed, &bytes(&s), &bytes(&b));
            for r in 0..c.n {
                let row = &x[r * c.input..(r + 1) * c.input];
                // int8: per block of 32, dx = max|x| / 127, xq = round(x / dx), ties to even.
                let mut xq = vec![0i32; c.input];
                let mut dx = vec![0f32; c.input / 32];
                for (j, block) in row.chunks(32).enumerate() {
                    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                    dx[j] = amax / 127.0;
                    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                    for (i, v) in block.iter().enumerate() {
                        xq[32 * j + i] = (v * id).round_ties_even() as i32;
                    }
                }
                for o in 0..c.out {
                    let want: f64 = (0..c.input).map(|k| w(o, k) as f64 * row[k] as f64).sum();
                    let got = y[r * c.out + o] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{label}: f32 y[{r}][{o}] = {got}, want {want}"
                    );
                    let mut want_i8 = 0f64;
                    for (j, &dxj) in dx.iter().enumerate() {
                        let k0 = 32 * j;
                        let g = o * groups + k0 / c.group;
                        let dot: i32 = (0..32)
                            .map(|i| codes[o * c.input + k0 + i] as i32 * xq[k0 + i])
                            .sum();
                        let sum = xq[k0..k0 + 32].iter().sum::<i32>() as f32 * dxj;
                        want_i8 += dot as f64 * dxj as f64 * s[g] as f64 + b[g] as f64 * sum as f64;
                    }
                    let got = yi[r * c.out + o] as f64;
                    assert!(
                        (got - want_i8).abs() <= 1e-4 * (1.0 + want_i8.abs()),
                        "{label}: int8 y[{r}][{o}] = {got}, want {want_i8}"
                    );
                }
            }
        }
    }

    /// Three weights in one dispatch give, column for column, the bits of three dispatches.
    #[test]
    fn three_weights_in_one_dispatch_match_three_dispatches() {
        if !cpu_supported() {
            eprintln!("skipped: this CPU lacks AVX-512 F/BW/VL/VNNI, FMA or F16C");
            return;
        }
        let mut seed = 11u64;
        let (n, input, group) = (3, 192, 32);
        let outs = [40usize, 12, 22];
        let x: Vec<f32> = (0..n * input)
            .map(|_| (lcg(&mut seed) % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let weights: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = outs
            .iter()
            .map(|&out| {
                let packed: Vec<u8> = (0..out * input / 2).map(|_| lcg(&mut seed) as u8).collect();
                let mut halves = |count: usize| -> Vec<u8> {
                    (0..count)
                        .flat_map(|_| {
                            let v = (lcg(&mut seed) % 1000) as f32 / 10_000.0 - 0.05;
                            half::f16::from_f32(v).to_le_bytes()
                        })
                        .collect()
                };
                (
                    packed,
                    halves(out * input / group),
                    halves(out * input / group),
                )
            })
            .collect();
        let single: Vec<Vec<f32>> = outs
            .iter()
            .zip(&weights)
            .map(|(&out, (q, s, b))| {
                let c = Case {
                    n,
                    input,
                    out,
                    group,
                    bits: 4,
                    half: true,
                };
                run(&c, true, &x, q, s, b)
            })
            .collect();
        let row = quantized_row_bytes(input, 4);
        let mut xq = vec![0u8; n * row];
        for r in 0..n {
            // SAFETY: x holds n × input f32; xq n rows of `row` bytes.
            unsafe {
                q4(
                    (x.as_ptr() as _, x.as_ptr() as _, 0, 0, 1),
                    (xq.as_mut_ptr(), xq.as_mut_ptr(), 0, 0, 1),
                    n,
                    input,
                    r,
                )
            };
        }
        let total: usize = outs.iter().sum();
        let mut ys: Vec<Vec<f32>> = outs.iter().map(|&out| vec![0f32; n * out]).collect();
        let per = 16;
        let m = |p: *const u8| -> Memref { (p, p, 0, 0, 1) };
        let w = &weights;
        let (x, [q0, s0, b0], [q1, s1, b1], [q2, s2, b2]) = (
            m(xq.as_ptr()),
            [m(w[0].0.as_ptr()), m(w[0].1.as_ptr()), m(w[0].2.as_ptr())],
            [m(w[1].0.as_ptr()), m(w[1].1.as_ptr()), m(w[1].2.as_ptr())],
            [m(w[2].0.as_ptr()), m(w[2].1.as_ptr()), m(w[2].2.as_ptr())],
        );
        let [y0, y1, y2] = [0, 1, 2].map(|k| m(ys[k].as_mut_ptr() as *const u8));
        for wg in 0..total.div_ceil(per) {
            // SAFETY: every buffer has the bytes the kernel reads or writes for these dims.
            #[rustfmt::skip]
            unsafe {
                mlxcel_qmm4i_f16_x3(
                    x.0, x.1, x.2, x.3, x.4,
                    q0.0, q0.1, q0.2, q0.3, q0.4, s0.0, s0.1, s0.2, s0.3, s0.4,
                    b0.0, b0.1, b0.2, b0.3, b0.4, q1.0, q1.1, q1.2, q1.3, q1.4,
                    s1.0, s1.1, s1.2, s1.3, s1.4, b1.0, b1.1, b1.2, b1.3, b1.4,
                    q2.0, q2.1, q2.2, q2.3, q2.4, s2.0, s2.1, s2.2, s2.3, s2.4,
                    b2.0, b2.1, b2.2, b2.3, b2.4,
                    y0.0, y0.1, y0.2, y0.3, y0.4, y1.0, y1.1, y1.2, y1.3, y1.4,
                    y2.0, y2.1, y2.2, y2.3, y2.4,
                    n, input, outs[0], outs[1], outs[2], group, per, wg,
                )
            };
        }
        for (k, &out) in outs.iter().enumerate() {
            for i in 0..n * out {
                assert_eq!(
                    ys[k][i].to_bits(),
                    single[k][i].to_bits(),
                    "weight {k}, row {}, column {}",
                    i / out,
                    i % out
                );
            }
        }
    }
}
