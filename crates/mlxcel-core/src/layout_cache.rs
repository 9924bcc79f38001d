//! The int8 layout of a GGUF checkpoint's weights, kept in a file beside the prepared checkpoint
//! and mapped by later loads.
//!
//! A load from a GGUF file writes each quantized weight into the int8 layout from the file's
//! blocks ([`QuantizedWeight::int8_from_gguf_blocks`]). That memory is new to the process, and on
//! a warm start (the file already in the page cache) most of a load's time is the system
//! providing and zeroing those pages, not the rewrite. So the first load writes the layout into
//! a file of the prepared directory (`int8-layout-v<VERSION>.bin`, the arrays built in place in
//! its shared mapping: no second copy), and every later load maps that file and makes its arrays
//! over the mapped bytes, as llama.cpp maps its GGUF: a warm start then pays for page-cache pages
//! it only maps.
//!
//! The file: a 64-byte header (magic, [`VERSION`]), the arrays (each 64-aligned, its byte count
//! in the 8 bytes before it, as MLX's allocator keeps it), a JSON index (per weight: its key,
//! group size, bits, and its arrays' offsets, dtypes and shapes), and a 24-byte trailer (the
//! index's offset and length, a second magic). It is written under a temporary name, renamed to
//! `.pending` once complete, and to `.bin` once its bytes are on disk (`fdatasync`, on a thread
//! that does not hold up the load). A `.pending` file is trusted only in the boot that wrote it
//! (the index keeps the boot's id): the page cache then holds what was written, and a crash
//! before the bytes reached the disk cannot leave a file that is mapped as if whole.
//!
//! `MLXCEL_LAYOUT_CACHE=off` turns it off (nothing read, nothing written); the file is not
//! written beyond what leaves [`MARGIN`] free. A file that fails a check is
//! removed and written again, with a message that says so; one whose index does not match a
//! weight's expected shapes is not used for that weight.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::quantized::QuantizedWeight;
use crate::sys::{ARENA_ALIGN, Arena, Mapping};

/// The layout's format. Raise it whenever the bytes [`QuantizedWeight::int8_from_gguf_blocks`]
/// writes for the same blocks change (a test of `int8_blocks` fingerprints them and names this
/// constant), or the file's own format changes: a file of another version is not read.
pub(crate) const VERSION: u32 = 2;
const MAGIC: &[u8; 8] = b"MLXCELL8";
const TRAILER_MAGIC: &[u8; 8] = b"MLXCELIX";
const HEADER: usize = 64;
const TRAILER: usize = 24;
/// Disk space the file leaves free: this plus a tenth of what was free, or half of what was
/// free when that is less (a nearly full disk still takes a small model's layout).
const MARGIN: u64 = 2 << 30;
const ENV: &str = "MLXCEL_LAYOUT_CACHE";
/// Where a mapped layout's bytes are read from: [`Residence`].
const MEMORY_ENV: &str = "MLXCEL_LAYOUT_MEMORY";
/// How long after the load's end a layout starts moving into memory: a one-shot command that is done
/// by then (a short `mlxcel generate`) does not pay for a move it would not use.
const MOVE_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
/// Memory `auto` leaves beside the moved layout and the file's cached pages.
const MOVE_MARGIN: u64 = 1 << 30;

/// One array of an entry: where its bytes start, its dtype code and shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Slot {
    offset: usize,
    dtype: u8,
    shape: Vec<i32>,
}

/// One weight: its arrays (codes, scales, and the stored biases unless `derived_biases`, the
/// placeholder of biases the kernels derive from the scales: the multiple, and a marker after
/// it for MXFP4's E2M1 codes).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    group_size: i32,
    bits: i32,
    derived_biases: Option<Vec<f32>>,
    arrays: Vec<Slot>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Index {
    version: u32,
    boot_id: String,
    entries: HashMap<String, Entry>,
}

/// Where a weight's arrays are built: the heap, or the cache file being written.
pub(crate) enum Place<'a> {
    Heap,
    Arena(&'a Arena),
}

