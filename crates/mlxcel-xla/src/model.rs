//! The llama-family model on IREE: weights uploaded once, one compiled module and one set of KV
//! caches per context capacity.

use std::collections::BTreeMap;
use std::time::Instant;

use mlxcel_model::Checkpoint;

use crate::abi::{LlamaDims, ProgramShape, WeightFormat, cache_type, weight_specs};
use crate::compiler::Compiler;
use crate::error::{Error, Result};
use crate::program::{decode_batches, decode_function, emit_llama};
use crate::runtime::{BufferId, Runtime, copy_tensors_then_release};
use crate::weights::{checkpoint_dims, weight_buffers};

/// How the model is compiled. The default weight format here is f16: of the formats IREE's own
/// code multiplies it measured fastest on the default model (40 against 31.5 and 8.9 tok/s for
/// f32 and packed, decoding one sequence at capacity 256), with logits within 3.3e-2 of the MLX
/// backend's. The engine replaces it, unless `MLXCEL_XLA_WEIGHTS` is set, with mlxcel's kernels
/// where they run (`program::default_format`: `kernel` or `kernel-int8`, 1.2–1.8× f16's decode).
/// Eight cache rows by default, so that eight streams decode together. See docs/xla.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XlaOptions {
    pub format: WeightFormat,
    /// Whether `MLXCEL_XLA_WEIGHTS` chose `format` (else an embedder may choose by the
    /// checkpoint and the activations: [`crate::program::default_format`]).
    pub format_from_env: bool,
    /// Cache rows per capacity (decode batch).
    pub max_batch: usize,
    /// Tokens per prefill call.
    pub chunk: usize,
    /// The smallest attention window (`ProgramShape::min_window`; 0: every step attends over
    /// the whole capacity).
    pub min_window: usize,
}

/// Selects the weight format (`f32`, `f16`, `packed`, `kernel` or `kernel-int8`); unset, the
/// engine's choice by the checkpoint and the activations (`program::default_format`).
pub const WEIGHTS_ENV: &str = "MLXCEL_XLA_WEIGHTS";

/// Cache rows per capacity, the decode batch (an integer ≥ 1); unset, the default's.
pub const MAX_BATCH_ENV: &str = "MLXCEL_XLA_MAX_BATCH";

/// The smallest attention window (a power of two ≥ 16, or 0 for none); unset, the default's.
pub const MIN_WINDOW_ENV: &str = "MLXCEL_XLA_MIN_WINDOW";

impl XlaOptions {
    /// The default options with `MLXCEL_XLA_WEIGHTS`, `MLXCEL_XLA_MAX_BATCH` and
    /// `MLXCEL_XLA_MIN_WINDOW` applied; an invalid value is an error naming the variable and the
    /// value.
    pub fn from_env() -> Result<Self> {
        let read = |name: &'static str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self::from_values(
            read(WEIGHTS_ENV).as_deref(),
            read(MAX_BATCH_ENV).as_deref(),
            read(MIN_WINDOW_ENV).as_deref(),
        )
    }

    fn from_values(
        weights: Option<&str>,
        max_batch: Option<&str>,
        min_window: Option<&str>,
    ) -> Result<Self> {
        let mut options = Self::default();
        if let Some(name) = weights {
            options.format_from_env = true;
            options.format = WeightFormat::from_name(name)
                .filter(|&f| !f.uses_kernels() || crate::kernels::supported())
                .ok_or_else(|| Error::Config {
                    variable: WEIGHTS_ENV,
                    value: name.to_owned(),
                    expected: if crate::kernels::supported() {
                        "f32, f16, packed, kernel or kernel-int8"
                    } else {
                        "f32, f16 or packed (kernel and kernel-int8 need an x86-64 CPU with AVX-512 \
                         F/BW/VL/VNNI, FMA and F16C)"
                    },
                })?;
        }
        if let Some(text) = max_batch {
            options.max_batch = text
                .parse::<usize>()
                .ok()
                .filter(|&b| (1..=i32::MAX as usize).contains(&b))
                .ok_or_else(|| Error::Config {
                    variable: MAX_BATCH_ENV,
                    value: text.to_owned(),
                    expected: "an integer ≥ 1",
                })?;
        }
        if let Some(text) = min_window {
            options.min_window = text
                .parse::<usize>()
                .ok()
                .filter(|&w| w == 0 || (w >= 16 && w.is_power_of_two() && w <= 1 << 30))
                .ok_or_else(|| Error::Config {
                    variable: MIN_WINDOW_ENV,
                    value: text.to_owned(),
                    expected: "0 (no windows) or a power of two from 16 to 2^30",
                })?;
        }
        Ok(options)
    }
}

