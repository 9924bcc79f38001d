//! Fixture builders shared by the test modules: tiny GGUF llamas, byte-level vocabularies, and the
//! lossless-conversion check used on both fixtures and the real default model.

use std::path::Path;

use half::{bf16, f16};
use mlxcel_model::gguf::dequant::dequantize_reference;
use mlxcel_model::gguf::permute::permute_rows;
use mlxcel_model::gguf::{GgmlType, GgufFile, GgufValue, GgufWriter, hf_name_in};
use mlxcel_model::{Checkpoint, Dtype, dequantize_affine};

/// A small deterministic generator (xorshift), so fixtures are reproducible without a crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * (self.next_u32() as f32 / u32::MAX as f32)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u32() as u8).collect()
    }
}

/// GPT-2's byte-to-character map (`bytes_to_unicode`): the vocabulary strings of byte-level BPE.
pub fn byte_level_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (u32::from('!')..=u32::from('~'))
        .chain(u32::from('¡')..=u32::from('¬'))
        .chain(u32::from('®')..=u32::from('ÿ'))
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut by_byte = vec!['\0'; 256];
    for (b, c) in printable.into_iter().zip(chars) {
        by_byte[b as usize] = char::from_u32(c).expect("valid char");
    }
    by_byte
}

/// The tiny vocabulary: 3 specials, 256 byte tokens, then the merged tokens of [`MERGES`].
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const MERGES: [&str; 4] = ["Ġ t", "h e", "Ġt he", "Ġ Ġ"];

/// Token id of the byte-level token for byte `b`.
pub fn byte_token_id(b: u8) -> u32 {
    SPECIALS.len() as u32 + u32::from(b)
}

pub fn vocab() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3; SPECIALS.len()];
    tokens.extend(byte_level_chars().iter().map(char::to_string));
    types.extend([1; 256]);
    for merge in MERGES {
        tokens.push(merge.replace(' ', ""));
        types.push(1);
    }
    (tokens, types)
}

/// One random block of a supported type (scales small and positive so values are tame).
pub fn random_block(ty: GgmlType, rng: &mut Rng) -> Vec<u8> {
    if ty == GgmlType::MXFP4 {
        // A scale byte of 118..=122 (2^−10 .. 2^−6 on the doubled values, magnitudes up to
        // 0.19, as real weights), then 32 random codes.
        let mut out = vec![118 + (rng.next_u32() % 5) as u8];
        out.extend(rng.bytes(16));
        return out;
    }
    let half = |v: f32| f16::from_f32(v).to_le_bytes();
    let mut out = half(rng.uniform(0.001, 0.05)).to_vec();
    match ty {
        GgmlType::Q4_0 => out.extend(rng.bytes(16)),
        GgmlType::Q4_1 => {
            out.extend(half(rng.uniform(-0.3, 0.0)));
            out.extend(rng.bytes(16));
        }
        GgmlType::Q8_0 => out.extend(rng.bytes(32)),
        ty => {
            // Random bytes, with small finite f16s where the type keeps its scales (random bytes
            // there could be NaN or huge).
            let f16_fields: &[usize] = match ty {
                GgmlType::Q5_0 | GgmlType::Q6_K | GgmlType::Q3_K => &[],
                GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[2],
                GgmlType::Q2_K => &[80, 82],
                other => unreachable!("no random blocks of {other}"),
            };
            let (_, nbytes) = ty.layout().expect("a block type");
            out.extend(rng.bytes(nbytes - 2));
            for &at in f16_fields {
                out[at..at + 2].copy_from_slice(&half(rng.uniform(0.001, 0.05)));
            }
            // Q6_K and Q3_K keep `d` last: move the leading f16 there.
            if matches!(ty, GgmlType::Q6_K | GgmlType::Q3_K) {
                out.rotate_left(2);
            }
        }
    }
    out
}

/// Random data for a tensor of `elements` elements of type `ty`.
pub fn random_tensor(ty: GgmlType, elements: usize, rng: &mut Rng) -> Vec<u8> {
    match ty {
        GgmlType::F32 => (0..elements)
            .flat_map(|_| rng.uniform(-1.0, 1.0).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..elements)
            .flat_map(|_| f16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..elements)
            .flat_map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes())
            .collect(),
        _ => {
            let (block_len, _) = ty.layout().expect("a block type");
            (0..elements / block_len)
                .flat_map(|_| random_block(ty, rng))
                .collect()
        }
    }
}