impl Place<'_> {
    /// [`Array::filled`], in the arena when there is one and it takes the array (else on the
    /// heap, and the weight is then not recorded).
    pub(crate) fn filled<R>(
        &self,
        shape: &[i32],
        dtype: Dtype,
        fill: impl FnOnce(&mut [std::mem::MaybeUninit<u8>]) -> R,
    ) -> Result<(Array, R)> {
        match self {
            Place::Heap => Array::filled(shape, dtype, fill),
            Place::Arena(arena) => {
                // `fill` is called once: by the arena if it has room, else by the heap.
                let mut fill = Some(fill);
                let nbytes = Array::byte_len(shape, dtype)?;
                match arena.filled(nbytes, |bytes| (fill.take().expect("called once"))(bytes)) {
                    Some((offset, r)) => Ok((
                        Array::over_mapping(arena.mapping(), offset, shape, dtype)?,
                        r,
                    )),
                    None => Array::filled(shape, dtype, fill.take().expect("not called")),
                }
            }
        }
    }
}

/// The cache of one load: off, read from a complete file, or being written.
pub(crate) struct LayoutCache {
    state: State,
    residence: Residence,
}

enum State {
    Off,
    Read {
        mapping: Arc<Mapping>,
        entries: HashMap<String, Entry>,
        path: PathBuf,
        warned: std::sync::atomic::AtomicBool,
    },
    Write(Box<Writer>),
}

struct Writer {
    arena: Arena,
    tmp: PathBuf,
    pending: PathBuf,
    done: PathBuf,
    entries: Mutex<HashMap<String, Entry>>,
    /// Some weight did not fit in the file (the disk's room ran out): the file is not kept,
    /// since a later load would map part of the model and build the rest every time.
    incomplete: std::sync::atomic::AtomicBool,
}

impl LayoutCache {
    /// No cache: every weight is built on the heap.
    pub(crate) fn off() -> LayoutCache {
        LayoutCache {
            state: State::Off,
            residence: Residence::Map,
        }
    }

    /// The cache named `name` (which part of the model it holds) in the prepared directory
    /// `dir`: read when a trusted complete file is there, else written by this load when the
    /// disk has room. Refuses only an invalid `MLXCEL_LAYOUT_CACHE`; a file that cannot be
    /// read or written leaves the load on the heap, with a message.
    pub(crate) fn open(dir: &Path, name: &str) -> Result<LayoutCache> {
        let residence = Residence::parse(std::env::var(MEMORY_ENV).ok().as_deref())?;
        if !switched_on(std::env::var(ENV).ok().as_deref())? {
            return Ok(Self::off());
        }
        let base = format!("int8-layout-v{VERSION}{name}");
        let done = dir.join(format!("{base}.bin"));
        let pending = dir.join(format!("{base}.pending"));
        remove_stale_temporaries(dir, &base);
        for (path, trusted) in [(&done, true), (&pending, false)] {
            if !path.exists() {
                continue;
            }
            match read(path, !trusted) {
                Ok(Some((mapping, entries))) => {
                    if !trusted {
                        sync_then_rename(path.clone(), done.clone());
                    }
                    return Ok(LayoutCache {
                        state: State::Read {
                            mapping,
                            entries,
                            path: path.clone(),
                            warned: Default::default(),
                        },
                        residence,
                    });
                }
                Ok(None) => {
                    // A pending file of an earlier boot: perhaps never written to disk whole.
                    let _ = std::fs::remove_file(path);
                }
                Err(Unusable::Damaged(why)) => {
                    eprintln!(
                        "mlxcel: {} is not a usable int8 layout ({why}); removed, written again",
                        path.display()
                    );
                    let _ = std::fs::remove_file(path);
                }
                Err(Unusable::Unreadable(why)) => {
                    // Not the file's fault (permissions, no address space): kept for a later
                    // load, this one builds the layout on the heap.
                    eprintln!(
                        "mlxcel: cannot map {} ({why}); building the int8 layout instead",
                        path.display()
                    );
                    return Ok(Self::off());
                }
            }
        }
        Ok(match Writer::new(dir, &base, done, pending) {
            Some(writer) => LayoutCache {
                state: State::Write(Box::new(writer)),
                residence,
            },
            None => Self::off(),
        })
    }