impl Default for XlaOptions {
    fn default() -> Self {
        Self {
            format: WeightFormat::F16,
            format_from_env: false,
            max_batch: 8,
            chunk: 32,
            min_window: 256,
        }
    }
}

/// One compiled capacity: its module and its KV caches (keys then values, one per layer).
#[derive(Debug)]
struct Capacity {
    shape: ProgramShape,
    module: String,
    caches: Vec<BufferId>,
}

/// One decode entry: a cache row, the position its token goes to, the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeEntry {
    pub row: usize,
    pub position: usize,
    pub token: u32,
}

/// The model on the IREE runtime.
#[derive(Debug)]
pub struct XlaModel {
    runtime: Runtime,
    compiler: Compiler,
    dims: LlamaDims,
    options: XlaOptions,
    weights: Vec<BufferId>,
    capacities: BTreeMap<usize, Capacity>,
    compilations: u64,
}

fn out_of_range(what: &'static str, value: usize, range: String) -> Error {
    Error::OutOfRange {
        what,
        value: value as i64,
        range,
    }
}

impl XlaModel {
    /// Starts the runtime and uploads every weight once.
    pub fn load(checkpoint: &Checkpoint, compiler: Compiler, options: XlaOptions) -> Result<Self> {
        let dims = checkpoint_dims(checkpoint)?;
        let runtime = Runtime::start()?;
        let started = Instant::now();
        let mut weights = Vec::new();
        for spec in weight_specs(&dims) {
            // Uploaded, then the checkpoint's bytes (mapped, or converted from a GGUF file) go.
            let module = spec.name.strip_suffix(".weight").unwrap_or(&spec.name);
            let names = [
                spec.name.clone(),
                format!("{module}.scales"),
                format!("{module}.biases"),
            ];
            let uploaded = copy_tensors_then_release(checkpoint, &names, |checkpoint| {
                weight_buffers(checkpoint, &spec, options.format)?
                    .into_iter()
                    .map(|(bytes, shape, element)| runtime.upload(bytes, shape, element))
                    .collect::<Result<Vec<_>>>()
            })?;
            weights.extend(uploaded);
        }
        tracing::debug!(
            "mlxcel-xla: {} weights uploaded ({}) in {:?}",
            weights.len(),
            options.format.name(),
            started.elapsed()
        );
        Ok(Self {
            runtime,
            compiler,
            dims,
            options,
            weights,
            capacities: BTreeMap::new(),
            compilations: 0,
        })
    }

    pub fn dims(&self) -> &LlamaDims {
        &self.dims
    }

    pub fn options(&self) -> XlaOptions {
        self.options
    }

    /// Modules compiled (not found in the cache) by this model so far.
    pub fn compilations(&self) -> u64 {
        self.compilations
    }

    /// The program text for `capacity` (for inspection and tests).
    pub fn program(&self, capacity: usize) -> Result<String> {
        Ok(emit_llama(
            &self.dims,
            &self.shape(capacity),
            self.options.format,
        )?)
    }

    fn shape(&self, capacity: usize) -> ProgramShape {
        ProgramShape {
            context_capacity: capacity,
            batch: self.options.max_batch,
            chunk: self.options.chunk,
            min_window: self.options.min_window,
        }
    }

    /// Compiles (or finds in the cache) and loads `capacity`'s module and allocates its caches.
    pub fn ensure_capacity(&mut self, capacity: usize) -> Result<()> {
        self.ensure_capacities(&[capacity])
    }

    /// [`Self::ensure_capacity`] for each of `capacities` in turn. A compile is the slow part of a
    /// first run (seconds per capacity), so each one is logged (`tracing`, info) before it starts,
    /// as `compiling capacity 256 (1/3) …`, and when it ends, with its time.
    pub fn ensure_capacities(&mut self, capacities: &[usize]) -> Result<()> {
        for (index, &capacity) in capacities.iter().enumerate() {
            self.ensure_one(capacity, index + 1, capacities.len())?;
        }
        Ok(())
    }

