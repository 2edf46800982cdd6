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
///
/// # Errors
/// [`EmbeddingError::AllocationFailed`](crate::EmbeddingError::AllocationFailed)
/// (`what` = "table", `bytes` = `4 × len`, exact even past `usize`) if the
/// allocator refuses the memory or it does not fit the address space.
pub fn zeroed_table(len: usize) -> Result<Vec<f32>, crate::EmbeddingError> {
    zeroed_floats(len, "table")
}

/// [`zeroed_table`] for a buffer the crate allocates, named `what` in the
/// error.
pub(crate) fn zeroed_floats(
    len: usize,
    what: &'static str,
) -> Result<Vec<f32>, crate::EmbeddingError> {
    // Zeroed memory from the allocator: for a large block glibc maps fresh
    // pages and writes nothing, so the advice below still comes before the
    // first touch, and the kernel zeroes each huge page when it is first
    // faulted in (no separate pass over the table). Where the allocator did
    // write the zeros, the advice only comes late: the table is correct
    // either way.
    let table = crate::buffer::zeroed::<f32>(len, what)?;
    if core::mem::size_of_val(table.as_slice()) >= HUGE_PAGE {
        advise_huge_pages(&table);
    }
    Ok(table)
}

/// Room for `rows × dim` values in `values`, emptied first: its spare
/// capacity, which a kernel then writes whole before the caller's
/// `set_len` of the returned slice's length. Advised for huge pages before
/// the first touch when it spans one.
///
/// # Errors
/// [`EmbeddingError::SizeOverflow`](crate::EmbeddingError::SizeOverflow)
/// for `rows × dim`, or
/// [`EmbeddingError::AllocationFailed`](crate::EmbeddingError::AllocationFailed)
/// naming the values `what` ("output", "gradient"); then `values` is empty.
pub(crate) fn fresh_floats<'v>(
    values: &'v mut Vec<f32>,
    rows: usize,
    dim: usize,
    what: &'static str,
) -> Result<&'v mut [core::mem::MaybeUninit<f32>], crate::EmbeddingError> {
    values.clear();
    let len = crate::shape::rows_len(rows, dim)?;
    values
        .try_reserve_exact(len)
        .map_err(|_| crate::EmbeddingError::AllocationFailed {
            what,
            bytes: len as u128 * 4,
        })?;
    let fresh = &mut values.spare_capacity_mut()[..len];
    if core::mem::size_of_val(fresh) >= HUGE_PAGE {
        advise_huge_pages(fresh);
    }
    Ok(fresh)
}

/// Asks the kernel to back the whole 2 MiB pages inside `memory` with
/// transparent huge pages. Returns whether the kernel accepted the advice
/// (always `false` off Linux). Memory that is already touched is only
/// merged into huge pages later, in the background, if at all; advise
/// memory before writing it (as [`zeroed_table`] does) for an immediate
/// effect, or use [`collapse_huge_pages`] on memory already written.
pub fn advise_huge_pages<T>(memory: &[T]) -> bool {
    match whole_huge_pages(memory) {
        Some((first, len)) => madvise_hugepage(first, len),
        None => false,
    }
}

/// Moves the whole 2 MiB pages inside `memory` into transparent huge pages
/// now, their contents kept: the advice of [`advise_huge_pages`], then
/// `MADV_COLLAPSE` (Linux 6.1 and later). For a table that is already
/// written, one the caller loaded or was handed, which [`advise_huge_pages`]
/// alone leaves in 4 KiB pages until the kernel's background scan gets to
/// it. The kernel copies each 2 MiB into a fresh huge page: about as long
/// as copying the memory once (longer on its first use in a virtual machine, whose
/// host backs the fresh pages as they come).
///
/// Returns whether every such page is now a huge page; `false` off Linux
/// with glibc (the `libc` crate names `MADV_COLLAPSE` there only), on
/// kernels without `MADV_COLLAPSE`, where the memory holds no whole 2 MiB
/// page, where the kernel could not find the huge pages, or where the
/// memory was never written (nothing to copy: the advice still stands, and
/// its pages come as huge ones when first written). The contents are the
/// same either way.
pub fn collapse_huge_pages<T>(memory: &[T]) -> bool {
    match whole_huge_pages(memory) {
        Some((first, len)) => madvise_hugepage(first, len) && madvise_collapse(first, len),
        None => false,
    }
}

/// The start and length of the whole 2 MiB pages inside `memory`, if any.
/// (A slice of zero-sized values, whose address may be anywhere, spans no
/// bytes and so no page.)
fn whole_huge_pages<T>(memory: &[T]) -> Option<(usize, usize)> {
    huge_pages_in(memory.as_ptr() as usize, core::mem::size_of_val(memory))
}

