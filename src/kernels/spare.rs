//! Index vectors kept per thread between calls.
//!
//! The grouped backward sorts a batch's positions into a handful of
//! `Vec<usize>`s (half a megabyte each for recsys's 65 536 ids). Freshly
//! allocated, such vectors come from `mmap` and every 4 KiB page faults on
//! its first write; glibc hands the pages back on `free`, so the next call
//! faults them in again. In a VM a fault is dear, and recsys's grouping
//! spent most of its time faulting fresh vectors in (docs/design.md, "The
//! grouped backward"). So the vectors of a finished grouping wait here, on
//! the thread that built it, for the next one.
//!
//! What a thread keeps is bounded ([`SPARE_VECTORS`](super::tuning::SPARE_VECTORS) vectors,
//! [`SPARE_BYTES`](super::tuning::SPARE_BYTES) in all); the largest are kept, the rest freed.

use super::tuning::{SPARE_BYTES as KEEP_BYTES, SPARE_VECTORS as KEEP};
use crate::error::EmbeddingError;
use std::cell::RefCell;

thread_local! {
    static SPARE: RefCell<Vec<Vec<usize>>> = const { RefCell::new(Vec::new()) };
}

/// An empty vector with room for at least `len` values: the smallest of
/// this thread's spare vectors that is large enough, or a new one.
///
/// A new one the allocator refuses is
/// [`AllocationFailed`](EmbeddingError::AllocationFailed) ("workspace").
pub(crate) fn take(len: usize) -> Result<Vec<usize>, EmbeddingError> {
    let found = SPARE
        .try_with(|spare| {
            let mut spare = spare.try_borrow_mut().ok()?;
            let (at, _) = spare
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= len)
                .min_by_key(|(_, v)| v.capacity())?;
            Some(spare.swap_remove(at))
        })
        .ok()
        .flatten();
    match found {
        Some(v) => Ok(v),
        None => crate::buffer::with_capacity(len, "workspace"),
    }
}

/// Keeps `v`, emptied, for a later [`take`] on this thread, within the
/// bounds; what does not fit is freed, smallest first.
pub(crate) fn give(mut v: Vec<usize>) {
    let bytes = |v: &Vec<usize>| v.capacity() * core::mem::size_of::<usize>();
    if v.capacity() == 0 || bytes(&v) > KEEP_BYTES {
        return;
    }
    v.clear();
    // During thread teardown the thread local may be gone: then `v` is
    // simply freed.
    let _ = SPARE.try_with(|spare| {
        let Ok(mut spare) = spare.try_borrow_mut() else {
            return;
        };
        spare.push(v);
        spare.sort_unstable_by_key(|v| core::cmp::Reverse(v.capacity()));
        let mut held = 0;
        let fits = spare
            .iter()
            .take_while(|v| {
                held += bytes(v);
                held <= KEEP_BYTES
            })
            .count();
        spare.truncate(fits.min(KEEP));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_vector_comes_back_empty_and_large_enough() {
        SPARE.with_borrow_mut(Vec::clear);
        let mut v = take(1000).unwrap();
        v.extend(0..1000);
        let ptr = v.as_ptr();
        give(v);
        let again = take(500).unwrap();
        assert!(again.is_empty());
        assert!(again.capacity() >= 1000);
        assert_eq!(again.as_ptr(), ptr, "the spare vector is reused");
        // Nothing spare is large enough now: a new vector.
        let big = take(1 << 20).unwrap();
        assert!(big.capacity() >= 1 << 20);
        assert_ne!(big.as_ptr(), ptr);
        give(again);
        give(big);
        // A size no allocator grants is an error, not an abort.
        assert_eq!(
            take(1 << 60).unwrap_err(),
            EmbeddingError::AllocationFailed {
                what: "workspace",
                bytes: (1u128 << 60) * word_bytes()
            }
        );
    }

    fn word_bytes() -> u128 {
        core::mem::size_of::<usize>() as u128
    }

    #[test]
    fn the_bounds_hold() {
        SPARE.with_borrow_mut(Vec::clear);
        let word = core::mem::size_of::<usize>();
        for _ in 0..2 * KEEP {
            give(Vec::with_capacity(1024));
        }
        give(Vec::with_capacity(KEEP_BYTES / word + 1)); // too large to keep
        SPARE.with_borrow(|spare| {
            assert!(spare.len() <= KEEP);
            let held: usize = spare.iter().map(|v| v.capacity() * word).sum();
            assert!(held <= KEEP_BYTES);
        });
        // A vector that fills the byte bound pushes the small ones out.
        give(Vec::with_capacity(KEEP_BYTES / word));
        SPARE.with_borrow(|spare| {
            assert_eq!(spare.len(), 1);
            assert_eq!(spare[0].capacity(), KEEP_BYTES / word);
        });
    }
}
