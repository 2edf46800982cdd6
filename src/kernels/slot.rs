//! The output slots a kernel writes once: an `f32` of a caller's buffer or
//! a `MaybeUninit<f32>` of fresh memory. Below both the column blocks and
//! the row formats, which write through it.

use core::mem::MaybeUninit;

/// A value of an output that a kernel writes once: an `f32` of a caller's
/// buffer, or a `MaybeUninit<f32>` of fresh memory, which is then written
/// once instead of zeroed first and written again. The bag forward writes
/// a caller's buffer as `MaybeUninit<f32>`s too (`forward_into`), so that
/// its loops are compiled for one slot type; the methods write only
/// initialised values, which is what makes that view sound.
pub(crate) trait Slot: Send + Sized {
    /// `dst[i] = src[i]` for every `i`; the lengths are equal.
    fn put(dst: &mut [Self], src: &[f32]);
    /// `dst[i] = 0.0` for every `i`.
    fn zero(dst: &mut [Self]);
}

impl Slot for f32 {
    #[inline(always)]
    fn put(dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }

    #[inline(always)]
    fn zero(dst: &mut [f32]) {
        dst.fill(0.0);
    }
}

impl Slot for MaybeUninit<f32> {
    /// As arrays of 16 values, then of 8, then value by value: each array
    /// is one move of a known size, where a loop of `MaybeUninit::write`s
    /// of unknown length compiles to a set-up and a tail per row
    /// (docs/design.md, "Memory: huge pages and aligned tables"). Every
    /// value of `dst` is written once when `src` is as long.
    #[inline(always)]
    fn put(dst: &mut [MaybeUninit<f32>], src: &[f32]) {
        debug_assert_eq!(dst.len(), src.len());
        let (dst, src) = put_arrays::<16>(dst, src);
        let (dst, src) = put_arrays::<8>(dst, src);
        for (d, s) in dst.iter_mut().zip(src) {
            d.write(*s);
        }
    }

    #[inline(always)]
    fn zero(dst: &mut [MaybeUninit<f32>]) {
        dst.fill(MaybeUninit::new(0.0));
    }
}

/// `dst = src` for the leading whole arrays of `N` values of both, which
/// are as long; returns the rest of each (fewer than `N` values).
#[inline(always)]
fn put_arrays<'d, 's, const N: usize>(
    dst: &'d mut [MaybeUninit<f32>],
    src: &'s [f32],
) -> (&'d mut [MaybeUninit<f32>], &'s [f32]) {
    let (dst_arrays, dst_rest) = dst.as_chunks_mut::<N>();
    let (src_arrays, src_rest) = src.as_chunks::<N>();
    for (d, s) in dst_arrays.iter_mut().zip(src_arrays) {
        *d = s.map(MaybeUninit::new);
    }
    (dst_rest, src_rest)
}
