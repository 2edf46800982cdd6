//! Whole-row operations on `f32` rows, over any [`Lanes`]: the vector body
//! `V::WIDTH` lanes at a time, then a scalar tail of `len % V::WIDTH`
//! values.
//!
//! Every value gets one IEEE operation (`a * s` or `a + b`), or two, each
//! rounded (`a * s + b`, never a fused multiply-add), so the result is the
//! same bits whatever the lane type and whether the value went through the
//! vector body or the scalar tail. That is what lets the kernels promise
//! bitwise equality with the reference and across thread counts.
//!
//! The rows are split with `chunks_exact(V::WIDTH)`, a constant once the
//! body is compiled for its lane type, so the body has no bounds checks and
//! sees whole vectors' worth of values, which [`Lanes::load`] turns into
//! vectors for free.

use super::Lanes;

/// The values of a row of `len` that fill whole vectors of `V`.
#[inline(always)]
fn whole<V: Lanes>(len: usize) -> usize {
    len - len % V::WIDTH
}

/// `dst = src`, a vector at a time from the rows' starts, then a scalar
/// tail. The two rows must have the same length.
#[inline(always)]
pub(crate) fn copy_plain<V: Lanes>(dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    let (d_body, d_tail) = dst.split_at_mut(whole::<V>(dst.len()));
    let (s_body, s_tail) = src.split_at(whole::<V>(src.len()));
    for (d, s) in d_body
        .chunks_exact_mut(V::WIDTH)
        .zip(s_body.chunks_exact(V::WIDTH))
    {
        V::load(s).store(d);
    }
    for (d, s) in d_tail.iter_mut().zip(s_tail) {
        *d = *s;
    }
}

/// `dst = src * scale`. The two rows must have the same length.
#[inline(always)]
pub(crate) fn scale<V: Lanes>(dst: &mut [f32], src: &[f32], scale: f32) {
    debug_assert_eq!(dst.len(), src.len());
    let s = V::splat(scale);
    let (d_body, d_tail) = dst.split_at_mut(whole::<V>(dst.len()));
    let (s_body, s_tail) = src.split_at(whole::<V>(src.len()));
    for (d, x) in d_body
        .chunks_exact_mut(V::WIDTH)
        .zip(s_body.chunks_exact(V::WIDTH))
    {
        V::load(x).mul(s).store(d);
    }
    for (d, x) in d_tail.iter_mut().zip(s_tail) {
        *d = *x * scale;
    }
}

/// `dst += src`. The two rows must have the same length.
#[inline(always)]
pub(crate) fn add<V: Lanes>(dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    let (d_body, d_tail) = dst.split_at_mut(whole::<V>(dst.len()));
    let (s_body, s_tail) = src.split_at(whole::<V>(src.len()));
    for (d, x) in d_body
        .chunks_exact_mut(V::WIDTH)
        .zip(s_body.chunks_exact(V::WIDTH))
    {
        V::load(d).add(V::load(x)).store(d);
    }
    for (d, x) in d_tail.iter_mut().zip(s_tail) {
        *d += *x;
    }
}

/// `dst += src * scale`: the product is rounded before it is added (no fused
/// multiply-add), so each value has the bits of scaling `src` first and then
/// [`add`]ing it. The two rows must have the same length.
#[inline(always)]
pub(crate) fn add_scaled<V: Lanes>(dst: &mut [f32], src: &[f32], scale: f32) {
    debug_assert_eq!(dst.len(), src.len());
    let s = V::splat(scale);
    let (d_body, d_tail) = dst.split_at_mut(whole::<V>(dst.len()));
    let (s_body, s_tail) = src.split_at(whole::<V>(src.len()));
    for (d, x) in d_body
        .chunks_exact_mut(V::WIDTH)
        .zip(s_body.chunks_exact(V::WIDTH))
    {
        V::load(d).add(V::load(x).mul(s)).store(d);
    }
    for (d, x) in d_tail.iter_mut().zip(s_tail) {
        *d += *x * scale;
    }
}