    /// Where this load builds the weights it does not find here.
    pub(crate) fn place(&self) -> Place<'_> {
        match &self.state {
            State::Write(w) => Place::Arena(&w.arena),
            _ => Place::Heap,
        }
    }

    /// The weight cached under `key`, made over the mapped file, if `fits` it (the shapes the
    /// checkpoint's blocks give).
    pub(crate) fn get(
        &self,
        key: &str,
        fits: impl Fn(&QuantizedWeight) -> bool,
    ) -> Result<Option<QuantizedWeight>> {
        let State::Read {
            mapping,
            entries,
            path,
            warned,
        } = &self.state
        else {
            return Ok(None);
        };
        let Some(entry) = entries.get(key) else {
            return Ok(None);
        };
        let array = |slot: &Slot| {
            let dtype = Dtype::from_code(slot.dtype).ok_or_else(|| Error::Mlx {
                op: "layout cache",
                message: format!("dtype code {} in {}", slot.dtype, path.display()),
            })?;
            Array::over_mapping(mapping, slot.offset, &slot.shape, dtype)
        };
        let weight = match (&entry.arrays[..], &entry.derived_biases) {
            ([w, s], Some(b)) if !b.is_empty() && b.len() <= 2 => {
                let derived = Array::from_f32(b, &[b.len() as i32])?;
                Some((array(w)?, array(s)?, derived))
            }
            ([w, s, b], None) => Some((array(w)?, array(s)?, array(b)?)),
            _ => None,
        }
        .map(|(weight, scales, biases)| QuantizedWeight {
            weight,
            scales,
            biases,
            group_size: entry.group_size,
            bits: entry.bits,
            int8: true,
            activations: None,
        })
        .filter(|w| fits(w));
        if weight.is_none() && !warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!(
                "mlxcel: {} holds {key} in another form than the checkpoint's blocks give; \
                     such weights are built again (remove the file to have it written anew)",
                path.display()
            );
        }
        Ok(weight)
    }

    /// Records `weight` under `key` when the file being written holds its arrays.
    pub(crate) fn record(&self, key: &str, weight: &QuantizedWeight) -> Result<()> {
        let State::Write(w) = &self.state else {
            return Ok(());
        };
        let mapping = w.arena.mapping();
        let slot = |a: &Array| {
            a.offset_in(mapping).map(|offset| Slot {
                offset,
                dtype: a.dtype().code(),
                shape: a.shape(),
            })
        };
        let derived_biases = if weight.derived_biases() {
            Some(weight.biases.to_vec_f32()?)
        } else {
            None
        };
        let mut arrays = vec![slot(&weight.weight), slot(&weight.scales)];
        if derived_biases.is_none() {
            arrays.push(slot(&weight.biases));
        }
        let Some(arrays) = arrays.into_iter().collect::<Option<Vec<_>>>() else {
            w.incomplete
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        };
        {
            let entry = Entry {
                group_size: weight.group_size,
                bits: weight.bits,
                derived_biases,
                arrays,
            };
            w.entries
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_owned(), entry);
        }
        Ok(())
    }

    /// Ends the load: a file being written gets its index and becomes the next load's; a file
    /// the arrays are over (read, or written and kept) moves into memory when the residence
    /// says so.
    pub(crate) fn finish(self) {
        match self.state {
            State::Write(w) => {
                let path = w.done.clone();
                let (mapping, used) = (w.arena.mapping().clone(), w.arena.used());
                match w.finish() {
                    Ok(()) => self.residence.apply(&mapping, used),
                    Err(why) => eprintln!(
                        "mlxcel: the int8 layout was not kept in {} ({why}); the next load \
                         builds it again",
                        path.display()
                    ),
                }
            }
            State::Read { mapping, .. } => self.residence.apply(&mapping, mapping.len()),
            State::Off => {}
        }
    }
}

