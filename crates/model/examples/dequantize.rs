//! Writes every readable tensor of a GGUF file, dequantized by mlxcel exactly as llama.cpp does,
//! as raw little-endian f32 (`<out dir>/<tensor name>.f32`), for scripts/check-dequant to compare
//! with the `gguf` package's own dequantization. For block types it also writes the values of the
//! form `mlxcel convert` stores (`<name>.affine.f32`): the affine groups packed into MLX words with
//! f32 scales and biases, then `scale · q + bias` in f32 from those tensors; a tensor without that
//! form (an MXFP4 block with a scale byte above 251, `affine_form_refusal`) is said so instead.
//!
//! Usage: cargo run --release -p mlxcel-model --example dequantize -- FILE.gguf OUT_DIR

use std::path::PathBuf;

use mlxcel_model::gguf::GgufFile;
use mlxcel_model::gguf::dequant::{
    affine_bits, affine_form_refusal, affine_group_size, affine_groups, dequantize_reference,
};
use mlxcel_model::{Dtype, QuantSpec, dequantize_affine, pack};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let (Some(file), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: dequantize FILE.gguf OUT_DIR".into());
    };
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out)?;
    let gguf = GgufFile::open(&PathBuf::from(file))?;
    let mut written = 0;
    for info in &gguf.tensors {
        let data = gguf.tensor_data(info)?;
        let values = dequantize_reference(info.ggml_type, data)
            .ok_or_else(|| format!("{}: {} is not readable", info.name, info.ggml_type))?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(out.join(format!("{}.f32", info.name)), bytes)?;
        written += 1;
        if let Some(reason) = affine_form_refusal(info.ggml_type, data) {
            eprintln!("{}: no affine form: {reason}", info.name);
            continue;
        }
        if let (Some(bits), Some((_, block_bytes))) =
            (affine_bits(info.ggml_type), info.ggml_type.layout())
        {
            let (mut words, mut scales, mut biases) = (Vec::new(), Vec::new(), Vec::new());
            for block in data.chunks_exact(block_bytes) {
                for group in affine_groups(info.ggml_type, block) {
                    words.extend(
                        pack(group.values(), bits)
                            .iter()
                            .flat_map(|w| w.to_le_bytes()),
                    );
                    scales.extend(group.scale.to_le_bytes());
                    biases.extend(group.bias.to_le_bytes());
                }
            }
            let spec = QuantSpec {
                bits,
                group_size: affine_group_size(info.ggml_type),
            };
            // One row of every value: groups never straddle the tensor's rows.
            let affine = dequantize_affine(
                spec,
                1,
                values.len(),
                &words,
                (Dtype::F32, &scales),
                (Dtype::F32, &biases),
            )
            .ok_or("affine sizes do not fit")?;
            let bytes: Vec<u8> = affine.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(out.join(format!("{}.affine.f32", info.name)), bytes)?;
        }
    }
    println!("{written} tensors");
    Ok(())
}
