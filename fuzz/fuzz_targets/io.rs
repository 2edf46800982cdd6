//! Feeds arbitrary bytes to every reader of `embedding_kernels::io` as a
//! safetensors file (`from_bytes`, `table_from_bytes`, `packed_from_bytes`,
//! `all_from_bytes`), and checks for each call:
//!
//! * **memory**: a counting global allocator tracks the bytes live and their
//!   peak; the peak of one call, above what was live before it, stays under
//!   [`PEAK_PER_INPUT_BYTE`] × the input's length + [`PEAK_ALLOWANCE`]. A
//!   header that claims more than the file holds, or lists shapes of
//!   millions of dims, must not cost more than its bytes;
//! * **against the `safetensors` crate**: a table read is the tensor that
//!   crate reads from the same bytes (dtype, shape, every byte), and a file
//!   refused as malformed (length, JSON, sizes, ranges) is refused by it
//!   too. (It is only called where it cannot overflow: with overflow checks
//!   on, it panics on a data end near `usize::MAX`, which our reader refuses
//!   as `FileLength`.) The two refusals of our own, a name listed twice and
//!   a tensor read with more than `MAX_DIMS` dims, are not compared;
//! * **round trip**: an `f32` table read, saved and read again keeps every
//!   bit.
//!
//! Each reader is asked for the tensor `w`, then for the first two names
//! the file holds (from a `MissingTensor` error). The seeds in
//! `fuzz/seeds/io/` are small files the crate wrote and the hostile headers
//! of `tests/hostile/files.rs`, small versions of each.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use embedding_kernels::formats::{Format, RowWise};
use embedding_kernels::io::{self, FileError};
use libfuzzer_sys::fuzz_target;
use safetensors::{Dtype, SafeTensors};

/// The most bytes one call may hold at its peak per byte of input.
const PEAK_PER_INPUT_BYTE: usize = 8;

/// Bytes one call may hold beyond that, whatever its input.
const PEAK_ALLOWANCE: usize = 64 << 10;

/// The bytes allocated and not yet freed, and their peak.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting.
struct Counting;

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments, so
// it keeps `System`'s guarantees; the counting touches only atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with
        // `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`, and `new_size` as the caller guarantees.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Counted as both blocks at once: a move holds both.
            grew(new_size);
            shrank(layout.size());
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `call` and checks the peak of the memory it held.
fn bounded<T>(what: &str, input_len: usize, call: impl FnOnce() -> T) -> T {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = call();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    let limit = PEAK_PER_INPUT_BYTE * input_len + PEAK_ALLOWANCE;
    assert!(
        peak <= limit,
        "{what} held {peak} bytes at its peak on {input_len} bytes of input (limit {limit})"
    );
    out
}

/// Whether the `safetensors` crate can be called on `data` without its
/// data-end overflow: ours refused it with a length past `usize`.
fn theirs_is_safe(ours: &Result<impl Sized, FileError>) -> bool {
    !matches!(ours, Err(FileError::FileLength { expected, .. }) if *expected > usize::MAX as u128)
}

/// Whether our error says the file is malformed, as `safetensors` would.
fn malformed(error: &FileError) -> bool {
    matches!(
        error,
        FileError::HeaderTooLong { .. }
            | FileError::FileLength { .. }
            | FileError::Format(_)
            | FileError::TensorTooLarge { .. }
            | FileError::TensorBytes { .. }
            | FileError::DataOffsets { .. }
    )
}

/// Ours against theirs for one reader's result: a malformed file is refused
/// by both; an `Ok` or an error about the tensor means they parsed it.
fn same_verdict<T>(data: &[u8], ours: &Result<T, FileError>) {
    if !theirs_is_safe(ours) {
        return;
    }
    match ours {
        Err(FileError::DuplicateEntry { .. } | FileError::TooManyDims { .. }) => {}
        Err(error) if malformed(error) => assert!(
            SafeTensors::deserialize(data).is_err(),
            "we refuse a file safetensors reads: {error}"
        ),
        _ => {
            if let Err(error) = SafeTensors::deserialize(data) {
                panic!(
                    "we read a file safetensors refuses ({error}): {:?}",
                    ours.as_ref().err()
                );
            }
        }
    }
}

/// Checks one name of the file with every reader.
fn check_name(data: &[u8], name: &str) {
    let f32s = bounded("from_bytes", data.len(), || io::from_bytes(data, name));
    same_verdict(data, &f32s);
    if let Ok(table) = &f32s {
        let file = SafeTensors::deserialize(data).expect("checked by same_verdict");
        let theirs = file.tensor(name).expect("a tensor we read");
        assert_eq!(theirs.dtype(), Dtype::F32);
        assert_eq!(theirs.shape(), [table.num_embeddings, table.embedding_dim]);
        let bytes: Vec<u8> = table.weight.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(bytes, theirs.data(), "{name}: the values");
        let again = io::to_bytes(&[table.as_entry()]).expect("a table read saves");
        let back = io::from_bytes(&again, name).expect("a table saved reads");
        let bits = |t: &io::Table| t.weight.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(table), "{name}: the round trip");
        assert_eq!(back.embedding_dim, table.embedding_dim);
    }

    let any = bounded("table_from_bytes", data.len(), || {
        io::table_from_bytes(data, name)
    });
    same_verdict(data, &any);
    if let Ok(table) = &any {
        let file = SafeTensors::deserialize(data).expect("checked by same_verdict");
        let theirs = file.tensor(name).expect("a tensor we read");
        let ours = table.to_le_bytes().expect("the bytes of a table that fits");
        assert_eq!(ours, theirs.data(), "{name}: the bytes");
        let dtype = match table.format() {
            Format::F32 => Dtype::F32,
            Format::F16 => Dtype::F16,
            Format::Bf16 => Dtype::BF16,
            Format::Int8 | Format::Int4 | Format::Int2 => Dtype::U8,
        };
        assert_eq!(theirs.dtype(), dtype);
        // A `[rows, 0]` half or f32 tensor reads as width 0 and no rows, as
        // the kernels count such a table (io's module docs).
        let rows = if table.dim() == 0 {
            0
        } else {
            theirs.shape()[0]
        };
        assert_eq!(
            table.rows(),
            rows,
            "{name}: the rows of {:?}",
            theirs.shape()
        );
    }

    for (format, dim) in [(RowWise::Int8, 1), (RowWise::Int4, 3), (RowWise::Int2, 0)] {
        let packed = bounded("packed_from_bytes", data.len(), || {
            io::packed_from_bytes(data, name, format, dim)
        });
        same_verdict(data, &packed);
        if let Ok(table) = &packed {
            let file = SafeTensors::deserialize(data).expect("checked by same_verdict");
            let theirs = file.tensor(name).expect("a tensor we read");
            let ours = table.to_le_bytes().expect("the bytes of a table that fits");
            assert_eq!(ours, theirs.data(), "{name}: the packed bytes");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let first = bounded("from_bytes", data.len(), || io::from_bytes(data, "w"));
    check_name(data, "w");
    if let Err(FileError::MissingTensor { available, .. }) = first {
        for name in available.iter().take(2) {
            check_name(data, name);
        }
    }

    let all = bounded("all_from_bytes", data.len(), || io::all_from_bytes(data));
    same_verdict(data, &all);
    if let Ok(tables) = &all {
        let file = SafeTensors::deserialize(data).expect("checked by same_verdict");
        let mut names = file.names();
        names.sort_unstable();
        let ours: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(ours, names);
    }
});
