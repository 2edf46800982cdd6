//! Cutting a scatter-add into tasks that own disjoint rows.
//!
//! ```text
//! counts[b]   = ids in bucket b = rows [b·w, (b+1)·w)    (w a power of two)
//! refine      hot buckets (more than a task's share) are counted row by row
//! plan        walk rows ascending, cut a new list every `share` positions;
//!             a single row holding more than `share` positions is a list of
//!             its own, later split into column blocks
//! partition   stable counting sort of the positions into their lists
//! ```
//!
//! 1. **Ownership.** Every list covers a contiguous, disjoint range of rows,
//!    so the gradient table splits into disjoint `&mut` chunks with
//!    `split_at_mut`, one per list, and no two tasks ever write the same row
//!    (or, for a split hot row, the same columns).
//! 2. **Order.** The partition is a stable counting sort, so each list holds
//!    its positions ascending: every row still receives its gradients in
//!    position order, the order of the sequential loop, and the sums have its
//!    bits whatever the thread count.
//! 3. **Streaming.** Within a list, positions ascend, so `grad_output` is read
//!    front to back (skipping rows other lists own); only the table rows are
//!    random, as in the sequential loop.
//! 4. **Cost.** Two or three passes over the ids and a bucket array of at most
//!    2^16 counters: nothing is sized by `num_embeddings`.

use crate::index::{Index, ValidIds};

/// At most this many coarse buckets (a 256 KiB or 512 KiB counter array).
const MAX_BUCKETS_LOG2: u32 = 16;

/// Marks a bucket in `bucket_list` that is resolved row by row.
const REFINED: u32 = 1 << 31;

/// A contiguous range of rows and the positions that touch them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct List {
    /// First row owned.
    pub lo: usize,
    /// One past the last row owned.
    pub hi: usize,
    /// Where its positions start in [`Partition::positions`].
    pub start: usize,
    /// One past where they end.
    pub end: usize,
}

/// The positions of a call partitioned into row-disjoint lists.
#[derive(Debug)]
pub(crate) struct Partition {
    /// Lists in ascending row order; together they cover every touched row.
    pub lists: Vec<List>,
    /// All positions, list by list, ascending within each list.
    pub positions: Vec<usize>,
}

impl Partition {
    /// Partitions `ids` into lists of about `share` positions each.
    pub(crate) fn new<I: Index>(ids: &ValidIds<'_, I>, share: usize) -> Partition {
        let rows = ids.num_embeddings();
        // Bucket width: a power of two, so a bucket is a shift away.
        let bits = usize::BITS - rows.saturating_sub(1).leading_zeros();
        let shift = bits.saturating_sub(MAX_BUCKETS_LOG2);
        let width = 1usize << shift;
        let buckets = rows.div_ceil(width);

        let mut counts = vec![0usize; buckets];
        for row in ids.rows() {
            counts[row >> shift] += 1;
        }

        // Buckets of several rows holding more than a share are counted
        // again row by row, so a hot id inside them is seen on its own.
        let mut bucket_list = vec![0u32; buckets];
        let mut refined: Vec<usize> = Vec::new();
        if width > 1 {
            for (b, &c) in counts.iter().enumerate() {
                if c > share {
                    bucket_list[b] = REFINED | refined.len() as u32;
                    refined.push(b);
                }
            }
        }
        let mut fine = vec![0usize; refined.len() * width];
        if !refined.is_empty() {
            for row in ids.rows() {
                let tag = bucket_list[row >> shift];
                if tag & REFINED != 0 {
                    fine[(tag & !REFINED) as usize * width + (row & (width - 1))] += 1;
                }
            }
        }
        let mut fine_list = vec![0u32; fine.len()];

        // Plan: cut lists at bucket (or, in refined buckets, row) borders.
        let mut lists: Vec<List> = Vec::new();
        let mut planner = Planner {
            lists: &mut lists,
            share,
            open: List {
                lo: 0,
                hi: 0,
                start: 0,
                end: 0,
            },
        };
        for b in 0..buckets {
            let lo = b << shift;
            let hi = ((b + 1) << shift).min(rows);
            let tag = bucket_list[b];
            if tag & REFINED == 0 {
                bucket_list[b] = planner.add(lo, hi, counts[b]);
            } else {
                let slot = (tag & !REFINED) as usize;
                for r in lo..hi {
                    fine_list[slot * width + (r - lo)] =
                        planner.add(r, r + 1, fine[slot * width + (r - lo)]);
                }
            }
        }
        planner.close();

        // Partition: a stable counting sort of positions into lists.
        let mut next: Vec<usize> = lists.iter().map(|l| l.start).collect();
        let mut positions = vec![0usize; ids.len()];
        for (p, row) in ids.rows().enumerate() {
            let tag = bucket_list[row >> shift];
            let list = if tag & REFINED == 0 {
                tag
            } else {
                fine_list[(tag & !REFINED) as usize * width + (row & (width - 1))]
            } as usize;
            positions[next[list]] = p;
            next[list] += 1;
        }
        Partition { lists, positions }
    }
}

