//! The crate's only `unsafe`: mapping files read-only, and letting go of mapped pages.

use std::fs::File;

use memmap2::{Mmap, UncheckedAdvice};

/// Maps `file` read-only.
pub(crate) fn map(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and we never hand out `&mut`. Like every mmap-based loader
    // (safetensors, llama.cpp), we rely on checkpoint files not being truncated or rewritten while
    // they are in use; a concurrent writer would change tensor bytes under us, not memory safety of
    // our own bookkeeping, which only holds offsets checked against the length at map time.
    unsafe { Mmap::map(file) }
}

/// Drops this process's resident pages of `map[start..end]` (the whole pages inside it) without
/// unmapping: a later read faults them back in from the file, the same bytes. Loading calls it
/// once a tensor's bytes are copied out, so the mapped file does not sit in resident memory
/// beside the copies (the page cache keeps the file for the next load). Best effort: an error
/// (a kernel without `MADV_DONTNEED`) leaves the pages resident, which is only memory.
pub(crate) fn release(map: &Mmap, start: usize, end: usize) {
    const PAGE: usize = 4096;
    let first = start.next_multiple_of(PAGE);
    let last = end.min(map.len()) / PAGE * PAGE;
    if last > first {
        // SAFETY: the map is private and read-only, so `MADV_DONTNEED` cannot discard data: the
        // pages are read again from the file on the next access, byte for byte what they held
        // (the same assumption as `map`: the file is not rewritten while in use). Borrows of the
        // range stay valid.
        let _ =
            unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, first, last - first) };
    }
}