/// Shape and types of a tiny llama GGUF (or of a relative: `arch` is GGUF's
/// `general.architecture`, e.g. `qwen3` with `qk_norm`, or `smollm3`).
pub struct TinyLlama {
    pub arch: &'static str,
    /// Per-head q/k norm weights (`attn_q_norm`, `attn_k_norm`), as Qwen3 has.
    pub qk_norm: bool,
    /// Gemma's post-attention and post-MLP norms (`post_attention_norm`, `post_ffw_norm`);
    /// norm weights are then drawn in [0.5, 1.5), as llama.cpp's `1 + w`.
    pub sandwich: bool,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub tied: bool,
    pub chat_template: Option<&'static str>,
    /// Type of each linear, by GGUF part name.
    pub linear_type: fn(&str) -> GgmlType,
    pub embed_type: GgmlType,
    /// Normal tokens appended to [`vocab`] (`<extra_0>`, ...), e.g. to make the vocabulary a
    /// multiple of 16 rows (263 + 9 = 272).
    pub extra_tokens: usize,
}

impl Default for TinyLlama {
    fn default() -> Self {
        Self {
            arch: "llama",
            qk_norm: false,
            sandwich: false,
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            ffn: 96,
            tied: true,
            chat_template: Some(SMOLLM2_TEMPLATE),
            linear_type: |part| match part {
                "attn_q" => GgmlType::Q4_0,
                "attn_k" => GgmlType::Q4_1,
                "attn_v" => GgmlType::F16,
                "attn_output" => GgmlType::BF16,
                "ffn_gate" => GgmlType::Q8_0,
                "output" => GgmlType::Q4_0,
                _ => GgmlType::Q4_1,
            },
            embed_type: GgmlType::Q8_0,
            extra_tokens: 0,
        }
    }
}

/// The chat template in the default model's GGUF metadata.
pub const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

impl TinyLlama {
    /// [`vocab`] and this model's extra tokens.
    pub fn tokens(&self) -> (Vec<String>, Vec<i32>) {
        let (mut tokens, mut types) = vocab();
        tokens.extend((0..self.extra_tokens).map(|i| format!("<extra_{i}>")));
        types.extend(std::iter::repeat_n(1, self.extra_tokens));
        (tokens, types)
    }