/// `dst = a * scale + b`, or `dst = a + b` without a scale: a
/// multiplication, rounded, then an addition, rounded (never one fused
/// multiply-add), so each value has the bits of [`scale`] followed by
/// [`add`]. The three rows must have the same length.
#[inline(always)]
pub(crate) fn scale_add_rows<V: Lanes>(dst: &mut [f32], a: &[f32], scale: Option<f32>, b: &[f32]) {
    debug_assert_eq!(dst.len(), a.len());
    debug_assert_eq!(dst.len(), b.len());
    let (d_body, d_tail) = dst.split_at_mut(whole::<V>(dst.len()));
    let (a_body, a_tail) = a.split_at(whole::<V>(a.len()));
    let (b_body, b_tail) = b.split_at(whole::<V>(b.len()));
    let body = d_body
        .chunks_exact_mut(V::WIDTH)
        .zip(a_body.chunks_exact(V::WIDTH))
        .zip(b_body.chunks_exact(V::WIDTH));
    let tail = d_tail.iter_mut().zip(a_tail).zip(b_tail);
    match scale {
        Some(scale) => {
            let s = V::splat(scale);
            for ((d, x), y) in body {
                V::load(x).mul(s).add(V::load(y)).store(d);
            }
            for ((d, x), y) in tail {
                *d = *x * scale + *y;
            }
        }
        None => {
            for ((d, x), y) in body {
                V::load(x).add(V::load(y)).store(d);
            }
            for ((d, x), y) in tail {
                *d = *x + *y;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Body, Isa, MAX_LANES};
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every operation on rows `a` and `b`, in the order the test checks.
    struct All<'a>(&'a [f32], &'a [f32]);

    impl Body for All<'_> {
        type Output = Vec<Vec<f32>>;
        fn run<V: Lanes>(self) -> Vec<Vec<f32>> {
            let (a, b) = (self.0, self.1);
            let mut out = vec![vec![f32::NAN; a.len()]; 3];
            copy_plain::<V>(&mut out[0], a);
            scale::<V>(&mut out[1], a, 1.7);
            scale_add_rows::<V>(&mut out[2], a, Some(1.7), b);
            let mut plain = vec![f32::NAN; a.len()];
            scale_add_rows::<V>(&mut plain, a, None, b);
            let mut acc = b.to_vec();
            add::<V>(&mut acc, a);
            let mut acc_scaled = b.to_vec();
            add_scaled::<V>(&mut acc_scaled, a, 1.7);
            out.extend([plain, acc, acc_scaled]);
            out
        }
    }

    /// A copy of `src` into `dst` ([`copy_plain`]).
    struct CopyInto<'a>(&'a mut [f32], &'a [f32]);

    impl Body for CopyInto<'_> {
        type Output = ();
        fn run<V: Lanes>(self) {
            copy_plain::<V>(self.0, self.1);
        }
    }

    /// Rows copied into every offset within a line, from two offsets, of
    /// lengths around a line and a few lines: each gets `src`'s bits, and
    /// nothing around it is written.
    #[test]
    fn copies_write_the_row_alone_at_every_offset_on_every_isa() {
        for len in [
            0, 1, 15, 16, 17, 100, 127, 128, 129, 143, 144, 145, 300, 768,
        ] {
            let src: Vec<f32> = (0..len + 16).map(|i| i as f32 * 0.25 - 7.0).collect();
            for from in [0, 5] {
                let src = &src[from..from + len];
                for at in 0..=16 {
                    for isa in Isa::all() {
                        // Seventeen offsets of one `f32` cover every place in a
                        // line a row can start, wherever the `Vec` starts.
                        let mut buf = vec![f32::NAN; len + 32];
                        isa.run(CopyInto(&mut buf[at..at + len], src));
                        let what = format!("{isa:?}, len {len}, from {from}, at {at}");
                        assert_eq!(bits(&buf[at..at + len]), bits(src), "{what}");
                        assert!(buf[..at].iter().all(|x| x.is_nan()), "{what}: before");
                        assert!(buf[at + len..].iter().all(|x| x.is_nan()), "{what}: after");
                    }
                }
            }
        }
    }

    #[test]
    fn every_tail_length_matches_scalar_arithmetic_on_every_isa() {
        for len in 0..=2 * MAX_LANES + 1 {
            let a: Vec<f32> = (0..len).map(|i| i as f32 * 0.37 - 3.0).collect();
            let b: Vec<f32> = (0..len).map(|i| 1.0 / (i as f32 + 0.5)).collect();
            let scaled: Vec<f32> = a.iter().map(|x| x * 1.7).collect();
            let want = [
                a.clone(),
                scaled.clone(),
                scaled.iter().zip(&b).map(|(x, y)| x + y).collect(),
                a.iter().zip(&b).map(|(x, y)| x + y).collect(),
                b.iter().zip(&a).map(|(x, y)| x + y).collect(),
                b.iter()
                    .zip(&scaled)
                    .map(|(x, y)| x + y)
                    .collect::<Vec<f32>>(),
            ];
            for isa in Isa::all() {
                let got = isa.run(All(&a, &b));
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(bits(g), bits(w), "{isa:?}, operation {k}, len {len}");
                }
            }
        }
    }
}
