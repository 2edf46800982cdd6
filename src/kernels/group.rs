//! Positions grouped by id: the compressed-sparse-row (CSR) view of
//! `one_hot(ids)ᵀ` that the parallel backward pass works from.
//!
//! ```text
//! keys[p] = ids[p] << 32 | p                       (one u64 per position)
//! LSD radix sort of keys on the id bits only       (stable: p stays in order)
//! walk the sorted keys: a new id opens a group
//! ```
//!
//! 1. **Cost.** Two passes per radix digit over `n` keys, with digits of at
//!    most [`DIGIT_BITS`] bits and as many digits as `num_embeddings - 1`
//!    has bits (two for a million rows). Nothing is sized by
//!    `num_embeddings`, so grouping 65 536 ids of a 10⁹-row table costs the
//!    same as of a 10⁶-row one, give or take a digit.
//! 2. **Order.** LSD radix sort is stable and the keys start in position
//!    order, so within a group the positions stay ascending. Summing a
//!    group's rows in that order reproduces the sequential loop to the bit.
//! 3. **Packing.** Id and position share one `u64` when both fit in 32 bits
//!    (any table below 4 G rows and call below 4 G ids), halving the bytes
//!    each pass moves. Anything larger falls back to the standard library's
//!    stable sort.

use crate::index::{Index, ValidIds};

/// The widest radix digit: 2^11 counters (8 KiB) stay in L1.
const DIGIT_BITS: u32 = 11;

/// Positions grouped by id, ids ascending, positions ascending within an id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdGroups {
    ids: Vec<usize>,
    offsets: Vec<usize>,
    positions: Vec<usize>,
}

impl IdGroups {
    /// Groups the positions of checked ids.
    pub fn new<I: Index>(ids: &ValidIds<'_, I>) -> IdGroups {
        let n = ids.len();
        let fits_u32 = |x: usize| u32::try_from(x).is_ok();
        if fits_u32(n) && fits_u32(ids.num_embeddings()) {
            Self::by_radix(ids)
        } else {
            let mut positions: Vec<usize> = (0..n).collect();
            positions.sort_by_key(|&p| ids.row(p));
            Self::from_sorted(positions.into_iter().map(|p| (ids.row(p), p)), n)
        }
    }

    fn by_radix<I: Index>(ids: &ValidIds<'_, I>) -> IdGroups {
        let n = ids.len();
        let mut keys: Vec<u64> = ids
            .rows()
            .enumerate()
            .map(|(p, row)| ((row as u64) << 32) | p as u64)
            .collect();
        let max_row = ids.num_embeddings().saturating_sub(1) as u64;
        let bits = 64 - max_row.leading_zeros();
        if bits > 0 && n > 1 {
            let digits = bits.div_ceil(DIGIT_BITS);
            let width = bits.div_ceil(digits);
            let mut spare = vec![0u64; n];
            let mut counts = vec![0usize; 1 << width];
            for digit in 0..digits {
                let shift = 32 + digit * width;
                let mask = (1u64 << width) - 1;
                let bucket = |k: u64| ((k >> shift) & mask) as usize;
                counts.fill(0);
                for &k in &keys {
                    counts[bucket(k)] += 1;
                }
                let mut next = 0;
                for c in counts.iter_mut() {
                    let here = *c;
                    *c = next;
                    next += here;
                }
                for &k in &keys {
                    let b = bucket(k);
                    spare[counts[b]] = k;
                    counts[b] += 1;
                }
                core::mem::swap(&mut keys, &mut spare);
            }
        }
        Self::from_sorted(
            keys.into_iter()
                .map(|k| ((k >> 32) as usize, (k & 0xffff_ffff) as usize)),
            n,
        )
    }

    /// Builds the groups from `(row, position)` pairs sorted by row, stable.
    fn from_sorted(pairs: impl Iterator<Item = (usize, usize)>, n: usize) -> IdGroups {
        let mut groups = IdGroups {
            ids: Vec::new(),
            offsets: vec![0],
            positions: Vec::with_capacity(n),
        };
        for (row, position) in pairs {
            if groups.ids.last() != Some(&row) {
                if !groups.ids.is_empty() {
                    groups.offsets.push(groups.positions.len());
                }
                groups.ids.push(row);
            }
            groups.positions.push(position);
        }
        if !groups.ids.is_empty() {
            groups.offsets.push(groups.positions.len());
        }
        groups
    }

    /// The number of distinct ids.
    #[inline]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no ids at all.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The distinct ids, ascending.
    #[inline]
    pub fn ids(&self) -> &[usize] {
        &self.ids
    }

    /// The positions of group `g` (the `g`-th distinct id), ascending.
    #[inline]
    pub fn positions(&self, g: usize) -> &[usize] {
        &self.positions[self.offsets[g]..self.offsets[g + 1]]
    }

    /// How many positions group `g` holds: how often its id occurs.
    #[inline]
    pub fn count(&self, g: usize) -> usize {
        self.offsets[g + 1] - self.offsets[g]
    }

    /// Every group as `(id, positions)`, ids ascending.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (usize, &[usize])> + '_ {
        (0..self.len()).map(move |g| (self.ids[g], self.positions(g)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(ids: &[usize]) -> Vec<(usize, Vec<usize>)> {
        let mut map = std::collections::BTreeMap::<usize, Vec<usize>>::new();
        for (p, &id) in ids.iter().enumerate() {
            map.entry(id).or_default().push(p);
        }
        map.into_iter().collect()
    }

    #[test]
    fn matches_a_naive_grouping_for_many_row_counts() {
        // Row counts on both sides of each digit boundary.
        for rows in [1usize, 2, 3, 2047, 2048, 2049, 5000, 1 << 22, (1 << 22) + 1] {
            let ids: Vec<usize> = (0..3000usize).map(|i| (i * 7919 + i / 3) % rows).collect();
            let valid = ValidIds::new(&ids, rows).unwrap();
            let groups = IdGroups::new(&valid);
            let got: Vec<(usize, Vec<usize>)> =
                groups.iter().map(|(id, ps)| (id, ps.to_vec())).collect();
            let want = naive(&ids);
            assert_eq!(got, want, "rows = {rows}");
        }
    }
}
