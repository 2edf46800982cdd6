//! The grouping: every kept position of a batch sorted by row, so that each
//! touched row is visited once (trick 1 of the folder's notes).
//!
//! A stable LSD radix sort, [`RADIX_BITS`] of the row per pass (two passes
//! for a million rows), keeps each row's positions in order. Where rows and
//! positions fit 32 bits each, one packed key per position
//! (`row << 32 | position`) moves one array per pass instead of two. The
//! vectors come from (and go back to) the thread's spare ones
//! (`kernels/spare.rs`), so a loop of calls does not fault in fresh memory.

use super::Source;
use crate::buffer::{copied, with_capacity, zeroed};
use crate::error::EmbeddingError;
use crate::index::{RowId, ValidIds};
use crate::kernels::spare;
use crate::simd::prefetch::{self, L1};
use crate::sparse_grad::SparseGrad;
use core::ops::Range;

use crate::kernels::tuning::RADIX_BITS;

/// Buckets per pass.
const RADIX: usize = 1 << RADIX_BITS;

/// The positions of a batch grouped by row, rows ascending, each row's
/// positions ascending.
#[derive(Clone, Debug, Default)]
pub(crate) struct Groups {
    /// The distinct rows, ascending.
    pub(crate) rows: Vec<usize>,
    /// `starts[g]..starts[g + 1]` indexes `positions` for group `g`.
    pub(crate) starts: Vec<usize>,
    /// Every kept position, grouped by row.
    pub(crate) positions: Vec<usize>,
}

impl Groups {
    /// Groups `ids` by row, leaving out every position whose row is `skip`
    /// (the padding row).
    ///
    /// The workspace (a few `usize`s per id) is allocated fallibly: a batch
    /// too large for it is [`EmbeddingError::AllocationFailed`].
    pub(crate) fn new<I: RowId>(
        ids: ValidIds<'_, I>,
        skip: Option<usize>,
    ) -> Result<Groups, EmbeddingError> {
        Groups::new_kept(ids, |_, r| Some(r) != skip)
    }

    /// Groups the positions `p` (with row `r`) for which `keep(p, r)`.
    pub(crate) fn new_kept<I: RowId>(
        ids: ValidIds<'_, I>,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Result<Groups, EmbeddingError> {
        let bits = usize::BITS - ids.num_embeddings().saturating_sub(1).leading_zeros();
        #[cfg(target_pointer_width = "64")]
        if bits <= 32 && u32::try_from(ids.len()).is_ok() {
            return Groups::new_packed(ids, keep, bits);
        }
        Groups::new_wide(ids, keep, bits)
    }

    /// [`Groups::new_kept`] for any row and position, `bits` the width of
    /// the largest row.
    fn new_wide<I: RowId>(
        ids: ValidIds<'_, I>,
        keep: impl Fn(usize, usize) -> bool,
        bits: u32,
    ) -> Result<Groups, EmbeddingError> {
        // Trick 1: a stable LSD radix sort of the kept positions by row,
        // RADIX_BITS of the row per pass. The positions go in ascending, and
        // a stable sort keeps them so within each row.
        let mut rows = with_capacity(ids.len(), "workspace")?;
        let mut positions = with_capacity(ids.len(), "workspace")?;
        for (p, r) in ids.rows().enumerate() {
            if keep(p, r) {
                rows.push(r);
                positions.push(p);
            }
        }
        let mut rows_to = zeroed(rows.len(), "workspace")?;
        let mut positions_to = zeroed(rows.len(), "workspace")?;
        let mut shift = 0;
        while shift < bits {
            let digit = |r: usize| (r >> shift) & (RADIX - 1);
            let mut starts = [0usize; RADIX];
            for &r in &rows {
                starts[digit(r)] += 1;
            }
            if starts.contains(&rows.len()) {
                // Every row has this digit: the pass would change nothing.
                shift += RADIX_BITS;
                continue;
            }
            let mut sum = 0;
            for s in starts.iter_mut() {
                (*s, sum) = (sum, sum + *s);
            }
            for (&r, &p) in rows.iter().zip(&positions) {
                let at = &mut starts[digit(r)];
                rows_to[*at] = r;
                positions_to[*at] = p;
                *at += 1;
            }
            core::mem::swap(&mut rows, &mut rows_to);
            core::mem::swap(&mut positions, &mut positions_to);
            shift += RADIX_BITS;
        }
        let mut groups = Groups {
            positions,
            rows: with_capacity(rows.len(), "workspace")?,
            starts: with_capacity(rows.len() + 1, "workspace")?,
        };
        groups.find_runs(rows.into_iter());
        Ok(groups)
    }