/// The start and length of the whole 2 MiB pages inside the `bytes` from
/// address `start`, if any.
fn huge_pages_in(start: usize, bytes: usize) -> Option<(usize, usize)> {
    if bytes < HUGE_PAGE {
        return None;
    }
    let first = start.checked_next_multiple_of(HUGE_PAGE)?;
    let end = start.checked_add(bytes)?;
    let last = end - end % HUGE_PAGE;
    (first < last).then(|| (first, last - first))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn madvise_collapse(addr: usize, len: usize) -> bool {
    // A page still in another CPU's batch of fresh pages fails the call with
    // EAGAIN ("temporarily unavailable"); a second or third try finds it
    // settled.
    for _ in 0..3 {
        // SAFETY: as `madvise_hugepage`: `addr..addr + len` lies inside one
        // live allocation and is page aligned. MADV_COLLAPSE copies those
        // pages into huge ones and maps them in their place while the
        // process's other accesses wait, so every value reads and writes as
        // before.
        if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_COLLAPSE) } == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN) {
            return false;
        }
    }
    false
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn madvise_collapse(_addr: usize, _len: usize) -> bool {
    false
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

/// The alignment of an [`AlignedTable`] of less than [`HUGE_PAGE`] bytes: a
/// cache line, so a row of `16·k` floats spans exactly `k` lines.
pub const LINE_BYTES: usize = 64;

/// A zero-initialised, heap-allocated `[f32]` whose first value starts a
/// cache line (a 2 MiB page, from [`HUGE_PAGE`] bytes on, advised for
/// transparent huge pages before it is first touched). It dereferences to
/// `[f32]`; the layers keep their tables in one.
///
/// Why not a `Vec<f32>`: an allocator aligns a `Vec<f32>` to 16 bytes
/// (glibc's large blocks start 16 bytes into a page), so a 512-byte row
/// spans nine cache lines instead of eight, and every random row read moves
/// a line more: recsys's bag sum took less time on a line-aligned table
/// than on the same table 16 bytes off (docs/design.md, "Memory: huge pages
/// and aligned tables"). A `Vec` cannot be handed a pointer of another
/// alignment (it frees with the layout of `f32`), so this type owns its
/// allocation.
pub struct AlignedTable {
    ptr: core::ptr::NonNull<f32>,
    len: usize,
}

// SAFETY: an `AlignedTable` owns its values exclusively, like a `Vec<f32>`;
// `f32` is `Send` and `Sync`, so moving or sharing the owner is sound.
#[allow(unsafe_code)]
unsafe impl Send for AlignedTable {}
// SAFETY: as above; `&AlignedTable` only hands out `&[f32]`.
#[allow(unsafe_code)]
unsafe impl Sync for AlignedTable {}

impl AlignedTable {
    /// The layout of a table of `len` values, or `None` if it is too large.
    fn layout(len: usize) -> Option<core::alloc::Layout> {
        let bytes = len.checked_mul(core::mem::size_of::<f32>())?;
        let align = if bytes >= HUGE_PAGE {
            HUGE_PAGE
        } else {
            LINE_BYTES
        };
        core::alloc::Layout::from_size_align(bytes, align).ok()
    }

    /// `len` zeros.
    ///
    /// # Errors
    /// [`EmbeddingError::AllocationFailed`](crate::EmbeddingError::AllocationFailed)
    /// (`what` = "table", `bytes` = `4 × len`, exact even past `usize`) if
    /// `len` floats do not fit the address space or the allocator refuses
    /// them.
    #[allow(unsafe_code)]
    pub fn zeroed(len: usize) -> Result<AlignedTable, crate::EmbeddingError> {
        let refused = crate::EmbeddingError::AllocationFailed {
            what: "table",
            bytes: len as u128 * core::mem::size_of::<f32>() as u128,
        };
        let layout = AlignedTable::layout(len).ok_or_else(|| refused.clone())?;
        if len == 0 {
            return Ok(AlignedTable {
                ptr: core::ptr::NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: `layout` has a non-zero size (len > 0) and a power-of-two
        // alignment (`Layout::from_size_align` checked both).
        let raw = unsafe { std::alloc::alloc(layout) }.cast::<f32>();
        let ptr = core::ptr::NonNull::new(raw).ok_or(refused)?;
        // Advise before the first touch (the zeros below), so the kernel
        // backs the pages with huge ones as they fault in.
        if let Some((first, len)) = huge_pages_in(raw as usize, layout.size()) {
            madvise_hugepage(first, len);
        }
        // SAFETY: `raw` is valid for writes of `len` `f32`s (the allocation
        // above) and aligned for `f32`; writing zero bytes makes them all
        // initialised `0.0`s.
        unsafe { core::ptr::write_bytes(raw, 0, len) };
        Ok(AlignedTable { ptr, len })
    }

    /// A copy of `values` in an aligned table.
    ///
    /// # Errors
    /// As [`zeroed`](Self::zeroed).
    pub fn from_slice(values: &[f32]) -> Result<AlignedTable, crate::EmbeddingError> {
        let mut table = AlignedTable::zeroed(values.len())?;
        table.copy_from_slice(values);
        Ok(table)
    }

    /// A copy of the table, or an error where [`Clone::clone`] would abort.
    ///
    /// # Errors
    /// As [`zeroed`](Self::zeroed).
    pub fn try_clone(&self) -> Result<AlignedTable, crate::EmbeddingError> {
        AlignedTable::from_slice(self)
    }
}

impl core::ops::Deref for AlignedTable {
    type Target = [f32];

    #[allow(unsafe_code)]
    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` points to `len` initialised `f32`s owned by `self`
        // (or is dangling and aligned with `len == 0`), and `&self` keeps
        // them alive and unaliased by any `&mut` for the borrow's length.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl core::ops::DerefMut for AlignedTable {
    #[allow(unsafe_code)]
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedTable {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let layout = AlignedTable::layout(self.len).expect("the layout it was allocated with");
        // SAFETY: `ptr` came from `alloc` with this same layout (`layout`
        // depends on `len` only, which never changes) and is freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
    }
}

/// Cloning allocates a table of the same size; running out of memory
/// aborts, as it does for a `Vec`. [`AlignedTable::try_clone`] returns an
/// error instead.
impl Clone for AlignedTable {
    fn clone(&self) -> AlignedTable {
        match self.try_clone() {
            Ok(table) => table,
            Err(_) => std::alloc::handle_alloc_error(
                AlignedTable::layout(self.len).expect("the layout of a table that exists"),
            ),
        }
    }
}

impl core::fmt::Debug for AlignedTable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AlignedTable")
            .field("len", &self.len)
            .field("align", &(self.ptr.as_ptr() as usize & (HUGE_PAGE - 1)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_tables_start_a_line_or_a_huge_page_and_hold_zeros() {
        for len in [
            0,
            1,
            15,
            16,
            1000,
            HUGE_PAGE / 4 - 1,
            HUGE_PAGE / 4,
            HUGE_PAGE / 4 + 3,
        ] {
            let mut t = AlignedTable::zeroed(len).unwrap();
            assert_eq!(t.len(), len);
            assert!(t.iter().all(|x| x.to_bits() == 0), "len {len}");
            let align = match len {
                0 => 1, // empty: a dangling pointer, never read
                _ if len * 4 >= HUGE_PAGE => HUGE_PAGE,
                _ => LINE_BYTES,
            };
            assert_eq!(t.as_ptr() as usize % align, 0, "len {len}");
            t.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
            let copy = t.clone();
            assert_eq!(&copy[..], &t[..]);
            assert_eq!(copy.as_ptr() as usize % align, 0);
        }
        assert_eq!(
            AlignedTable::zeroed(usize::MAX / 2).unwrap_err(),
            crate::EmbeddingError::AllocationFailed {
                what: "table",
                bytes: (usize::MAX / 2) as u128 * 4
            }
        );
    }

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
            let table = zeroed_table(len).unwrap();
            assert_eq!(table.len(), len);
            assert!(table.iter().all(|x| x.to_bits() == 0), "len {len}");
        }
    }

    #[test]
    fn advice_needs_a_whole_huge_page() {
        assert!(!advise_huge_pages::<f32>(&[]));
        assert!(!advise_huge_pages(&[0.0f32; 1024]));
    }

    #[test]
    fn collapsing_keeps_the_values() {
        assert!(!collapse_huge_pages::<f32>(&[]));
        assert!(!collapse_huge_pages(&[1.5f32; 1024]));
        assert!(!collapse_huge_pages(&[(); 1 << 30]));
        // Twenty huge pages' worth, beyond the largest block glibc serves
        // from a heap (32 MiB), so fresh pages of their own, written before
        // the collapse (4 KiB pages by then unless THP is `always`).
        let values: Vec<u32> = (0..20 * HUGE_PAGE as u32 / 4)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let before = values.clone();
        let collapsed = collapse_huge_pages(&values);
        assert!(values == before, "collapsed: {collapsed}");
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if kernel_collapses() {
            assert!(collapsed);
            // The advice split the mapping at the huge pages: the one that
            // starts there is theirs alone.
            let (first, len) = whole_huge_pages(&values).unwrap();
            assert!(anon_huge_bytes(first) >= len, "{len} bytes collapsed");
        }
    }

    /// Whether this kernel has `MADV_COLLAPSE` (Linux 6.1 on) and
    /// transparent huge pages.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn kernel_collapses() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        version >= (6, 1) && std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists()
    }

    /// The `AnonHugePages` of the mapping holding `addr`, from
    /// `/proc/self/smaps` (the advice splits a mapping at the huge pages it
    /// covers, so for `addr` at their start this counts theirs alone).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn anon_huge_bytes(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let mut range = line.split_whitespace().next().unwrap_or("").split('-');
            if let (Some(lo), Some(hi), None) = (range.next(), range.next(), range.next())
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
            if let (true, Some(kb)) = (inside, line.strip_prefix("AnonHugePages:")) {
                return kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<usize>()
                    .unwrap()
                    * 1024;
            }
        }
        0
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
