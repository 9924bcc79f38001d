//! Writes every readable tensor of a GGUF file, dequantized by mlxcel exactly as llama.cpp does,
//! as raw little-endian f32 (`<out dir>/<tensor name>.f32`), for scripts/check-dequant to compare
//! with the `gguf` package's own dequantization.
//!
//! Usage: cargo run --release -p mlxcel-model --example dequantize -- FILE.gguf OUT_DIR

use std::path::PathBuf;

use mlxcel_model::gguf::GgufFile;
use mlxcel_model::gguf::dequant::dequantize_reference;

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
    }
    println!("{written} tensors");
    Ok(())
}