impl Writer {
    fn new(dir: &Path, base: &str, done: PathBuf, pending: PathBuf) -> Option<Writer> {
        let free = crate::sys::free_disk_bytes(dir)?;
        let limit = free.saturating_sub(MARGIN + free / 10).max(free / 2);
        if limit < 64 << 20 {
            eprintln!(
                "mlxcel: not keeping the int8 layout in {}: {} MB free on its disk",
                dir.display(),
                free >> 20
            );
            return None;
        }
        let tmp = dir.join(format!("{base}.tmp.{}", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .ok()?;
        match Arena::new(file, HEADER, usize::try_from(limit).ok()?) {
            Ok(arena) => Some(Writer {
                arena,
                tmp,
                pending,
                done,
                entries: Mutex::new(HashMap::new()),
                incomplete: Default::default(),
            }),
            Err(_) => {
                let _ = std::fs::remove_file(&tmp);
                None
            }
        }
    }

    fn finish(self) -> std::io::Result<()> {
        let result = self.write_index();
        // The mapping and file stay open while arrays over them live; the name moves.
        if result.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
            return result;
        }
        std::fs::rename(&self.tmp, &self.pending)?;
        sync_then_rename(self.pending.clone(), self.done.clone());
        eprintln!(
            "mlxcel: kept the int8 layout in {} ({} MB): later loads map it instead of writing it \
             (MLXCEL_LAYOUT_CACHE=off: neither)",
            self.done.display(),
            self.arena.used() >> 20
        );
        Ok(())
    }

    fn write_index(&self) -> std::io::Result<()> {
        let entries = std::mem::take(&mut *self.entries.lock().unwrap_or_else(|p| p.into_inner()));
        if entries.is_empty() {
            return Err(std::io::Error::other("no weight took the layout"));
        }
        if self.incomplete.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::Error::other(format!(
                "the disk had room for {} MB of it, keeping {} GB or half of its free space free",
                self.arena.used() >> 20,
                MARGIN >> 30
            )));
        }
        let index = Index {
            version: VERSION,
            boot_id: boot_id().unwrap_or_default(),
            entries,
        };
        let json = serde_json::to_vec(&index).map_err(std::io::Error::other)?;
        let file = self.arena.file();
        let at = self.arena.used().next_multiple_of(ARENA_ALIGN);
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let mut trailer = Vec::with_capacity(TRAILER);
        trailer.extend_from_slice(&(at as u64).to_le_bytes());
        trailer.extend_from_slice(&(json.len() as u64).to_le_bytes());
        trailer.extend_from_slice(TRAILER_MAGIC);
        // Shorten the file first: past `used` nothing is mapped by an array, and the index and
        // trailer are written by `pwrite` after the arrays.
        let end = at + json.len() + TRAILER;
        file.set_len(end as u64)?;
        file.write_all_at(&json, at as u64)?;
        file.write_all_at(&trailer, (at + json.len()) as u64)?;
        file.write_all_at(&header, 0)
    }
}

impl Drop for Writer {
    /// A load that failed (or a file that could not be finished) leaves no temporary behind;
    /// after `finish` renamed it there is nothing to remove.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Why a cache file is not used.
enum Unusable {
    /// Its bytes: removed and written again.
    Damaged(String),
    /// Opening or mapping it failed: left alone.
    Unreadable(String),
}

impl From<String> for Unusable {
    fn from(why: String) -> Unusable {
        Unusable::Damaged(why)
    }
}

impl From<&str> for Unusable {
    fn from(why: &str) -> Unusable {
        Unusable::Damaged(why.to_owned())
    }
}

/// A complete file's mapping and index; `Ok(None)` for a `pending` file not written in this
/// boot (or when either boot is unknown).
#[allow(clippy::type_complexity)]
fn read(
    path: &Path,
    pending: bool,
) -> std::result::Result<Option<(Arc<Mapping>, HashMap<String, Entry>)>, Unusable> {
    let unreadable = |e: std::io::Error| Unusable::Unreadable(e.to_string());
    let file = File::open(path).map_err(unreadable)?;
    let mapping = Mapping::read_only(&file).map_err(unreadable)?;
    let len = mapping.len();
    let header = mapping.bytes(0, HEADER).ok_or("shorter than its header")?;
    if &header[..8] != MAGIC {
        return Err("not an mlxcel int8 layout file".into());
    }
    let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(format!("format {version}, this build reads {VERSION}").into());
    }
    let trailer = mapping
        .bytes(len.checked_sub(TRAILER).ok_or("no trailer")?, TRAILER)
        .ok_or("no trailer")?;
    if &trailer[16..] != TRAILER_MAGIC {
        return Err("incomplete (no trailer)".into());
    }
    let at = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes")) as usize;
    let n = u64::from_le_bytes(trailer[8..16].try_into().expect("8 bytes")) as usize;
    if at.checked_add(n).and_then(|e| e.checked_add(TRAILER)) != Some(len) {
        return Err("its index is not where the trailer says".into());
    }
    let json = mapping.bytes(at, n).ok_or("index out of range")?;
    let index: Index = serde_json::from_slice(json).map_err(|e| format!("index: {e}"))?;
    if index.version != VERSION {
        return Err(format!("index of format {}", index.version).into());
    }
    if pending && boot_id().as_deref() != Some(index.boot_id.as_str()) {
        return Ok(None);
    }
    // Every array inside the data (before the index), aligned, its size word in front of it.
    for (key, entry) in &index.entries {
        for slot in &entry.arrays {
            let dtype = Dtype::from_code(slot.dtype).ok_or_else(|| format!("{key}: dtype"))?;
            let bytes = Array::byte_len(&slot.shape, dtype).map_err(|e| format!("{key}: {e}"))?;
            let ok = slot.offset >= HEADER
                && slot.offset.is_multiple_of(ARENA_ALIGN)
                && slot.offset.checked_add(bytes).is_some_and(|end| end <= at)
                && mapping
                    .bytes(slot.offset - 8, 8)
                    .is_some_and(|w| u64::from_le_bytes(w.try_into().expect("8")) == bytes as u64);
            if !ok {
                return Err(format!("{key}: an array outside the file's data").into());
            }
        }
    }
    Ok(Some((mapping, index.entries)))
}

