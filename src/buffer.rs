//! Fallible allocation: every buffer whose size comes from the caller (a
//! table, an output, a gradient, bag boundaries) is allocated here, so that
//! a size the machine cannot serve returns
//! [`EmbeddingError::AllocationFailed`] instead of aborting the process.
//!
//! A size that overflows the address space fails the same way (its byte
//! count is reported exactly, as a `u128`). A size the allocator grants but
//! the system cannot back later (Linux overcommit) is outside a library's
//! reach: the pages are only taken as they are written.

use crate::error::EmbeddingError;
use bytemuck::Zeroable;

/// The error for `len` values of `T`.
fn refused<T>(len: usize, what: &'static str) -> EmbeddingError {
    EmbeddingError::AllocationFailed {
        what,
        bytes: len as u128 * core::mem::size_of::<T>() as u128,
    }
}

/// `len` zeros, from zeroed memory (so a large buffer is fresh pages the
/// kernel zeroes as they are first touched, as `vec![0; len]` gets).
pub(crate) fn zeroed<T: Zeroable>(
    len: usize,
    what: &'static str,
) -> Result<Vec<T>, EmbeddingError> {
    bytemuck::allocation::try_zeroed_vec(len).map_err(|()| refused::<T>(len, what))
}

/// An empty `Vec` with room for exactly `len` values.
pub(crate) fn with_capacity<T>(len: usize, what: &'static str) -> Result<Vec<T>, EmbeddingError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| refused::<T>(len, what))?;
    Ok(v)
}

/// A copy of `values`.
#[cfg_attr(not(test), expect(dead_code, reason = "callers land next"))]
pub(crate) fn copied<T: Copy>(values: &[T], what: &'static str) -> Result<Vec<T>, EmbeddingError> {
    let mut v = with_capacity(values.len(), what)?;
    v.extend_from_slice(values);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_past_the_address_space_are_errors_with_their_byte_count() {
        let len = usize::MAX / 2;
        assert_eq!(
            zeroed::<f32>(len, "table"),
            Err(EmbeddingError::AllocationFailed {
                what: "table",
                bytes: len as u128 * 4
            })
        );
        assert_eq!(
            with_capacity::<u64>(len, "output").unwrap_err(),
            EmbeddingError::AllocationFailed {
                what: "output",
                bytes: len as u128 * 8
            }
        );
    }

    #[test]
    fn sizes_no_machine_holds_are_errors() {
        // 2^46 bytes (64 TiB): a valid layout that no allocator grants.
        let len = 1usize << 44;
        assert!(matches!(
            zeroed::<f32>(len, "table"),
            Err(EmbeddingError::AllocationFailed { bytes, .. }) if bytes == 1 << 46
        ));
        assert!(with_capacity::<f32>(len, "table").is_err());
    }

    #[test]
    fn small_buffers_are_zeros_or_copies() {
        assert_eq!(zeroed::<f32>(3, "t").unwrap(), vec![0.0; 3]);
        assert!(zeroed::<f32>(0, "t").unwrap().is_empty());
        let v = with_capacity::<u8>(5, "t").unwrap();
        assert!(v.is_empty() && v.capacity() == 5);
        assert_eq!(copied(&[1, 2, 3], "t").unwrap(), vec![1, 2, 3]);
    }
}
