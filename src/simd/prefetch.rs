//! Cache hints for rows read at random (the ids decide which): the loops
//! ask for a row some positions ahead while they work on the current one, as
//! the hardware prefetcher cannot guess the next row. A hint reads nothing and
//! cannot fault, and it compiles to nothing off x86-64.
//!
//! Every function takes the cache a hint fills as a type, [`L1`] or [`L2`]:
//! a row read many positions ahead goes to L2 (`prefetcht1`), a line written
//! next (a gradient row) to L1 (`prefetcht0`). On the development machine
//! (Zen 3), sending the rows of a lookup or a bag 16 positions ahead to L1
//! was slower than sending the same rows to L2, by 10-35 % warm and cold
//! (docs/benchmarks.md, "Prefetch"): hints into L1 take the line-fill buffers
//! that the loads of the current row need, and evict lines still in use.
//! The exception is a bag of rows of one line or less ([`bag_block`]): a
//! line a row fits those buffers, and into L1 such a bag ran faster.

/// Asks the cache for every 64-byte line `row` touches, ahead of use. A
/// hint only: it reads nothing and cannot fault, and it compiles to nothing
/// off x86-64.
///
/// A row need not start on a line: allocators align to 16 bytes, so a
/// row of 16 floats usually spans two lines and one of 128 floats nine. A
/// hint per 16 floats from the row's start would miss the last line of
/// each; the hints here step from the first line to the line of the last
/// value; a missed last line is a cache miss per row.
#[inline(always)]
pub(crate) fn row<L: Level>(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let Some(last) = row.last() else { return };
        let first = row.as_ptr() as usize & !63;
        let lines = (last as *const f32 as usize - first) / 64 + 1;
        let hint = |k: usize| L::hint(first + 64 * k);
        // Four hints per step, not one per loop trip: the loop's own
        // branches and counter cost more than the hints (measured in
        // docs/benchmarks.md).
        let mut k = 0;
        while k + 4 <= lines {
            hint(k);
            hint(k + 1);
            hint(k + 2);
            hint(k + 3);
            k += 4;
        }
        while k < lines {
            hint(k);
            k += 1;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// Hints for the `len` bytes `base[from..from + len]`, where the caller
/// passes a `len` fixed by its block size (a constant once inlined), so
/// the loop below unrolls into bare hints: one every 64 bytes from the start
/// (at least one) and one at the last byte, which for a run that starts on a
/// line repeats the line before (a hint whose line is already asked for
/// costs an instruction and a load slot: for rows of one line, where it is
/// one of two hints, [`bag_block`] leaves it out) and otherwise reaches the
/// line the run straddles into. Neither the range nor the hints are
/// checked: a hint is only an address (`wrapping_add`), and a wrong one
/// costs a wasted fetch, never a fault.
#[inline(always)]
pub(crate) fn bytes<L: Level>(base: *const u8, from: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = base.wrapping_add(from) as usize;
        for k in 0..len.div_ceil(64) {
            L::hint(start + 64 * k);
        }
        L::hint(start + len.max(1) - 1);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (base, from, len);
}

/// [`bytes`] for a block of a row a bag reads [`bag_ahead`] rows on,
/// the row `row_bytes` long: into L1 when the whole row fits one line, into
/// L2 otherwise. A bag of narrow rows then has a line or two a row in
/// flight (two where a row straddles a line), which L1's miss buffers hold,
/// and its loads find the rows in L1; a bag of wider rows asks for more
/// lines than those buffers hold, and into L1 it was 1.1-2.4x slower than
/// into L2 (docs/benchmarks.md, "Prefetch"). The rule looks at the row, not
/// the block, so a wide row's short last block (or a packed row's block of
/// few bytes) stays with L2, as measured.
///
/// Where the caller knows the row to be one whole line (`row_is_line`: 64
/// bytes from a line's start), the block is in that line and one hint at
/// `from` reaches it, not the two [`bytes`] gives a run that need not start
/// a line (docs/benchmarks.md, "One hint for a row of one line").
///
/// [`bag_ahead`]: crate::kernels::tuning::bag_ahead
#[inline(always)]
pub(crate) fn bag_block(
    base: *const u8,
    from: usize,
    len: usize,
    row_bytes: usize,
    row_is_line: bool,
) {
    if row_is_line {
        #[cfg(target_arch = "x86_64")]
        L1::hint(base.wrapping_add(from) as usize);
    } else if row_bytes <= crate::memory::LINE_BYTES {
        bytes::<L1>(base, from, len);
    } else {
        bytes::<L2>(base, from, len);
    }
}

/// The cache a hint fills: [`L1`] or [`L2`].
pub(crate) trait Level {
    /// One prefetch of the line holding `addr` into this level (and the
    /// levels below it); nothing off x86-64.
    fn hint(addr: usize);
}

/// `prefetcht0`: into L1, for a line the loop touches within a few rows.
pub(crate) struct L1;

/// `prefetcht1`: into L2, not L1, for a row read many positions on.
pub(crate) struct L2;

impl Level for L1 {
    #[inline(always)]
    fn hint(addr: usize) {
        line::<HINT_T0>(addr);
    }
}

impl Level for L2 {
    #[inline(always)]
    fn hint(addr: usize) {
        line::<HINT_T1>(addr);
    }
}

/// `_mm_prefetch`'s strategies (`_MM_HINT_T0`, `_MM_HINT_T1`), named here
/// so that they exist on every target.
const HINT_T0: i32 = 3;
const HINT_T1: i32 = 2;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    HINT_T0 == core::arch::x86_64::_MM_HINT_T0 && HINT_T1 == core::arch::x86_64::_MM_HINT_T1
);

/// One prefetch with strategy `STRATEGY` of the line holding `addr`;
/// nothing off x86-64.
#[inline(always)]
#[allow(unsafe_code)]
fn line<const STRATEGY: i32>(addr: usize) {
    // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has (it is in
    // the target's baseline features). A prefetch never dereferences its
    // address: any address, in a live slice or not, cannot fault and
    // changes no memory.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<STRATEGY>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Hints for the bytes `base[from..to]`: one at every 64 bytes from
/// `from` and one at the last byte. Like [`bytes`], the range is not
/// checked: the hints are only addresses (`wrapping_add`), and a wrong one
/// costs a wasted fetch, never a fault.
#[inline(always)]
pub(crate) fn span<L: Level>(base: *const u8, from: usize, to: usize) {
    #[cfg(target_arch = "x86_64")]
    if from < to {
        let start = base.wrapping_add(from) as usize;
        let last = base.wrapping_add(to - 1) as usize;
        let mut at = start;
        while at < last {
            L::hint(at);
            at += 64;
        }
        L::hint(last);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (base, from, to);
}