    fn ensure_one(&mut self, capacity: usize, index: usize, total: usize) -> Result<()> {
        if self.capacities.contains_key(&capacity) {
            return Ok(());
        }
        if capacity == 0 || capacity > i32::MAX as usize - self.options.chunk {
            return Err(out_of_range(
                "context capacity",
                capacity,
                format!("1..={}", i32::MAX as usize - self.options.chunk),
            ));
        }
        let shape = self.shape(capacity);
        let program = emit_llama(&self.dims, &shape, self.options.format)?;
        let started = Instant::now();
        if !self.compiler.is_cached(&program) {
            tracing::info!("compiling capacity {capacity} ({index}/{total}) …");
        }
        let compiled = self.compiler.compile(&program)?;
        if compiled.compiled {
            self.compilations += 1;
            tracing::info!(
                "compiled capacity {capacity} ({index}/{total}) in {:.1} s ({})",
                started.elapsed().as_secs_f64(),
                compiled.path.display()
            );
        }
        self.runtime.load_module(&compiled.path)?;
        let ty = cache_type(&self.dims, &shape);
        let dims: Vec<usize> = ty.dims.iter().map(|&d| d as usize).collect();
        let bytes = ty.elements() as usize * 4;
        let mut caches = Vec::with_capacity(2 * self.dims.layers);
        for _ in 0..2 * self.dims.layers {
            caches.push(
                self.runtime
                    .upload(vec![0u8; bytes], dims.clone(), ty.element)?,
            );
        }
        self.capacities.insert(
            capacity,
            Capacity {
                shape,
                module: shape.module_name(self.options.format),
                caches,
            },
        );
        Ok(())
    }

    fn check_token(&self, token: u32) -> Result<i32> {
        if (token as usize) < self.dims.vocab {
            Ok(token as i32)
        } else {
            Err(out_of_range(
                "token",
                token as usize,
                format!("0..{}", self.dims.vocab),
            ))
        }
    }

    /// Runs one function of `capacity`'s module; the caches are donated and replaced by the
    /// results. Returns the logits (`rows × vocab`).
    fn call(
        &mut self,
        capacity: usize,
        function: &str,
        step_args: Vec<BufferId>,
        rows: usize,
    ) -> Result<Vec<f32>> {
        let cap = self
            .capacities
            .get_mut(&capacity)
            .ok_or_else(|| Error::Runtime(format!("capacity {capacity} is not loaded")))?;
        let mut args = self.weights.clone();
        args.extend(&cap.caches);
        args.extend(&step_args);
        let mut donated = cap.caches.clone();
        donated.extend(&step_args);
        let results = self
            .runtime
            .call(&format!("{}.{function}", cap.module), args, donated)?;
        if results.len() != 1 + cap.caches.len() {
            return Err(Error::Runtime(format!(
                "{function} returned {} results, expected {}",
                results.len(),
                1 + cap.caches.len()
            )));
        }
        cap.caches = results[1..].to_vec();
        let logits = self.runtime.read_f32(results[0], rows * self.dims.vocab);
        self.runtime.release(vec![results[0]]);
        logits
    }

    /// Prefills `tokens` into cache `row` of `capacity` from position `start`, chunk by chunk;
    /// returns the logits of the last token.
    pub fn prefill(
        &mut self,
        capacity: usize,
        row: usize,
        start: usize,
        tokens: &[u32],
    ) -> Result<Vec<f32>> {
        self.ensure_capacity(capacity)?;
        let chunk = self.options.chunk;
        if row >= self.options.max_batch {
            return Err(out_of_range(
                "cache row",
                row,
                format!("0..{}", self.options.max_batch),
            ));
        }
        if tokens.is_empty() || start + tokens.len() > capacity {
            return Err(out_of_range(
                "prefill end position",
                start + tokens.len(),
                format!("{}..={capacity}", start + 1),
            ));
        }
        let shape = self.shape(capacity);
        let mut logits = Vec::new();
        for (i, piece) in tokens.chunks(chunk).enumerate() {
            let mut ids = piece
                .iter()
                .map(|&t| self.check_token(t))
                .collect::<Result<Vec<i32>>>()?;
            ids.resize(chunk, 0);
            let position = start + i * chunk;
            let function = shape.function("prefill", shape.window_for(position + piece.len()));
            let args = vec![
                self.runtime.upload_i32(&ids, vec![chunk])?,
                self.runtime.upload_i32(&[row as i32], vec![])?,
                self.runtime.upload_i32(&[position as i32], vec![])?,
                self.runtime.upload_i32(&[piece.len() as i32 - 1], vec![])?,
            ];
            logits = self.call(capacity, &function, args, 1)?;
        }
        Ok(logits)
    }

