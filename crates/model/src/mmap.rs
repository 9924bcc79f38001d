//! The crate's only `unsafe`: mapping files read-only.

use std::fs::File;

use memmap2::Mmap;

/// Maps `file` read-only.
pub(crate) fn map(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and we never hand out `&mut`. Like every mmap-based loader
    // (safetensors, llama.cpp), we rely on checkpoint files not being truncated or rewritten while
    // they are in use; a concurrent writer would change tensor bytes under us, not memory safety of
    // our own bookkeeping, which only holds offsets checked against the length at map time.
    unsafe { Mmap::map(file) }
}