/// Accumulates consecutive row ranges into lists of about `share` positions.
struct Planner<'a> {
    lists: &'a mut Vec<List>,
    share: usize,
    /// The list being filled, pushed when full or at the end.
    open: List,
}

impl Planner<'_> {
    /// Adds rows `lo..hi` holding `count` positions; returns their list's
    /// number.
    fn add(&mut self, lo: usize, hi: usize, count: usize) -> u32 {
        let filled = self.open.end - self.open.start;
        if filled > 0 && filled + count > self.share {
            // Full: close it and open a new one at `lo`.
            let end = self.open.end;
            self.lists.push(self.open);
            self.open = List {
                lo,
                hi: lo,
                start: end,
                end,
            };
        }
        self.open.hi = hi;
        self.open.end += count;
        self.lists.len() as u32
    }

    fn close(self) {
        self.lists.push(self.open);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(ids: &[usize], rows: usize, share: usize) {
        let valid = ValidIds::new(ids, rows).unwrap();
        let part = Partition::new(&valid, share);
        let mut seen = vec![false; ids.len()];
        let mut last_hi = 0;
        for list in &part.lists {
            assert!(list.lo >= last_hi && list.hi > list.lo, "{list:?}");
            last_hi = list.hi;
            let ps = &part.positions[list.start..list.end];
            assert!(
                ps.windows(2).all(|w| w[0] < w[1]),
                "positions not ascending"
            );
            for &p in ps {
                assert!(
                    (list.lo..list.hi).contains(&ids[p]),
                    "position {p} in the wrong list"
                );
                assert!(!std::mem::replace(&mut seen[p], true));
            }
            // A list is only over its share if it is a single row.
            if list.end - list.start > share {
                let distinct: std::collections::BTreeSet<_> = ps.iter().map(|&p| ids[p]).collect();
                assert_eq!(
                    distinct.len(),
                    1,
                    "{list:?} is over its share with several rows"
                );
            }
        }
        assert!(seen.iter().all(|&s| s), "a position is missing");
    }

    #[test]
    fn lists_are_disjoint_ordered_and_complete() {
        for rows in [1usize, 7, 1 << 16, (1 << 16) + 1, 1 << 20, 3_000_017] {
            let uniform: Vec<usize> = (0..5000usize).map(|i| (i * 2_654_435_761) % rows).collect();
            let hot: Vec<usize> = (0..5000usize)
                .map(|i| {
                    if i % 10 == 0 {
                        (i * 7919) % rows
                    } else {
                        rows / 2
                    }
                })
                .collect();
            for share in [1, 37, 5000] {
                check(&uniform, rows, share);
                check(&hot, rows, share);
            }
        }
    }
}
