//! The crate's only `unsafe`: mapping files read-only, letting go of mapped pages, and the
//! anonymous memory that GGUF weights are converted into on demand.

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

/// Bytes produced on demand into anonymous memory, one region at a time: what a checkpoint
/// read from a GGUF file holds instead of a converted copy on disk. A region is filled (by
/// `fill(region, bytes)`) the first time it is asked for, and [`OnDemand::release`] gives its
/// pages back to the system, after which the next request fills it again.
/// How [`OnDemand`] fills a region: `fill(region, bytes)` writes all of `bytes`.
pub(crate) type Fill = Box<dyn Fn(usize, &mut [u8]) + Send + Sync>;

pub(crate) struct OnDemand {
    /// The mapping; bytes are read and written through `base`.
    map: memmap2::MmapMut,
    base: *mut u8,
    /// Each region's byte range, page-aligned at its start.
    regions: Vec<(usize, usize)>,
    /// Whether each region holds its bytes; the lock is held while it is filled or released.
    filled: Vec<std::sync::Mutex<bool>>,
    fill: Fill,
}

// SAFETY: `base` points into `map`, owned by the struct and never moved or unmapped while it
// lives. Bytes are written only by `get` (inside the region's lock, before any reference to the
// region exists) and zeroed only by `release`, whose caller guarantees no reference to the region
// remains; regions are disjoint, so threads never write the same bytes.
unsafe impl Send for OnDemand {}
// SAFETY: as for `Send`.
unsafe impl Sync for OnDemand {}

impl std::fmt::Debug for OnDemand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnDemand")
            .field("regions", &self.regions.len())
            .finish_non_exhaustive()
    }
}

impl OnDemand {
    /// Reserves address space for regions of `lengths` bytes (no memory is committed until a
    /// region is filled); returns the store and each region's start.
    pub(crate) fn new(lengths: &[usize], fill: Fill) -> std::io::Result<(Self, Vec<usize>)> {
        const PAGE: usize = 4096;
        let mut regions = Vec::with_capacity(lengths.len());
        let mut at = 0usize;
        for &len in lengths {
            regions.push((at, at + len));
            at = (at + len).next_multiple_of(PAGE);
        }
        let mut map = memmap2::MmapOptions::new().len(at.max(PAGE)).map_anon()?;
        // Huge pages where the system allows them: a fault per 2 MiB instead of per 4 KiB as
        // tensors are converted in (best effort).
        let _ = map.advise(memmap2::Advice::HugePage);
        let base = map.as_mut_ptr();
        let starts = regions.iter().map(|r| r.0).collect();
        let filled = lengths
            .iter()
            .map(|_| std::sync::Mutex::new(false))
            .collect();
        Ok((
            Self {
                map,
                base,
                regions,
                filled,
                fill,
            },
            starts,
        ))
    }

    /// Region `region`'s bytes, filled first if they are not there.
    pub(crate) fn get(&self, region: usize) -> &[u8] {
        let (start, end) = self.regions[region];
        let mut filled = self.filled[region]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !*filled {
            // SAFETY: the range lies inside the mapping; no reference to this region exists
            // while it is unfilled (every `get` fills it before returning one, under this lock,
            // and `release`'s caller dropped theirs), and other regions are disjoint.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(self.base.add(start), end - start) };
            (self.fill)(region, bytes);
            *filled = true;
        }
        // SAFETY: the range lies inside the mapping and is filled; it is not written again
        // until `release`, whose caller guarantees this reference is gone by then.
        unsafe { std::slice::from_raw_parts(self.base.add(start), end - start) }
    }

    /// Gives region `region`'s whole pages back to the system (they read as zeros until the
    /// region is filled again by the next [`OnDemand::get`]).
    ///
    /// # Safety
    /// No reference returned by [`OnDemand::get`] for this region may be used afterwards.
    pub(crate) unsafe fn release(&self, region: usize) {
        const PAGE: usize = 4096;
        let (start, end) = self.regions[region];
        let mut filled = self.filled[region]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (first, last) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        if last > first {
            // SAFETY: the range is whole pages of our own anonymous mapping, and the caller
            // guarantees no reference into the region is used again; `filled` is cleared so the
            // next `get` writes the bytes again before handing out a reference.
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(UncheckedAdvice::DontNeed, first, last - first)
            };
        }
        *filled = false;
    }
}
