//! The lookup on tables of every format: `out[i, :]` = row `ids[i]` read
//! back as `f32` ([`table_gather`]), and the raw copy of half rows
//! ([`gather_half`]).
//!
//! ```text
//! check out length, every id                    (nothing written yet)
//! for i in 0..ids.len():                        (split across threads)
//!     prefetch row ids[i + ahead]
//!     for each column block of the row:         (16 vectors, 8, ..., the tail)
//!         out[i, block] = decode(row ids[i], block)   (packed: fma(q, scale, bias))
//! ```
//!
//! An `f32` table goes to [`gather`](super::gather) itself. The other
//! formats decode through [`RowFormat`], the bags' abstraction, so a looked
//! up value has the bits of [`dequantize`](crate::formats::RowWise::dequantize)
//! (or of the widened half) and of a bag holding that one id. Tasks of whole
//! output rows, as the `f32` gather: the bits cannot depend on the thread
//! count.

use super::blocks::{BlockBody, Cols, Widest, each_block};
use super::gather::{for_each_row_block, gather_valid};
use super::row_format::{Affine, OnRows, RowFormat, RowSpan, Sink, dispatch, value};
use super::tuning::{PREFETCH_MIN_TABLE_BYTES, prefetch_ahead};
use crate::error::{EmbeddingError, Operand};
use crate::formats::{Data, TableRef};
use crate::index::{AnyValidIds, Index, RowId, ValidIds, check_splits, each_row_type, run_rows};
use crate::parallel::{Parallelism, in_pool};
use crate::shape::{check_len, rows_len, table_rows};
use crate::simd::prefetch::{self, L2};
use crate::simd::{Body, Isa, Lanes, MAX_LANES};

/// `out[i, :]` = row `ids[i]` of `table` as `f32`s, for every `i`:
/// [`table_gather_with`] with [`Parallelism::Auto`].
///
/// # Errors
/// As [`table_gather_with`].
///
/// # Example
/// ```
/// use embedding_kernels::formats::{PackedTable, RowWise, TableRef};
/// use embedding_kernels::table_gather;
/// let table = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]; // 3 rows of dim 2
/// let packed = RowWise::Int8.prepack(&table, 2)?;
/// let packed = PackedTable::new(RowWise::Int8, 2, &packed)?;
/// let mut out = [0.0f32; 4];
/// table_gather(packed.into(), &[2i64, 0], &mut out)?;
/// assert_eq!(out, [2.0, 2.5, 0.0, 0.5]);
/// # Ok::<(), embedding_kernels::EmbeddingError>(())
/// ```
pub fn table_gather<I: Index>(
    table: TableRef<'_>,
    ids: &[I],
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    table_gather_with(Parallelism::Auto, table, ids, out)
}

/// [`gather_with`](crate::gather_with) on a table of any format: `out[i, :]`
/// = row `ids[i]` read back as `f32` (an `f16` or `bf16` widened exactly, a
/// packed value `fma(q, scale, bias)`, the bits of
/// [`RowWise::dequantize`](crate::formats::RowWise::dequantize)). `out`
/// holds `ids.len() × dim` values.
///
/// # Errors
/// [`EmbeddingError::SizeOverflow`], a length error for `out`, or
/// [`EmbeddingError::IndexOutOfRange`]; then `out` is untouched.
pub fn table_gather_with<I: Index>(
    par: Parallelism,
    table: TableRef<'_>,
    ids: &[I],
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    in_pool(check_splits(par, ids), || {
        let dim = table.dim();
        check_len(Operand::Output, rows_len(ids.len(), dim)?, out.len())?;
        let ids = ValidIds::new_with(par, ids, table.rows())?;
        lookup_checked(par, &table, ids.by_row(), out);
        Ok(())
    })
}

/// The lookup of [`table_gather_with`] after its checks. Not generic ([`ByRow`](crate::index::ByRow)): compiled here, once.
fn lookup_checked(par: Parallelism, table: &TableRef<'_>, ids: AnyValidIds<'_>, out: &mut [f32]) {
    if let Data::F32(values) = table.data() {
        gather_valid(par, values, table.dim(), ids, out);
        return;
    }
    each_row_type!(ids, |ids| dispatch(table, Lookup { par, ids, out }))
}

/// The lookup of a decoded format, as an operation over any [`RowFormat`].
struct Lookup<'a, 'i, I: RowId> {
    par: Parallelism,
    ids: ValidIds<'i, I>,
    out: &'a mut [f32],
}

impl<I: RowId> OnRows for Lookup<'_, '_, I> {
    type Output = ();

    fn on<T: RowFormat>(self, table: T) {
        let Lookup { par, ids, out } = self;
        let dim = table.dim();
        if dim == 0 || ids.is_empty() {
            return;
        }
        let isa = Isa::detect();
        let task = |first: usize, out: &mut [f32]| {
            let ids = ids.slice(first..first + out.len() / dim);
            run_rows::<I, _>(isa, LookupTask { table, ids, out });
        };
        for_each_row_block(par, out, dim, dim * 4, task);
    }
}