    /// One decode step over `entries` (distinct rows of `capacity`), by the smallest decode
    /// function that covers the highest row; rows it covers without an entry run on scratch
    /// positions. Returns each entry's logits, in order.
    pub fn decode(&mut self, capacity: usize, entries: &[DecodeEntry]) -> Result<Vec<Vec<f32>>> {
        self.ensure_capacity(capacity)?;
        let max_batch = self.options.max_batch;
        let highest = entries.iter().map(|e| e.row + 1).max().unwrap_or(1);
        let batch = decode_batches(max_batch)
            .into_iter()
            .find(|&rows| rows >= highest)
            .unwrap_or(max_batch);
        // Rows nobody decodes write at the first scratch position, `capacity`.
        let mut tokens = vec![0i32; batch];
        let mut positions = vec![capacity as i32; batch];
        let mut seen = vec![false; batch];
        for e in entries {
            if e.row >= batch || seen[e.row] {
                return Err(out_of_range(
                    "cache row (or repeated row)",
                    e.row,
                    format!("0..{batch}"),
                ));
            }
            if e.position >= capacity {
                return Err(out_of_range(
                    "decode position",
                    e.position,
                    format!("0..{capacity}"),
                ));
            }
            seen[e.row] = true;
            tokens[e.row] = self.check_token(e.token)?;
            positions[e.row] = e.position as i32;
        }
        let args = vec![
            self.runtime.upload_i32(&tokens, vec![batch])?,
            self.runtime.upload_i32(&positions, vec![batch])?,
        ];
        // Rows nobody decodes attend over whatever the window holds: their logits are dropped.
        let reach = entries.iter().map(|e| e.position + 1).max().unwrap_or(1);
        let shape = self.shape(capacity);
        let function = shape.function(&decode_function(batch, max_batch), shape.window_for(reach));
        let flat = self.call(capacity, &function, args, batch)?;
        let vocab = self.dims.vocab;
        Ok(entries
            .iter()
            .map(|e| flat[e.row * vocab..(e.row + 1) * vocab].to_vec())
            .collect())
    }

    /// Floats one position holds in one cache buffer (`kv_heads × head_dim`).
    fn position_floats(&self) -> usize {
        self.dims.kv_heads * self.dims.head_dim
    }

    /// Floats of keys and values one position holds over every layer: what
    /// [`Self::export_positions`] returns per position.
    pub fn floats_per_position(&self) -> usize {
        self.position_floats() * 2 * self.dims.layers
    }

    /// The caches of a loaded capacity and, for each kv head, the float offset of `row`'s
    /// position 0 in each (caches are `[batch, kv_heads, positions, head_dim]`, so a row's first
    /// `len` positions are one run of `len × head_dim` floats per head), after checking that
    /// `len` positions fit the row.
    fn row_runs(
        &self,
        capacity: usize,
        row: usize,
        len: usize,
    ) -> Result<(&[BufferId], Vec<usize>)> {
        let cap = self
            .capacities
            .get(&capacity)
            .ok_or_else(|| Error::Runtime(format!("capacity {capacity} is not loaded")))?;
        if row >= cap.shape.batch {
            return Err(out_of_range(
                "cache row",
                row,
                format!("0..{}", cap.shape.batch),
            ));
        }
        if len > capacity {
            return Err(out_of_range("positions", len, format!("0..={capacity}")));
        }
        let (heads, head_dim) = (self.dims.kv_heads, self.dims.head_dim);
        let head_floats = cap.shape.cache_len() * head_dim;
        let offsets = (0..heads)
            .map(|h| (row * heads + h) * head_floats)
            .collect();
        Ok((&cap.caches, offsets))
    }

    /// Makes the first `len` positions of cache row `to_row` of `to_capacity` a copy of those of
    /// row `from_row` of `from_capacity` (every layer's keys and values), on the device: a cached
    /// prefix reused by another sequence, in the same capacity or another. Positions past `len`
    /// in the target row are left as they are (they are written before they are read).
    pub fn copy_positions(
        &mut self,
        (from_capacity, from_row): (usize, usize),
        (to_capacity, to_row): (usize, usize),
        len: usize,
    ) -> Result<()> {
        self.ensure_capacity(to_capacity)?;
        let (from, from_offsets) = self.row_runs(from_capacity, from_row, len)?;
        let from = from.to_vec();
        let (to, to_offsets) = self.row_runs(to_capacity, to_row, len)?;
        if (from_capacity, from_row) == (to_capacity, to_row) || len == 0 {
            return Ok(());
        }
        let floats = len * self.dims.head_dim;
        for (&source, &target) in from.iter().zip(to) {
            for (&from_offset, &to_offset) in from_offsets.iter().zip(&to_offsets) {
                self.runtime
                    .copy_f32_range(source, from_offset, target, to_offset, floats)?;
            }
        }
        Ok(())
    }

