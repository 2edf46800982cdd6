//! Tables in transparent huge pages.
//!
//! A lookup into a table far larger than the caches lands on a random page
//! for every id. With 4 KiB pages the CPU's TLB covers only a few MiB, so
//! nearly every row of a 488 MiB table also costs a page-table walk (two
//! nested walks inside a virtual machine). Backed by 2 MiB pages, the same
//! table needs 244 TLB entries, and the walks go away.
//!
//! Linux hands out such pages for anonymous memory that asks for them with
//! `madvise(MADV_HUGEPAGE)` when the system's setting is `madvise` (the
//! common default) or `always`; the request must come before the pages are
//! first touched. [`zeroed_table`] does exactly that: it asks for zeroed
//! memory (which a large allocation gets as fresh, untouched pages) and
//! advises it before anything reads or writes it. Elsewhere (another
//! OS, THP set to `never`) it is a plain zeroed `Vec`.

/// Bytes in one transparent huge page on x86-64 and most aarch64 kernels.
pub const HUGE_PAGE: usize = 2 * 1024 * 1024;

/// A `Vec<f32>` of `len` zeros whose memory is advised for transparent huge
/// pages before it is first touched (see the module notes). Below
/// [`HUGE_PAGE`] bytes it is just `vec![0.0; len]`.
///
/// The result is an ordinary `Vec<f32>`, so it can be used, grown and
/// dropped as any other.
pub fn zeroed_table(len: usize) -> Vec<f32> {
    // `vec!` of zeros asks the allocator for zeroed memory; for a large
    // block glibc maps fresh pages and writes nothing, so the advice below
    // still comes before the first touch, and the kernel zeroes each huge
    // page when it is first faulted in (no separate pass over the table).
    // Where the allocator did write the zeros, the advice only comes late:
    // the table is correct either way.
    let table = vec![0.0; len];
    if len * core::mem::size_of::<f32>() >= HUGE_PAGE {
        advise_huge_pages(&table);
    }
    table
}

/// Asks the kernel to back the whole 2 MiB pages inside `memory` with
/// transparent huge pages. Returns whether the kernel accepted the advice
/// (always `false` off Linux). Memory that is already touched is only
/// merged into huge pages later, in the background, if at all; advise
/// memory before writing it (as [`zeroed_table`] does) for an immediate
/// effect.
pub fn advise_huge_pages<T>(memory: &[T]) -> bool {
    let start = memory.as_ptr() as usize;
    let end = start + core::mem::size_of_val(memory);
    let first = start.next_multiple_of(HUGE_PAGE);
    let last = end - end % HUGE_PAGE;
    if first >= last {
        return false;
    }
    madvise_hugepage(first, last - first)
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn madvise_hugepage(addr: usize, len: usize) -> bool {
    // SAFETY: `addr..addr + len` lies inside one live allocation (the
    // caller's slice) and is page aligned. MADV_HUGEPAGE changes how the
    // kernel backs those pages, never their contents or their validity, so
    // no Rust reference to the memory is affected.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn madvise_hugepage(_addr: usize, _len: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_tables_are_zero_and_as_long_as_asked() {
        for len in [
            0,
            1,
            1000,
            HUGE_PAGE / 4 - 1,
            HUGE_PAGE / 4,
            3 * HUGE_PAGE / 4 + 17,
        ] {
            let table = zeroed_table(len);
            assert_eq!(table.len(), len);
            assert!(table.iter().all(|x| x.to_bits() == 0), "len {len}");
        }
    }

    #[test]
    fn advice_needs_a_whole_huge_page() {
        assert!(!advise_huge_pages::<f32>(&[]));
        assert!(!advise_huge_pages(&[0.0f32; 1024]));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_takes_the_advice_where_it_has_transparent_huge_pages() {
        // The kernel refuses MADV_HUGEPAGE only when it was built without
        // transparent huge pages, and then this folder is missing.
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            return;
        }
        let mut table: Vec<f32> = Vec::with_capacity(3 * HUGE_PAGE / 4);
        assert!(advise_huge_pages(table.spare_capacity_mut()));
    }
}