    /// [`Groups::new_kept`] when rows and positions fit 32 bits each (and
    /// `usize` has 64): one key per position, `row << 32 | position`, so
    /// each pass moves one array instead of two, and one read of the keys
    /// counts the digits of every pass. The vectors come from (and go back
    /// to) the thread's [`spare`] ones.
    #[cfg(target_pointer_width = "64")]
    fn new_packed<I: RowId>(
        ids: ValidIds<'_, I>,
        keep: impl Fn(usize, usize) -> bool,
        bits: u32,
    ) -> Result<Groups, EmbeddingError> {
        const MAX_PASSES: usize = 32usize.div_ceil(RADIX_BITS as usize);
        let passes = bits.div_ceil(RADIX_BITS) as usize;
        let digit =
            |key: usize, pass: usize| (key >> (32 + pass * RADIX_BITS as usize)) & (RADIX - 1);
        let mut keys = spare::take(ids.len())?;
        keys.extend(
            ids.rows()
                .enumerate()
                .filter(|&(p, r)| keep(p, r))
                .map(|(p, r)| r << 32 | p),
        );
        let mut counts = [[0usize; RADIX]; MAX_PASSES];
        for &key in &keys {
            for (pass, count) in counts[..passes].iter_mut().enumerate() {
                count[digit(key, pass)] += 1;
            }
        }
        let mut to = spare::take(keys.len())?;
        to.resize(keys.len(), 0);
        for (pass, count) in counts[..passes].iter_mut().enumerate() {
            if count.contains(&keys.len()) {
                continue; // every key has this digit: nothing would move
            }
            let mut sum = 0;
            for c in count.iter_mut() {
                (*c, sum) = (sum, sum + *c);
            }
            for &key in &keys {
                let at = &mut count[digit(key, pass)];
                to[*at] = key;
                *at += 1;
            }
            core::mem::swap(&mut keys, &mut to);
        }
        spare::give(to);
        let mut groups = Groups {
            rows: spare::take(keys.len())?,
            starts: spare::take(keys.len() + 1)?,
            positions: keys,
        };
        groups.find_runs_packed();
        Ok(groups)
    }

    /// The packed keys of [`Groups::new_packed`], sorted, in `positions`:
    /// fills `rows` and `starts` and leaves the positions alone.
    #[cfg(target_pointer_width = "64")]
    fn find_runs_packed(&mut self) {
        for (i, key) in self.positions.iter_mut().enumerate() {
            let r = *key >> 32;
            if self.rows.last() != Some(&r) {
                self.rows.push(r);
                self.starts.push(i);
            }
            *key &= u32::MAX as usize;
        }
        self.starts.push(self.positions.len());
    }

    /// Fills `rows` and `starts` from the row of every sorted position.
    fn find_runs(&mut self, sorted_rows: impl Iterator<Item = usize>) {
        let mut len = 0;
        for (i, r) in sorted_rows.enumerate() {
            if self.rows.last() != Some(&r) {
                self.rows.push(r);
                self.starts.push(i);
            }
            len = i + 1;
        }
        self.starts.push(len);
    }