    /// The first `len` positions of cache row `row` of `capacity` on the host: for each cache
    /// buffer in turn (keys then values, one per layer), `len × kv_heads × head_dim` floats,
    /// position-major.
    pub fn export_positions(&self, capacity: usize, row: usize, len: usize) -> Result<Vec<f32>> {
        let (caches, offsets) = self.row_runs(capacity, row, len)?;
        let (heads, head_dim) = (self.dims.kv_heads, self.dims.head_dim);
        let floats = len * self.position_floats();
        let mut out = vec![0f32; floats * caches.len()];
        for (&cache, part) in caches.iter().zip(out.chunks_exact_mut(floats.max(1))) {
            for (h, &offset) in offsets.iter().enumerate() {
                let run = self.runtime.read_f32_range(cache, offset, len * head_dim)?;
                for (p, values) in run.chunks_exact(head_dim).enumerate() {
                    let at = (p * heads + h) * head_dim;
                    part[at..at + head_dim].copy_from_slice(values);
                }
            }
        }
        Ok(out)
    }

    /// Writes [`Self::export_positions`]'s layout of `len` positions into cache row `row` of
    /// `capacity`.
    pub fn import_positions(
        &mut self,
        capacity: usize,
        row: usize,
        len: usize,
        data: &[f32],
    ) -> Result<()> {
        self.ensure_capacity(capacity)?;
        let floats = len * self.position_floats();
        let (caches, offsets) = self.row_runs(capacity, row, len)?;
        if data.len() != floats * caches.len() {
            return Err(Error::Runtime(format!(
                "{} floats for {len} positions of {} floats each",
                data.len(),
                self.floats_per_position()
            )));
        }
        let (heads, head_dim) = (self.dims.kv_heads, self.dims.head_dim);
        let mut run = vec![0f32; len * head_dim];
        for (&cache, part) in caches.iter().zip(data.chunks_exact(floats.max(1))) {
            for (h, &offset) in offsets.iter().enumerate() {
                for (p, values) in run.chunks_exact_mut(head_dim).enumerate() {
                    let at = (p * heads + h) * head_dim;
                    values.copy_from_slice(&part[at..at + head_dim]);
                }
                self.runtime.write_f32_range(cache, offset, &run)?;
            }
        }
        Ok(())
    }

    /// The compiled shape of `capacity`, if loaded.
    pub fn loaded_shape(&self, capacity: usize) -> Option<ProgramShape> {
        self.capacities.get(&capacity).map(|c| c.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_from_the_environment_values() {
        let defaults = XlaOptions::from_values(None, None, None).unwrap();
        assert_eq!(defaults, XlaOptions::default());
        assert_eq!(defaults.max_batch, 8);
        let packed = XlaOptions::from_values(Some("packed"), Some("2"), Some("0")).unwrap();
        assert_eq!(packed.min_window, 0);
        assert_eq!(defaults.min_window, 256);
        assert_eq!(packed.format, WeightFormat::Packed);
        assert_eq!(packed.max_batch, 2);
        let f32 = XlaOptions::from_values(Some("f32"), None, Some("64")).unwrap();
        assert_eq!(f32.min_window, 64);
        assert_eq!(f32.format, WeightFormat::F32);
        assert!(packed.format_from_env && !defaults.format_from_env);
        let err = XlaOptions::from_values(Some("int4"), None, None).unwrap_err();
        let kernel = XlaOptions::from_values(Some("kernel-int8"), None, None);
        if crate::kernels::supported() {
            assert_eq!(
                err.to_string(),
                "MLXCEL_XLA_WEIGHTS=\"int4\": expected f32, f16, packed, kernel or kernel-int8"
            );
            assert_eq!(kernel.unwrap().format, WeightFormat::KernelInt8);
        } else {
            assert!(
                err.to_string()
                    .starts_with("MLXCEL_XLA_WEIGHTS=\"int4\": expected f32, f16 or packed"),
                "{err}"
            );
            // Named, but refused where the kernels cannot run, with the reason.
            let err = kernel.unwrap_err().to_string();
            assert!(err.contains("AVX-512"), "{err}");
        }
        for bad in ["0", "-1", "eight"] {
            let err = XlaOptions::from_values(None, Some(bad), None).unwrap_err();
            assert!(
                err.to_string().starts_with("MLXCEL_XLA_MAX_BATCH="),
                "{err}"
            );
        }
        for bad in ["8", "100", "-256", "all"] {
            let err = XlaOptions::from_values(None, None, Some(bad)).unwrap_err();
            assert!(
                err.to_string().starts_with("MLXCEL_XLA_MIN_WINDOW="),
                "{err}"
            );
        }
    }
}
