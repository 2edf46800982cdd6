//! Ids bucketed by the rank that holds their rows, for the sharded
//! collection (`embedding_kernels.torch.distributed`).

use crate::convert::{Ids, error, invalid, readonly, slice, with_ids};
use embedding_kernels::{EmbeddingError, Index};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;

/// The ids of bags (`lengths[b]` ids each, in order) bucketed by owner for
/// a table of `num_embeddings` rows split row-wise over `world` ranks
/// (rank `r` holds the block `[r * k, (r + 1) * k)`, `k = ceil(rows /
/// world)`): `(counts, local_ids, positions)`, `counts` int64 `[world,
/// bags]` (bag `b`'s ids owned by rank `r`), `local_ids` int64, each rank's
/// ids in bag order, a bag's in position order (stable), as row numbers
/// within the rank's block, and `positions` int64, where each came from
/// (for the per-sample weights). One pass to count, one to place, with the
/// GIL released.
///
/// Raises `IndexError` for an id out of range (naming its position and
/// value), `ValueError` if the lengths do not add up to the ids' count or
/// `world` is 0.
#[pyfunction]
#[pyo3(signature = (ids, lengths, num_embeddings, world))]
#[allow(clippy::type_complexity)]
pub(crate) fn bucket_rows<'py>(
    py: Python<'py>,
    ids: &Bound<'py, PyAny>,
    lengths: &Bound<'py, PyAny>,
    num_embeddings: usize,
    world: usize,
) -> PyResult<(
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
)> {
    let ids = Ids::extract(ids, "ids")?;
    let lengths = readonly::<i64>(lengths, "lengths", "int64")?;
    let lengths = slice(&lengths);
    if world == 0 {
        return Err(invalid("world must be at least 1".to_string()));
    }
    let total = lengths.iter().try_fold(0usize, |sum, &n| {
        usize::try_from(n).ok().and_then(|n| sum.checked_add(n))
    });
    let count = with_ids!(ids.slice(), |s| s.len());
    if total != Some(count) {
        return Err(invalid(format!(
            "lengths must be >= 0 and add up to the {count} ids"
        )));
    }
    let block = num_embeddings.div_ceil(world).max(1);
    let bags = lengths.len();
    let id_slice = ids.slice();
    let (counts, local, positions) = py.detach(|| {
        with_ids!(id_slice, |s| bucket(
            s,
            lengths,
            num_embeddings,
            block,
            world
        ))
    })?;
    let counts = PyArray1::from_vec(py, counts).reshape([world, bags])?;
    Ok((
        counts,
        PyArray1::from_vec(py, local),
        PyArray1::from_vec(py, positions),
    ))
}

/// The buckets of [`bucket_rows`]: counts, local ids and their positions.
type Buckets = (Vec<i64>, Vec<i64>, Vec<i64>);

/// [`bucket_rows`] on a checked batch.
fn bucket<I: Index>(
    ids: &[I],
    lengths: &[i64],
    rows: usize,
    block: usize,
    world: usize,
) -> PyResult<Buckets> {
    let bags = lengths.len();
    // Each id's owner, checked, in one pass; the counts a (rank, bag).
    let mut owner = Vec::with_capacity(ids.len());
    let mut counts = vec![0i64; world * bags];
    let mut p = 0;
    for (b, &n) in lengths.iter().enumerate() {
        for _ in 0..n {
            let id = ids[p].to_i128();
            if id < 0 || id >= rows as i128 {
                return Err(error(EmbeddingError::IndexOutOfRange {
                    position: p,
                    index: id,
                    num_embeddings: rows,
                }));
            }
            let r = id as usize / block;
            owner.push(r as u32);
            counts[r * bags + b] += 1;
            p += 1;
        }
    }
    // Where each (rank, bag) run starts: ranks in order, bags in order.
    let mut next = Vec::with_capacity(counts.len());
    let mut at = 0i64;
    for &c in &counts {
        next.push(at);
        at += c;
    }
    let mut local = vec![0i64; ids.len()];
    let mut positions = vec![0i64; ids.len()];
    let mut p = 0;
    for (b, &n) in lengths.iter().enumerate() {
        for _ in 0..n {
            let r = owner[p] as usize;
            let slot = &mut next[r * bags + b];
            let at = *slot as usize;
            local[at] = (ids[p].to_i128() - (r * block) as i128) as i64;
            positions[at] = p as i64;
            *slot += 1;
            p += 1;
        }
    }
    Ok((counts, local, positions))
}
