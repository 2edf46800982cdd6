//! Cache hints for rows read at random (the ids decide which): the loops
//! ask for a row some positions ahead while they work on the current one, as
//! the hardware prefetcher cannot guess the next row. A hint reads nothing and
//! cannot fault, and it compiles to nothing off x86-64.
//!
//! Every function takes the cache a hint fills as a type, [`L1`] or [`L2`]:
//! a row read many positions ahead goes to L2 (`prefetcht1`), a line written
//! next (a gradient row) to L1 (`prefetcht0`). On a 32 KiB L1, sending the
//! rows of a lookup or a bag 16 positions ahead to L1 was slower than to
//! L2, warm and cold: hints into L1 take the line-fill buffers that the
//! loads of the current row need, and evict lines still in use
//! (docs/design.md, "Gather and prefetch").
//! The exceptions are bags ([`BagHints`]): of rows of one line or less on
//! any CPU (a line a row fits those buffers, and into L1 such a bag ran
//! faster), and of any rows on a CPU with a roomy L1 (48 KiB or more); and
//! on such a CPU the gathers whose rows ahead span 8 KiB or less
//! (`tuning::gather_hints_in_l1`).

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
        // branches and counter cost more than the hints (docs/design.md,
        // "Gather and prefetch").
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

/// How many lines each row of a table touches, worked out once a call where
/// it is the same for every row: rows of a whole number of lines all start
/// at the same offset within a line, so the same part of each spans the same
/// count of lines. Hinting that count from the first line of each row's
/// part leaves the hot loop a fixed number of hints; [`row`], which works the
/// count out from each row's address, made recsys's gather slower, the
/// hints' count then depending on the id just loaded (docs/design.md,
/// "Gather and prefetch").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowLines(Option<usize>);

impl RowLines {
    /// The lines that the part `sample` of any row (the same columns of
    /// every row) touches, rows of `row_floats`: a fixed count where rows are
    /// a whole number of lines, else `None` (each row then counts its own).
    pub(crate) fn of(sample: &[f32], row_floats: usize) -> RowLines {
        let line = crate::memory::LINE_BYTES;
        let row_bytes = row_floats.saturating_mul(core::mem::size_of::<f32>());
        if sample.is_empty() || !row_bytes.is_multiple_of(line) {
            return RowLines(None);
        }
        let offset = sample.as_ptr() as usize % line;
        let bytes = core::mem::size_of_val(sample);
        RowLines(Some(offset.saturating_add(bytes).div_ceil(line)))
    }

    /// Hints every line of `part` (the same part of another row as the
    /// sample [`RowLines::of`] was given): the fixed count from its first
    /// line, or [`row`]'s own count.
    #[inline(always)]
    pub(crate) fn hint<L: Level>(self, part: &[f32]) {
        match self.0 {
            Some(lines) => {
                let first = part.as_ptr() as usize & !(crate::memory::LINE_BYTES - 1);
                for k in 0..lines {
                    L::hint(first + crate::memory::LINE_BYTES * k);
                }
            }
            None => row::<L>(part),
        }
    }
}

/// Hints for the `len` bytes `base[from..from + len]`, where the caller
/// passes a `len` fixed by its block size (a constant once inlined), so
/// the loop below unrolls into bare hints: one every 64 bytes from the start
/// (at least one) and one at the last byte, which for a run that starts on a
/// line repeats the line before (a hint whose line is already asked for
/// costs an instruction and a load slot: for rows of one line, where it is
/// one of two hints, [`BagHints::Line`] leaves it out) and otherwise reaches
/// the line the run straddles into. Neither the range nor the hints are
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

/// How a bag hints the blocks of the rows it reads some positions on:
/// chosen once a call, from the row's bytes and the CPU's L1 data cache
/// ([`BagHints::for_rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BagHints {
    /// Every row is one whole line (64 bytes from a line's start), so a
    /// block is that line and one hint into L1 at its start reaches it, not
    /// the two [`bytes`] gives a run that need not start a line
    /// (docs/design.md, "Bags").
    Line,
    /// [`bytes`] into L1.
    L1,
    /// [`bytes`] into L2.
    L2,
}

