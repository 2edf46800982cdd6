//! Position embeddings for a transformer's input: the sinusoidal table of
//! *Attention Is All You Need*, and the fused kernels that add a position
//! table to the token embeddings (forward) and split the gradient between
//! the two tables (backward).
//!
//! ```
//! use embedding_kernels::{embed_positions, positions::sinusoidal_positions};
//!
//! let (vocab, dim, max_len) = (100, 8, 16);
//! let table = vec![0.01f32; vocab * dim];
//! let positions = sinusoidal_positions(max_len, dim)?;
//! let ids = [5u32, 7, 9, 11, 5, 0]; // 2 sequences of 3 tokens
//! let mut out = vec![0.0; ids.len() * dim];
//! let scale = (dim as f32).sqrt();
//! embed_positions(&table, &positions, dim, &ids, 3, Some(scale), &mut out)?;
//! // Token 0 of each sequence takes position 0, whose row is [0, 1, 0, 1, …].
//! assert_eq!(out[1], 0.01 * scale + 1.0);
//! # Ok::<(), embedding_kernels::EmbeddingError>(())
//! ```

use crate::buffer::with_capacity;
use crate::error::EmbeddingError;
use crate::shape::rows_len;

/// The sinusoidal position table of *Attention Is All You Need* (Vaswani et
/// al., 2017, section 3.5): `max_len × dim` values, row-major, with
///
/// ```text
/// PE[pos, 2i]     = sin(pos / 10000^(2i / dim))
/// PE[pos, 2i + 1] = cos(pos / 10000^(2i / dim))
/// ```
///
/// for `pos` in `0..max_len` and every column `2i`, `2i + 1` below `dim`.
/// An odd `dim` works: its last column, `dim - 1`, is a sine whose cosine
/// partner would be column `dim`. Row 0 is `[0, 1, 0, 1, …]`, and every value
/// lies in `[-1, 1]`.
///
/// **Precision.** Each value is computed in `f64` (the power, the quotient,
/// then the sine or cosine) and rounded once, to the nearest `f32`. The `f64`
/// steps stray from exact arithmetic by about `pos × 2^-52` radians, which
/// for any realistic `max_len` (below 2^16 say) is thousands of times less
/// than an `f32` ulp of a value of size 1/2 or more; so the table is the
/// correctly rounded one except, rarely, in the last bit of a value. The
/// values come from the platform's `sin` and `cos`: the same bits on every
/// run, but not promised to be the same bits on every platform.
///
/// # Errors
/// [`EmbeddingError::SizeOverflow`] (`count` = `max_len`) if `max_len × dim`
/// overflows `usize`; [`EmbeddingError::AllocationFailed`] if the table's
/// memory cannot be allocated. Both are checked before any value is computed.
///
/// # Example
/// ```
/// use embedding_kernels::positions::sinusoidal_positions;
/// let pe = sinusoidal_positions(2, 4)?;
/// assert_eq!(&pe[..4], &[0.0, 1.0, 0.0, 1.0]);
/// // pos 1: sin(1), cos(1), sin(1/100), cos(1/100)
/// assert_eq!(pe[4], 1f64.sin() as f32);
/// assert_eq!(pe[6], 0.01f64.sin() as f32);
/// # Ok::<(), embedding_kernels::EmbeddingError>(())
/// ```
pub fn sinusoidal_positions(max_len: usize, dim: usize) -> Result<Vec<f32>, EmbeddingError> {
    let len = rows_len(max_len, dim)?;
    if len == 0 {
        // No values: nothing to allocate, whatever the other size is (and
        // no loop over `max_len` empty rows).
        return Ok(Vec::new());
    }
    let mut table = with_capacity(len, "positions")?;
    // 10000^(2i / dim) for each pair of columns 2i, 2i + 1.
    let pairs = dim.div_ceil(2);
    let mut denominators = with_capacity(pairs, "positions")?;
    denominators.extend((0..pairs).map(|i| 10000f64.powf((2 * i) as f64 / dim as f64)));
    for pos in 0..max_len {
        for col in 0..dim {
            let angle = pos as f64 / denominators[col / 2];
            let value = if col.is_multiple_of(2) {
                angle.sin()
            } else {
                angle.cos()
            };
            table.push(value as f32);
        }
    }
    Ok(table)
}