/// Puts a pending file's bytes on disk, then gives it its final name, on a thread of its own
/// (best effort: if the process ends first, the next load in this boot does it).
fn sync_then_rename(pending: PathBuf, done: PathBuf) {
    std::thread::spawn(move || {
        if let Ok(file) = File::open(&pending)
            && file.sync_data().is_ok()
        {
            let _ = std::fs::rename(&pending, &done);
        }
    });
}

/// Removes temporary files of `base` whose writing process is gone, and every file of another
/// layout version (never read again by this build: they would only take the disk).
fn remove_stale_temporaries(dir: &Path, base: &str) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{base}.tmp.");
    for entry in read.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let version: Option<u32> = name
            .strip_prefix("int8-layout-v")
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|digits| digits.parse().ok());
        let stale = match name.strip_prefix(&prefix) {
            Some(pid) => !Path::new("/proc").join(pid).exists(),
            None => version.is_some_and(|v| v != VERSION),
        };
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// This boot's id (Linux), which a pending file is trusted within.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Where the arrays over a layout file read their bytes from (`MLXCEL_LAYOUT_MEMORY`): the
/// file's mapped page-cache pages, or the process's own memory, the bytes moved there at the
/// same addresses after the load ([`Mapping::move_into_memory`]), which decode reads faster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Residence {
    /// Moved when the memory available holds the layout twice over (the moved copy and the
    /// file's cached pages, kept for the next start) and [`MOVE_MARGIN`] more; mapped else.
    Auto,
    /// Left mapped: one copy, shared with every process that maps the file.
    Map,
    /// Moved whatever the memory.
    Move,
}

impl Residence {
    fn parse(value: Option<&str>) -> Result<Residence> {
        match value.unwrap_or("") {
            "" | "auto" => Ok(Residence::Auto),
            "map" => Ok(Residence::Map),
            "move" => Ok(Residence::Move),
            other => Err(Error::InvalidEnv {
                variable: MEMORY_ENV,
                value: other.to_owned(),
                expected: "auto, map or move",
            }),
        }
    }

    /// Whether a layout of `len` bytes moves, given the memory available.
    fn moves(self, len: usize, available: Option<u64>) -> bool {
        match self {
            Residence::Map => false,
            Residence::Move => true,
            Residence::Auto => available.is_some_and(|a| {
                (len as u64)
                    .checked_mul(2)
                    .and_then(|twice| twice.checked_add(MOVE_MARGIN))
                    .is_some_and(|need| a >= need)
            }),
        }
    }

    /// Starts moving the mapping's first `len` bytes into memory when this residence says so.
    fn apply(self, mapping: &Arc<Mapping>, len: usize) {
        if self.moves(len, memory_available()) {
            Mapping::move_into_memory(mapping, len, MOVE_DELAY, move |moved, error| {
                if let Some(error) = error {
                    eprintln!(
                        "mlxcel: moved {} of {} MB of the int8 layout into memory, the rest \
                         stays mapped ({error})",
                        moved >> 20,
                        len >> 20
                    );
                }
            });
        }
    }
}