impl BagHints {
    /// The hints for rows of `row_bytes`: into L1 where a row is a line or
    /// less, whatever the CPU, and for wider rows too where the CPU's L1 data
    /// cache is roomy ([`roomy_l1`]); into L2 otherwise.
    ///
    /// A bag of narrow rows has a line or two a row in flight (two where a
    /// row straddles a line), which L1's miss buffers hold, and its loads
    /// find the rows in L1. With wider rows it depends on the L1: with 32 KiB
    /// of L1 data hints into L1 made the bags of wide rows slower than into
    /// L2; with 48 KiB they made them faster in every format
    /// (docs/design.md, "Gather and prefetch"). The rule looks at the row,
    /// not the block, so a wide row's short last block follows its row.
    pub(crate) fn for_rows(row_bytes: usize) -> BagHints {
        Self::rule(row_bytes, roomy_l1())
    }

    /// [`for_rows`](Self::for_rows) on a CPU with a roomy L1 (`roomy`) or
    /// not.
    pub(crate) fn rule(row_bytes: usize, roomy: bool) -> BagHints {
        if row_bytes <= crate::memory::LINE_BYTES || roomy {
            BagHints::L1
        } else {
            BagHints::L2
        }
    }
}

/// [`bytes`] for a block of a row, as `hints` says.
#[inline(always)]
pub(crate) fn bag_block(base: *const u8, from: usize, len: usize, hints: BagHints) {
    match hints {
        BagHints::Line => L1::hint(base.wrapping_add(from) as usize),
        BagHints::L1 => bytes::<L1>(base, from, len),
        BagHints::L2 => bytes::<L2>(base, from, len),
    }
}

/// The L1 data cache size, in bytes, from which the bags send the hints of
/// rows wider than a line into L1 ([`BagHints::for_rows`]): 48 KiB.
pub(crate) const ROOMY_L1_BYTES: usize = 48 << 10;

/// Whether this CPU's L1 data cache holds [`ROOMY_L1_BYTES`] or more, as
/// [`l1_data_bytes`] reads it (asked once, then remembered); `false` where
/// the size is unknown, which keeps the hints measured on 32 KiB.
pub(crate) fn roomy_l1() -> bool {
    static ROOMY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOMY.get_or_init(|| l1_data_bytes().is_some_and(|b| b >= ROOMY_L1_BYTES))
}

/// The size of the L1 data cache, as Linux describes the first CPU's caches
/// (`/sys/devices/system/cpu/cpu0/cache/index*/`, read by the kernel from
/// CPUID): `None` on other systems, or where the description is missing
/// (a virtual CPU that hides its caches).
pub(crate) fn l1_data_bytes() -> Option<usize> {
    let caches = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for k in 0..16 {
        let index = caches.join(format!("index{k}"));
        let read = |name: &str| std::fs::read_to_string(index.join(name)).ok();
        let level = read("level")?;
        if level.trim() == "1" && read("type")?.trim() == "Data" {
            return cache_size(read("size")?.trim());
        }
    }
    None
}