    /// The GGUF writer with metadata (no tensors yet) for this shape.
    pub fn metadata(&self) -> GgufWriter {
        let (tokens, types) = self.tokens();
        let mut w = GgufWriter::new();
        let u32v = |v: usize| GgufValue::U32(v as u32);
        let strings =
            |v: &[String]| GgufValue::Array(v.iter().cloned().map(GgufValue::String).collect());
        let key = |k: &str| format!("{}.{k}", self.arch);
        w.metadata("general.architecture", GgufValue::String(self.arch.into()))
            .metadata(&key("block_count"), u32v(self.layers))
            .metadata(&key("context_length"), u32v(2048))
            .metadata(&key("embedding_length"), u32v(self.hidden))
            .metadata(&key("feed_forward_length"), u32v(self.ffn))
            .metadata(&key("attention.head_count"), u32v(self.heads))
            .metadata(&key("attention.head_count_kv"), u32v(self.kv_heads))
            .metadata(&key("rope.freq_base"), GgufValue::F32(100_000.0))
            .metadata(
                &key("attention.layer_norm_rms_epsilon"),
                GgufValue::F32(1e-5),
            )
            .metadata("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
            .metadata("tokenizer.ggml.pre", GgufValue::String("smollm".into()))
            .metadata("tokenizer.ggml.tokens", strings(&tokens))
            .metadata(
                "tokenizer.ggml.token_type",
                GgufValue::Array(types.into_iter().map(GgufValue::I32).collect()),
            )
            .metadata("tokenizer.ggml.merges", strings(&MERGES.map(String::from)))
            .metadata("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
            .metadata("tokenizer.ggml.eos_token_id", GgufValue::U32(2))
            .metadata("tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
        if let Some(template) = self.chat_template {
            w.metadata(
                "tokenizer.chat_template",
                GgufValue::String(template.into()),
            );
        }
        w
    }

    /// Writes the model with random weights to `path`.
    pub fn write(&self, path: &Path, seed: u64) {
        self.write_with(self.metadata(), path, seed);
    }

    /// [`TinyLlama::write`] with the caller's metadata (e.g. [`TinyLlama::metadata`] plus keys).
    pub fn write_with(&self, mut w: GgufWriter, path: &Path, seed: u64) {
        let mut rng = Rng::new(seed);
        let vocab_size = self.tokens().0.len();
        let head_dim = self.hidden / self.heads;
        let sandwich = self.sandwich;
        let mut add = |w: &mut GgufWriter, name: &str, dims: &[u64], ty: GgmlType| {
            let elements = dims.iter().product::<u64>() as usize;
            let data = if sandwich && name.ends_with("norm.weight") {
                (0..elements)
                    .flat_map(|_| rng.uniform(0.5, 1.5).to_le_bytes())
                    .collect()
            } else {
                random_tensor(ty, elements, &mut rng)
            };
            w.tensor(name, dims, ty, data);
        };
        let h = self.hidden as u64;
        add(
            &mut w,
            "token_embd.weight",
            &[h, vocab_size as u64],
            self.embed_type,
        );
        for l in 0..self.layers {
            let lin = |part: &str| (self.linear_type)(part);
            add(
                &mut w,
                &format!("blk.{l}.attn_norm.weight"),
                &[h],
                GgmlType::F32,
            );
            let phi3 = self.arch == "phi3";
            if phi3 {
                let rows = (self.heads + 2 * self.kv_heads) * head_dim;
                add(
                    &mut w,
                    &format!("blk.{l}.attn_qkv.weight"),
                    &[h, rows as u64],
                    lin("attn_q"),
                );
            }
            if !phi3 {
                add(
                    &mut w,
                    &format!("blk.{l}.attn_q.weight"),
                    &[h, (self.heads * head_dim) as u64],
                    lin("attn_q"),
                );
                add(
                    &mut w,
                    &format!("blk.{l}.attn_k.weight"),
                    &[h, (self.kv_heads * head_dim) as u64],
                    lin("attn_k"),
                );
                add(
                    &mut w,
                    &format!("blk.{l}.attn_v.weight"),
                    &[h, (self.kv_heads * head_dim) as u64],
                    lin("attn_v"),
                );
            }
            add(
                &mut w,
                &format!("blk.{l}.attn_output.weight"),
                &[(self.heads * head_dim) as u64, h],
                lin("attn_output"),
            );
            if self.qk_norm {
                for norm in ["attn_q_norm", "attn_k_norm"] {
                    add(
                        &mut w,
                        &format!("blk.{l}.{norm}.weight"),
                        &[head_dim as u64],
                        GgmlType::F32,
                    );
                }
            }
            if self.sandwich {
                for norm in ["post_attention_norm", "post_ffw_norm"] {
                    add(
                        &mut w,
                        &format!("blk.{l}.{norm}.weight"),
                        &[h],
                        GgmlType::F32,
                    );
                }
            }
            add(
                &mut w,
                &format!("blk.{l}.ffn_norm.weight"),
                &[h],
                GgmlType::F32,
            );
            if !phi3 {
                add(
                    &mut w,
                    &format!("blk.{l}.ffn_gate.weight"),
                    &[h, self.ffn as u64],
                    lin("ffn_gate"),
                );
            }
            // Phi-3's `ffn_up` holds gate then up.
            let up_rows = if phi3 { 2 * self.ffn } else { self.ffn };
            add(
                &mut w,
                &format!("blk.{l}.ffn_up.weight"),
                &[h, up_rows as u64],
                lin("ffn_up"),
            );
            add(
                &mut w,
                &format!("blk.{l}.ffn_down.weight"),
                &[self.ffn as u64, h],
                lin("ffn_down"),
            );
        }
        add(&mut w, "output_norm.weight", &[h], GgmlType::F32);
        if !self.tied {
            add(
                &mut w,
                "output.weight",
                &[h, vocab_size as u64],
                (self.linear_type)("output"),
            );
        }
        let mut file = std::fs::File::create(path).expect("create fixture");
        w.write(&mut file).expect("write fixture");
    }
}

/// Dequantizes every tensor of `converted` (f32 arithmetic) and checks it equals llama.cpp's
/// dequantization of the GGUF tensor it came from, bit for bit, after undoing the q/k permutation.
/// Returns the number of tensors compared.
pub fn assert_lossless(gguf_path: &Path, converted: &Checkpoint) -> usize {
    let gguf = GgufFile::open(gguf_path).expect("open gguf");
    let config = converted.config();
    let mut compared = 0;
    for info in &gguf.tensors {
        if info.name.starts_with("rope_factors_") {
            continue; // LongRoPE's factors are config, not weights
        }
        let (module, suffix) = hf_name_in(config.architecture, &info.name).expect("known tensor");
        let expected = dequantize_reference(info.ggml_type, gguf.tensor_data(info).expect("data"))
            .expect("supported");
        let shape = info.shape();
        let (rows, cols) = if shape.len() == 2 {
            (shape[0], shape[1])
        } else {
            (shape[0], 1)
        };
        // What llama.cpp stored is HF order permuted (for the families it converts as llamas);
        // permute our rows to compare in GGUF order.
        let permuted = (module.ends_with("q_proj") || module.ends_with("k_proj"))
            && config.architecture.gguf_permuted_qk();
        // One module's values; Phi-3's fused modules are their parts, row after row.
        let values = |module: &str, rows: usize| -> Vec<f32> {
            match converted
                .quantization_of(module)
                .filter(|_| suffix == "weight")
            {
                Some(spec) => {
                    let t = |part: &str| {
                        converted
                            .tensor(&format!("{module}.{part}"))
                            .expect("tensor present")
                    };
                    let (w, s, b) = (t("weight"), t("scales"), t("biases"));
                    dequantize_affine(
                        spec,
                        rows,
                        cols,
                        w.data,
                        (s.dtype, s.data),
                        (b.dtype, b.data),
                    )
                    .expect("sizes fit")
                }
                None => {
                    let t = converted
                        .tensor(&format!("{module}.{suffix}"))
                        .expect("tensor present");
                    let elements: usize = t.shape.iter().product();
                    assert_eq!(elements, rows * cols, "{}", t.name);
                    floats(t.dtype, t.data)
                }
            }
        };
        let parts: Option<Vec<(String, usize)>> =
            module.rsplit_once('.').and_then(|(stem, last)| {
                let (q, kv, ffn) = (config.q_dim(), config.kv_dim(), config.intermediate_size);
                match last {
                    "qkv_proj" => Some(vec![
                        (format!("{stem}.q_proj"), q),
                        (format!("{stem}.k_proj"), kv),
                        (format!("{stem}.v_proj"), kv),
                    ]),
                    "gate_up_proj" => Some(vec![
                        (format!("{stem}.gate_proj"), ffn),
                        (format!("{stem}.up_proj"), ffn),
                    ]),
                    _ => None,
                }
            });
        let actual: Vec<f32> = match parts {
            Some(parts) => parts.iter().flat_map(|(m, r)| values(m, *r)).collect(),
            None => values(&module, rows),
        };
        // Gemma's norms are stored as `1 + w` by llama.cpp and as `w` in the checkpoint: the
        // loader adds the one back.
        let gemma = config.norm_weight_offset;
        let actual: Vec<f32> = if gemma && module.ends_with("norm") {
            actual.iter().map(|w| w + 1.0).collect()
        } else {
            actual
        };
        let actual = if permuted {
            let bytes: Vec<u8> = actual.iter().flat_map(|v| v.to_le_bytes()).collect();
            permute_rows(&bytes, rows, config.head_dim)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        } else {
            actual
        };
        assert_eq!(actual.len(), expected.len(), "{}", info.name);
        let mismatch = actual
            .iter()
            .zip(&expected)
            // Bit for bit, except that llama.cpp's −0 (a negative scale times a zero level) is
            // +0 in the affine form (see `same_value` in gguf.rs).
            .position(|(a, e)| a.to_bits() != e.to_bits() && !(*a == 0.0 && *e == 0.0));
        if let Some(i) = mismatch {
            panic!(
                "{} ({}): element {i}: converted {} != llama.cpp {}",
                info.name, info.ggml_type, actual[i], expected[i]
            );
        }
        compared += 1;
    }
    compared
}

pub fn floats(dtype: Dtype, data: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => panic!("not a float dtype: {other}"),
    }
}
