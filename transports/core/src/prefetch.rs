//! A hint to the processor to bring memory into its caches before it is read, so that the misses of a batch of
//! reads overlap instead of stalling one after another.
//!
//! Tables in flight hold a device's orders for a round trip: by the time an answer takes one out, or a send reads an
//! order made before the run, its memory has left the caches. Where the addresses of a whole batch are known first
//! (the orders a window opening lets go, the frames one answer names), asking for all of them before touching any
//! turns a chain of memory latencies into about one. A hint never faults and changes nothing the program sees; on
//! targets without one it does nothing.

/// Ask for the cache line holding `p` (any address: nothing is read, nothing can fault).
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is part of every x86_64 target, and a prefetch reads nothing: any address is allowed.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The size of a cache line on the machines the suite runs on.
const LINE: usize = 64;

/// Ask for every cache line `*p` touches (at most four: the entries of tables in flight are smaller).
#[inline(always)]
pub fn prefetch_all<T>(p: *const T) {
    prefetch_lines(p as usize, std::mem::size_of::<T>().max(1), 4);
}

/// Ask for the cache lines of the first `max_lines` lines' worth of `items` (or all of them, if fewer).
#[inline(always)]
pub fn prefetch_slice<T>(items: &[T], max_lines: usize) {
    prefetch_lines(
        items.as_ptr() as usize,
        std::mem::size_of_val(items),
        max_lines,
    );
}

/// Ask for the lines of the `bytes` bytes from `start`, at most `max_lines` of them (none for an empty range).
#[inline(always)]
fn prefetch_lines(start: usize, bytes: usize, max_lines: usize) {
    let first = start & !(LINE - 1);
    let end = start.saturating_add(bytes);
    let mut line = first;
    while line < end && line - first < max_lines * LINE {
        prefetch(line as *const u8);
        line += LINE;
    }
}
