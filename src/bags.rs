//! Bag boundaries: [`Bags`], PyTorch's `offsets` checked once.

use crate::buffer;
use crate::error::EmbeddingError;
use crate::index::Index;
use crate::shape::rows_len;
use core::ops::Range;

/// Checked bag boundaries over `num_ids` ids: bag `b` holds positions
/// `starts[b]..starts[b + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bags {
    starts: Vec<usize>,
    num_ids: usize,
}

impl Bags {
    /// Bags from PyTorch's `offsets` (the first position of each bag) over
    /// `num_ids` ids. With `include_last_offset`, the last offset ends the
    /// last bag (so there are `offsets.len() - 1` bags, and ids past it
    /// belong to none); without, the last bag runs to the end of the ids.
    ///
    /// # Errors
    /// [`EmbeddingError::OffsetsStart`] unless the first offset is 0,
    /// [`EmbeddingError::OffsetOutOfRange`] for an offset that is negative
    /// or past `num_ids`, [`EmbeddingError::OffsetsDecrease`] for one below
    /// the offset before it, [`EmbeddingError::NoOffsets`] for an empty
    /// `offsets` with `include_last_offset`.
    pub fn from_offsets<O: Index>(
        offsets: &[O],
        num_ids: usize,
        include_last_offset: bool,
    ) -> Result<Bags, EmbeddingError> {
        if include_last_offset && offsets.is_empty() {
            return Err(EmbeddingError::NoOffsets);
        }
        let mut starts = Vec::with_capacity(offsets.len() + 1);
        for (position, &o) in offsets.iter().enumerate() {
            let value = o.to_i128();
            if value < 0 || value > num_ids as i128 {
                return Err(EmbeddingError::OffsetOutOfRange {
                    position,
                    value,
                    num_ids,
                });
            }
            let value = value as usize;
            if position == 0 && value != 0 {
                return Err(EmbeddingError::OffsetsStart {
                    first: value as i128,
                });
            }
            if let Some(&previous) = starts.last()
                && value < previous
            {
                return Err(EmbeddingError::OffsetsDecrease {
                    position,
                    value: value as i128,
                    previous: previous as i128,
                });
            }
            starts.push(value);
        }
        if !include_last_offset {
            starts.push(num_ids);
        }
        if starts.len() == 1 && !include_last_offset {
            // No offsets: no bags (the sentinel alone).
            starts.clear();
            starts.push(0);
        }
        Ok(Bags { starts, num_ids })
    }

    /// `num_bags` bags of `bag_size` ids each, in order: a 2-D input of
    /// shape `[num_bags, bag_size]`.
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if the product overflows,
    /// [`EmbeddingError::AllocationFailed`] if the `num_bags + 1` bag starts
    /// cannot be allocated.
    pub fn fixed(num_bags: usize, bag_size: usize) -> Result<Bags, EmbeddingError> {
        let num_ids = rows_len(num_bags, bag_size)?;
        let count = num_bags
            .checked_add(1)
            .ok_or(EmbeddingError::AllocationFailed {
                what: "bag starts",
                bytes: (num_bags as u128 + 1) * core::mem::size_of::<usize>() as u128,
            })?;
        let mut starts = buffer::with_capacity(count, "bag starts")?;
        starts.extend((0..count).map(|b| b * bag_size));
        Ok(Bags { starts, num_ids })
    }

    /// How many bags.
    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Whether there are no bags.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The positions of bag `b`, or `None` if there is no bag `b`
    /// (`b >= len()`), as [`slice::get`] answers.
    pub fn bag(&self, b: usize) -> Option<Range<usize>> {
        let start = *self.starts.get(b)?;
        let end = *self.starts.get(b.checked_add(1)?)?;
        Some(start..end)
    }

    /// The positions of every bag, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Range<usize>> + '_ {
        self.starts.windows(2).map(|w| w[0]..w[1])
    }

    /// The positions of bag `b`, for the crate's loops over `0..len()`.
    #[inline]
    pub(crate) fn range(&self, b: usize) -> Range<usize> {
        debug_assert!(b < self.len(), "bag {b} of {}", self.len());
        self.starts[b]..self.starts[b + 1]
    }

    /// The number of ids the bags were made for.
    pub fn num_ids(&self) -> usize {
        self.num_ids
    }

    /// Every bag's first position, then the end of the last bag.
    pub(crate) fn starts(&self) -> &[usize] {
        &self.starts
    }
}
