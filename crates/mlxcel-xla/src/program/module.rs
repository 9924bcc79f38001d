//! The module for one capacity, and whether a weight format can pass a model's packed weights.

use super::step::{Step, decode_batches, emit_step};
use crate::abi::{Layout, LlamaDims, ProgramShape, WeightFormat, weight_specs};
use crate::error::EmitError;
use crate::hlo::{ElementType, Module, TensorType};
use crate::kernels;

/// Emits the module for one capacity.
pub fn emit_llama(
    d: &LlamaDims,
    shape: &ProgramShape,
    format: WeightFormat,
) -> Result<String, EmitError> {
    if !d.heads.is_multiple_of(d.kv_heads.max(1))
        || d.inv_freq.len() * 2 != d.rotary_dim
        || d.rotary_dim > d.head_dim
    {
        return Err(EmitError::Shape {
            op: "llama",
            detail: format!(
                "{} heads over {} kv heads, {} rotary frequencies for {} rotated of head_dim {}",
                d.heads,
                d.kv_heads,
                d.inv_freq.len(),
                d.rotary_dim,
                d.head_dim
            ),
        });
    }
    check_packed(d, format)?;
    let mut module = Module::new(&shape.module_name(format));
    if format.uses_kernels() {
        let object = kernels::object_file_name().ok_or_else(|| EmitError::Shape {
            op: "llama",
            detail: "the kernel weight format needs the kernels object, which this build (not \
                     x86-64) does not have"
                .to_owned(),
        })?;
        module.push_text(&kernels::executable_text(&object));
    }
    for window in shape.windows() {
        module.push(emit_step(d, shape, format, Step::Prefill, window)?);
        for rows in decode_batches(shape.batch) {
            module.push(emit_step(d, shape, format, Step::Decode(rows), window)?);
        }
    }
    Ok(module.to_text())
}

/// Whether every packed weight of `d` can be passed under `format` (for a format that packs:
/// 4- or 8-bit codes whose groups divide the rows, f16 or f32 scales, and, for the kernel
/// formats, groups the kernels take); the error names the first weight that cannot.
pub fn check_packed(d: &LlamaDims, format: WeightFormat) -> Result<(), EmitError> {
    if !format.is_packed() {
        return Ok(());
    }
    for spec in weight_specs(d) {
        let Some(p) = spec.packed else { continue };
        let in_dim = match spec.layout {
            Layout::AsIs => spec.dims.get(1),
            Layout::Transposed => spec.dims.first(),
        };
        let fits = spec.dims.len() == 2
            && matches!(p.bits, 4 | 8)
            && p.group > 0
            && in_dim.is_some_and(|&i| i % p.group as i64 == 0)
            && matches!(p.scales, ElementType::F16 | ElementType::F32)
            && match format {
                WeightFormat::Kernel => kernels::fits(&p),
                WeightFormat::KernelInt8 => kernels::fits_int8(&p),
                _ => true,
            };
        if !fits {
            return Err(EmitError::Shape {
                op: "llama",
                detail: format!(
                    "{}: cannot pass {} under the {} weight format ({}-bit, groups of {}, \
                     {:?} scales)",
                    spec.name,
                    TensorType::new(&spec.dims, ElementType::F32),
                    format.name(),
                    p.bits,
                    p.group,
                    p.scales
                ),
            });
        }
    }
    Ok(())
}

/// The weight format when `MLXCEL_XLA_WEIGHTS` does not choose one: where mlxcel's kernels run
/// ([`kernels::supported`]) and take every packed weight of `d`, [`WeightFormat::Kernel`], or
/// [`WeightFormat::KernelInt8`] for int8 activations; otherwise [`WeightFormat::F16`]. Int8
/// activations without the kernels are an error that says why.
pub fn default_format(d: &LlamaDims, int8: bool) -> Result<WeightFormat, String> {
    if !kernels::supported() {
        return if int8 {
            Err(
                "int8 activations on the OpenXLA backend need mlxcel's kernels (an x86-64 CPU \
                 with AVX-512 F/BW/VL/VNNI, FMA and F16C); use f32 activations"
                    .to_owned(),
            )
        } else {
            Ok(WeightFormat::F16)
        };
    }
    let format = if int8 {
        WeightFormat::KernelInt8
    } else {
        WeightFormat::Kernel
    };
    match check_packed(d, format) {
        Ok(()) => Ok(format),
        Err(e) if int8 => Err(format!(
            "int8 activations on the OpenXLA backend: {e}; use f32 activations"
        )),
        Err(_) => Ok(WeightFormat::F16),
    }
}