/// A cache size as Linux writes it (`48K`, `1024K`, `32M`, or bytes), in
/// bytes; `None` for anything else.
fn cache_size(text: &str) -> Option<usize> {
    let (digits, unit) = match text.strip_suffix('K') {
        Some(digits) => (digits, 1 << 10),
        None => match text.strip_suffix('M') {
            Some(digits) => (digits, 1 << 20),
            None => (text, 1),
        },
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<usize>().ok()?.checked_mul(unit)
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

#[cfg(test)]
mod tests {
    use super::{BagHints, ROOMY_L1_BYTES, RowLines, cache_size, l1_data_bytes, roomy_l1};

    /// The lines a run of floats touches, from its first value's line to its
    /// last's.
    fn lines_of(part: &[f32]) -> usize {
        let first = part.as_ptr() as usize / 64;
        let last = part.as_ptr().wrapping_add(part.len() - 1) as usize / 64;
        last - first + 1
    }

    std::thread_local! {
        static HINTED: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// A level that records the lines it is asked for.
    struct Record;

    impl super::Level for Record {
        fn hint(addr: usize) {
            HINTED.with(|h| h.borrow_mut().push(addr / 64));
        }
    }

    /// Where every row is a whole number of lines the count is fixed once,
    /// and not otherwise; either way the hints for a part of any row, from
    /// any offset of the table, ask for each line the part touches, once
    /// each, and no other.
    #[test]
    fn row_lines_hint_exactly_the_lines_of_each_part() {
        let table = vec![0.0f32; 24 * 160 + 64];
        for dim in [1, 3, 15, 16, 17, 32, 48, 100, 128, 144, 160] {
            for offset in 0..16 {
                for cols in [0..dim, 0..1, dim / 2..dim, dim - 1..dim] {
                    let part = |r: usize| &table[offset + r * dim..][cols.clone()];
                    let lines = RowLines::of(part(0), dim);
                    assert_eq!(
                        lines.0.is_some(),
                        dim.is_multiple_of(16),
                        "dim {dim} offset {offset} cols {cols:?}"
                    );
                    for r in 0..24 {
                        HINTED.with(|h| h.borrow_mut().clear());
                        lines.hint::<Record>(part(r));
                        let first = part(r).as_ptr() as usize / 64;
                        let want: Vec<usize> = (first..first + lines_of(part(r))).collect();
                        let got = HINTED.with(|h| h.borrow().clone());
                        assert_eq!(got, want, "dim {dim} offset {offset} cols {cols:?} row {r}");
                        if let RowLines(Some(count)) = lines {
                            assert_eq!(count, lines_of(part(r)), "dim {dim} row {r}");
                        }
                    }
                }
            }
        }
        assert_eq!(RowLines::of(&[], 16), RowLines(None));
    }

    /// Rows of a line or less are hinted whole into L1 on every CPU; wider
    /// ones into L1 on a roomy L1 and into L2 on a small one.
    #[test]
    fn bag_hint_rule_in_every_case() {
        for roomy in [false, true] {
            for bytes in [0, 1, 63, 64] {
                assert_eq!(BagHints::rule(bytes, roomy), BagHints::L1);
            }
            let wide = if roomy { BagHints::L1 } else { BagHints::L2 };
            for bytes in [65, 136, 512, 3072, usize::MAX] {
                assert_eq!(BagHints::rule(bytes, roomy), wide, "{bytes}");
            }
        }
        assert_eq!(BagHints::for_rows(512), BagHints::rule(512, roomy_l1()));
    }

    /// Sizes read as Linux writes them, and nothing else.
    #[test]
    fn cache_sizes_read_as_linux_writes_them() {
        assert_eq!(cache_size("48K"), Some(48 << 10));
        assert_eq!(cache_size("1024K"), Some(1 << 20));
        assert_eq!(cache_size("32M"), Some(32 << 20));
        assert_eq!(cache_size("512"), Some(512));
        for bad in [
            "",
            "K",
            "M",
            "-1K",
            "4 K",
            "1.5M",
            "48KiB",
            "99999999999999999999M",
        ] {
            assert_eq!(cache_size(bad), None, "{bad:?}");
        }
    }

    /// The L1 data cache found, if any, is a plausible one (a whole number
    /// of 64-byte lines, 8 KiB to 256 KiB), and the hints' choice follows it.
    #[test]
    fn the_l1_data_cache_reads_as_a_cache() {
        let bytes = l1_data_bytes();
        if let Some(b) = bytes {
            assert!(
                b.is_multiple_of(64) && (8 << 10..=256 << 10).contains(&b),
                "{b} bytes"
            );
        }
        assert_eq!(roomy_l1(), bytes.is_some_and(|b| b >= ROOMY_L1_BYTES));
    }
}