/// One task of the lookup: `out` holds the rows of `ids`.
struct LookupTask<'a, 'i, I: RowId, T> {
    table: T,
    ids: ValidIds<'i, I>,
    out: &'a mut [f32],
}

impl<I: RowId, T: RowFormat> Body for LookupTask<'_, '_, I, T> {
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        let LookupTask { table, ids, out } = self;
        let dim = table.dim();
        // No hints for a table that sits in the caches (see tuning.rs).
        let ahead = if table.bytes() < PREFETCH_MIN_TABLE_BYTES {
            0
        } else {
            prefetch_ahead(table.row_bytes().div_ceil(4))
        };
        for i in 0..ahead.min(ids.len()) {
            table.prefetch_row(table.row(ids.row(i)));
        }
        for (i, dst) in out.chunks_exact_mut(dim).enumerate() {
            if ahead > 0 && i + ahead < ids.len() {
                table.prefetch_row(table.row(ids.row(i + ahead)));
            }
            let mut row = DecodeRow {
                table,
                row: table.row(ids.row(i)),
                dst,
            };
            each_block::<V, _>(dim, V::REGISTERS, &mut row);
        }
    }
}

/// One row of the lookup: each column block decoded and written.
struct DecodeRow<'a, T> {
    table: T,
    row: RowSpan,
    dst: &'a mut [f32],
}

impl<T: RowFormat> BlockBody for DecodeRow<'_, T> {
    const WIDEST: Widest = Widest::Registers;

    #[inline(always)]
    fn block<V: Lanes, const N: usize>(&mut self, cols: Cols<N>) -> usize {
        let affine = Affine::<V>::of(self.table.affine::<V>(self.row));
        if cols.is_whole() {
            let out = &mut self.dst[cols.start..cols.start + N * V::WIDTH];
            self.table
                .decode(self.row, cols, &mut Store { out, affine });
        } else {
            let mut buf = [0.0f32; MAX_LANES];
            let mut sink = Store {
                out: &mut buf,
                affine,
            };
            self.table.decode(self.row, cols, &mut sink);
            let dst = &mut self.dst[cols.start..cols.start + cols.width];
            dst.copy_from_slice(&buf[..cols.width]);
        }
        1
    }
}

/// Vector `j`'s values to `out`'s `j`-th `V::WIDTH` values.
struct Store<'a, V> {
    out: &'a mut [f32],
    affine: Option<Affine<V>>,
}

impl<V: Lanes> Sink<V> for Store<'_, V> {
    #[inline(always)]
    fn take(&mut self, j: usize, lanes: V) {
        value(lanes, self.affine).store(&mut self.out[j * V::WIDTH..]);
    }

    #[inline(always)]
    fn take_pair(&mut self, j: usize, even: V, odd: V) {
        let (first, second) = V::interleave(even, odd);
        self.take(j, first);
        self.take(j + 1, second);
    }
}

/// A half-precision value type: what [`gather_half`] copies.
pub trait Half: Copy + Send + Sync + private::Sealed {}

impl Half for half::f16 {}
impl Half for half::bf16 {}

mod private {
    /// Only `f16` and `bf16` are [`Half`](super::Half).
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// `out[i, :] = table[ids[i], :]` for a half table, the rows copied as they
/// are (no conversion): [`gather_half_with`] with [`Parallelism::Auto`].
///
/// # Errors
/// As [`gather`](crate::gather).
pub fn gather_half<H: Half, I: Index>(
    table: &[H],
    dim: usize,
    ids: &[I],
    out: &mut [H],
) -> Result<(), EmbeddingError> {
    gather_half_with(Parallelism::Auto, table, dim, ids, out)
}

/// [`gather_half`] with an explicit [`Parallelism`].
///
/// # Errors
/// As [`gather`](crate::gather); then `out` is untouched.
pub fn gather_half_with<H: Half, I: Index>(
    par: Parallelism,
    table: &[H],
    dim: usize,
    ids: &[I],
    out: &mut [H],
) -> Result<(), EmbeddingError> {
    let rows = table_rows(table.len(), dim, Operand::Table)?;
    check_len(Operand::Output, rows_len(ids.len(), dim)?, out.len())?;
    let ids = ValidIds::new_with(par, ids, rows)?;
    if dim == 0 || ids.is_empty() {
        return Ok(());
    }
    let row_bytes = dim * 2;
    let copy = |first: usize, out: &mut [H]| {
        let ids = ids.slice(first..first + out.len() / dim);
        let ahead = prefetch_ahead(dim.div_ceil(2));
        let base = table.as_ptr().cast::<u8>();
        for (i, dst) in out.chunks_exact_mut(dim).enumerate() {
            if i + ahead < ids.len() {
                let at = ids.row(i + ahead) * row_bytes;
                prefetch::span::<L2>(base, at, at + row_bytes);
            }
            let r = ids.row(i);
            dst.copy_from_slice(&table[r * dim..(r + 1) * dim]);
        }
    };
    for_each_row_block(par, out, dim, row_bytes, copy);
    Ok(())
}