/// The memory this process could be given without swapping, in bytes: the system's
/// `MemAvailable`, or less where its cgroup (v2) has a limit: the limit less what the group
/// holds other than file pages (which the kernel reclaims first).
fn memory_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let system = available_in_meminfo(&meminfo)?;
    let group = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| {
            let path = c.lines().find_map(|l| l.strip_prefix("0::"))?.to_owned();
            let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
            available_in_cgroup(
                &read("memory.max")?,
                &read("memory.current")?,
                &read("memory.stat")?,
            )
        });
    Some(group.map_or(system, |g| g.min(system)))
}

/// `MemAvailable` of `/proc/meminfo`'s text, in bytes.
fn available_in_meminfo(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// What a cgroup v2 group with these `memory.max`, `memory.current` and `memory.stat` texts can
/// still be given: `None` without a limit (`max`).
fn available_in_cgroup(max: &str, current: &str, stat: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    let current: u64 = current.trim().parse().ok()?;
    let file = stat
        .lines()
        .find_map(|l| l.strip_prefix("file "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Some(max.saturating_sub(current.saturating_sub(file)))
}

/// `MLXCEL_LAYOUT_CACHE`'s value: on when unset or empty, `on`/`1`/`true`, off for
/// `off`/`0`/`false`; anything else is refused by name.
fn switched_on(value: Option<&str>) -> Result<bool> {
    match value.unwrap_or("") {
        "" | "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        other => Err(Error::InvalidEnv {
            variable: ENV,
            value: other.to_owned(),
            expected: "on or off",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_residence_moves_what_fits_and_refuses_other_values() {
        assert_eq!(Residence::parse(None).unwrap(), Residence::Auto);
        assert_eq!(Residence::parse(Some("")).unwrap(), Residence::Auto);
        assert_eq!(Residence::parse(Some("map")).unwrap(), Residence::Map);
        assert_eq!(Residence::parse(Some("move")).unwrap(), Residence::Move);
        let err = Residence::parse(Some("copy")).unwrap_err().to_string();
        assert!(
            err.contains("MLXCEL_LAYOUT_MEMORY") && err.contains("auto, map or move"),
            "{err}"
        );
        let gb = 1u64 << 30;
        // auto: twice the layout and the margin.
        assert!(Residence::Auto.moves(2 << 30, Some(5 * gb)));
        assert!(!Residence::Auto.moves(2 << 30, Some(5 * gb - 1)));
        assert!(!Residence::Auto.moves(1, None));
        assert!(Residence::Move.moves(usize::MAX, Some(0)));
        assert!(!Residence::Map.moves(1, Some(u64::MAX)));
    }

    #[test]
    fn the_memory_available_is_the_systems_or_the_cgroups_allowance() {
        let meminfo =
            "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(available_in_meminfo(meminfo), Some(20_000_000 * 1024));
        assert_eq!(available_in_meminfo("MemTotal: 1 kB\n"), None);
        // No limit; a limit with file pages counted as reclaimable; a group over its limit.
        let stat = "anon 1000\nfile 3000\nkernel 5\n";
        assert_eq!(available_in_cgroup("max\n", "4000\n", stat), None);
        assert_eq!(available_in_cgroup("10000\n", "4000\n", stat), Some(9000));
        assert_eq!(
            available_in_cgroup("10000\n", "20000\n", "file 0\n"),
            Some(0)
        );
        assert!(memory_available().is_some_and(|a| a > 0));
    }

    #[test]
    fn the_switch_takes_on_and_off_and_refuses_the_rest() {
        for on in [None, Some(""), Some("on"), Some("1"), Some("true")] {
            assert!(switched_on(on).unwrap(), "{on:?}");
        }
        for off in ["off", "0", "false"] {
            assert!(!switched_on(Some(off)).unwrap(), "{off}");
        }
        let err = switched_on(Some("yes please")).unwrap_err().to_string();
        assert!(
            err.contains("MLXCEL_LAYOUT_CACHE") && err.contains("on or off"),
            "{err}"
        );
    }
}