    /// The rows of a coalesced gradient as groups of one position each
    /// (position `k` is values row `k`), so the fused updates can apply it.
    pub(super) fn of_sparse(grad: &SparseGrad) -> Result<Groups, EmbeddingError> {
        let k = grad.indices().len();
        let mut starts = with_capacity(k + 1, "workspace")?;
        starts.extend(0..=k);
        let mut positions = with_capacity(k, "workspace")?;
        positions.extend(0..k);
        Ok(Groups {
            rows: copied(grad.indices(), "workspace")?,
            starts,
            positions,
        })
    }

    /// How many distinct rows.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Asks the cache for the gradient rows (columns `cols`) of every
    /// position up to `ahead` positions past the end of group `g`, in the
    /// grouped order, continuing from `*cursor` (trick 6). Call it once per
    /// group, with the cursor starting at the task's first position.
    #[inline(always)]
    pub(crate) fn prefetch_through<S: Source>(
        &self,
        g: usize,
        ahead: usize,
        source: &S,
        cols: &Range<usize>,
        cursor: &mut usize,
    ) {
        let end = (self.starts[g + 1] + ahead).min(self.positions.len());
        while *cursor < end {
            prefetch::row::<L1>(source.row(self.positions[*cursor], cols.clone()));
            *cursor += 1;
        }
    }

    /// The positions of group `g`, ascending.
    #[inline]
    pub(crate) fn positions(&self, g: usize) -> &[usize] {
        &self.positions[self.starts[g]..self.starts[g + 1]]
    }
}

impl Drop for Groups {
    /// Hands the vectors to the thread's [`spare`] ones for the next
    /// grouping.
    fn drop(&mut self) {
        spare::give(core::mem::take(&mut self.rows));
        spare::give(core::mem::take(&mut self.starts));
        spare::give(core::mem::take(&mut self.positions));
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A deterministic stream of numbers for the cases below.
    pub(crate) fn mix(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    /// `n` ids of `rows` rows, a third of them one hot row (drawn too).
    pub(crate) fn ids_with_a_hot_row(seed: &mut u64, rows: usize, n: usize) -> Vec<usize> {
        let hot = mix(seed) as usize % rows;
        (0..n)
            .map(|_| {
                if mix(seed).is_multiple_of(3) {
                    hot
                } else {
                    mix(seed) as usize % rows
                }
            })
            .collect()
    }

    pub(crate) fn groups_of(rows: usize, ids: &[usize]) -> Groups {
        Groups::new(ValidIds::new(ids, rows).unwrap(), None).unwrap()
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn the_packed_sort_groups_as_the_wide_one_does() {
        let mut seed = 0x9e37;
        for case in 0..200 {
            let rows = 1 + mix(&mut seed) as usize % (1 << (case % 24));
            let n = mix(&mut seed) as usize % 3000;
            let ids: Vec<usize> = (0..n).map(|_| mix(&mut seed) as usize % rows).collect();
            let ids = ValidIds::new(&ids, rows).unwrap();
            let skip = mix(&mut seed) as usize % rows;
            let keep = |p: usize, r: usize| r != skip && p % 7 != 3;
            let bits = usize::BITS - (rows - 1).leading_zeros();
            let packed = Groups::new_packed(ids, keep, bits).unwrap();
            let wide = Groups::new_wide(ids, keep, bits).unwrap();
            assert_eq!(packed.rows, wide.rows, "rows {rows} n {n}");
            assert_eq!(packed.starts, wide.starts, "rows {rows} n {n}");
            assert_eq!(packed.positions, wide.positions, "rows {rows} n {n}");
        }
    }

    #[test]
    fn groups_sort_rows_and_keep_positions_in_order() {
        let g = groups_of(10, &[7, 2, 7, 0, 2, 7]);
        assert_eq!(g.rows, [0, 2, 7]);
        assert_eq!(g.positions(0), [3]);
        assert_eq!(g.positions(1), [1, 4]);
        assert_eq!(g.positions(2), [0, 2, 5]);
        let skipped = Groups::new(ValidIds::new(&[7usize, 2, 7], 10).unwrap(), Some(7)).unwrap();
        assert_eq!(skipped.rows, [2]);
        assert_eq!(skipped.positions(0), [1]);
    }
}
