//! Shape checks shared by every entry point (see the order in
//! [`error`](crate::error)).

use crate::error::{EmbeddingError, Operand};

/// The number of rows in a table of `len` values and row width `dim`.
///
/// A table with `dim == 0` must be empty, and then has no rows: with no
/// values there is nothing to count them by, so every id is out of range.
pub(crate) fn table_rows(
    len: usize,
    dim: usize,
    operand: Operand,
) -> Result<usize, EmbeddingError> {
    if dim == 0 {
        return if len == 0 {
            Ok(0)
        } else {
            Err(EmbeddingError::ZeroDimWithData { operand, len })
        };
    }
    if !len.is_multiple_of(dim) {
        return Err(EmbeddingError::NotMultipleOfDim { operand, len, dim });
    }
    Ok(len / dim)
}

/// `count × dim`, the length of `count` rows, or an error if it overflows.
pub(crate) fn rows_len(count: usize, dim: usize) -> Result<usize, EmbeddingError> {
    count
        .checked_mul(dim)
        .ok_or(EmbeddingError::SizeOverflow { count, dim })
}

/// Checks that a buffer holds exactly `expected` values.
pub(crate) fn check_len(
    operand: Operand,
    expected: usize,
    got: usize,
) -> Result<(), EmbeddingError> {
    if expected == got {
        Ok(())
    } else {
        Err(EmbeddingError::LengthMismatch {
            operand,
            expected,
            got,
        })
    }
}
