//! Row primitives: copy, scale and add one row of `f32`s, eight lanes at a
//! time with `wide::f32x8`, then a scalar tail of `len % 8` values.
//!
//! Every lane does exactly one IEEE operation per value (`a * s` or
//! `a + b`, never a fused multiply-add), so the result is the same bits
//! whatever width the vector unit has and whether the value went through the
//! vector body or the scalar tail. That is what lets the kernels promise
//! bitwise equality with the reference and across thread counts.
//!
//! [`store_streaming`] writes with non-temporal stores, for outputs much
//! larger than the caches.
//!
//! The slices are split with `as_chunks`, so the body has no bounds checks
//! and the compiler sees whole `[f32; 8]` blocks, which `bytemuck::cast`
//! turns into vectors for free (both are plain 32-byte values).

use wide::f32x8;

/// Lanes per vector.
pub(crate) const LANES: usize = 8;

#[inline(always)]
fn load(block: &[f32; LANES]) -> f32x8 {
    bytemuck::cast(*block)
}

#[inline(always)]
fn store(block: &mut [f32; LANES], v: f32x8) {
    *block = bytemuck::cast(v);
}

/// `dst = src`. The two rows must have the same length.
#[inline(always)]
pub(crate) fn copy(dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    let (d_body, d_tail) = dst.as_chunks_mut::<LANES>();
    let (s_body, s_tail) = src.as_chunks::<LANES>();
    for (d, s) in d_body.iter_mut().zip(s_body) {
        store(d, load(s));
    }
    for (d, s) in d_tail.iter_mut().zip(s_tail) {
        *d = *s;
    }
}

/// `dst = src * scale`. The two rows must have the same length.
#[inline(always)]
pub(crate) fn scale(dst: &mut [f32], src: &[f32], scale: f32) {
    debug_assert_eq!(dst.len(), src.len());
    let s = f32x8::splat(scale);
    let (d_body, d_tail) = dst.as_chunks_mut::<LANES>();
    let (s_body, s_tail) = src.as_chunks::<LANES>();
    for (d, x) in d_body.iter_mut().zip(s_body) {
        store(d, load(x) * s);
    }
    for (d, x) in d_tail.iter_mut().zip(s_tail) {
        *d = *x * scale;
    }
}

/// `dst += src`. The two rows must have the same length.
#[inline(always)]
pub(crate) fn add(dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    let (d_body, d_tail) = dst.as_chunks_mut::<LANES>();
    let (s_body, s_tail) = src.as_chunks::<LANES>();
    for (d, x) in d_body.iter_mut().zip(s_body) {
        store(d, load(d) + load(x));
    }
    for (d, x) in d_tail.iter_mut().zip(s_tail) {
        *d += *x;
    }
}

/// `dst = src * scale` (or `dst = src` when `scale` is `None`), writing the
/// 16-byte-aligned middle of `dst` with non-temporal (streaming) stores that
/// bypass the caches. Call [`fence`] after the last one, before anyone else
/// reads `dst`. Off x86-64 this is the cached copy or scale.
///
/// Streaming pays when the output is far larger than the caches: a normal
/// store first reads the line it writes (read-for-ownership), so a gather
/// moves its output bytes twice. A memcpy of that size streams too, so
/// without this the roofline would be out of reach by construction.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn store_streaming(dst: &mut [f32], src: &[f32], scale: Option<f32>) {
    debug_assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128, _mm_stream_ps};
        use wide::f32x4;
        let (head, body, tail) = bytemuck::pod_align_to_mut::<f32, __m128>(dst);
        let (src_head, rest) = src.split_at(head.len());
        let (src_body, src_tail) = rest.as_chunks::<4>();
        cached(head, src_head, scale);
        for (d, x) in body.iter_mut().zip(src_body) {
            let mut v: f32x4 = bytemuck::cast(*x);
            if let Some(s) = scale {
                v *= f32x4::splat(s);
            }
            // SAFETY: `_mm_stream_ps` needs SSE, which is in the x86-64
            // baseline. The pointer is a live `&mut __m128` turned into a
            // `*mut f32`: valid for 16 bytes of writes and 16-byte aligned,
            // as the instruction requires.
            unsafe { _mm_stream_ps((d as *mut __m128).cast::<f32>(), bytemuck::cast(v)) };
        }
        cached(tail, src_tail, scale);
    }
    #[cfg(not(target_arch = "x86_64"))]
    cached(dst, src, scale);
}

#[inline(always)]
fn cached(dst: &mut [f32], src: &[f32], s: Option<f32>) {
    match s {
        Some(s) => scale(dst, src, s),
        None => copy(dst, src),
    }
}

/// Orders this thread's streaming stores before whatever follows (the
/// `sfence` that `_mm_stream_ps` asks for). A no-op off x86-64.
#[inline]
#[allow(unsafe_code)]
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_sfence` needs SSE, which is in the x86-64 baseline; it
    // only orders stores.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
}

/// Asks the cache for the lines of `row` ahead of use. A hint only: it reads
/// nothing and cannot fault, and it compiles to nothing off x86-64.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn prefetch(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // One hint per 64-byte line.
        for line in row.chunks(16) {
            // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has
            // (it is in the target's baseline features). The pointer comes
            // from a live slice, and a prefetch never dereferences it anyway:
            // it cannot fault and changes no memory.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast::<i8>()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(len: usize) -> (Vec<f32>, Vec<f32>) {
        let a = (0..len).map(|i| i as f32 * 0.37 - 3.0).collect();
        let b = (0..len).map(|i| 1.0 / (i as f32 + 0.5)).collect();
        (a, b)
    }

    #[test]
    fn every_tail_length_matches_scalar_arithmetic() {
        for len in 0..=2 * LANES + 1 {
            let (a, b) = rows(len);
            let mut out = vec![f32::NAN; len];
            copy(&mut out, &a);
            assert_eq!(out, a);
            scale(&mut out, &a, 1.7);
            let want: Vec<f32> = a.iter().map(|x| x * 1.7).collect();
            assert_eq!(out, want);
            let mut acc = b.clone();
            add(&mut acc, &a);
            let want: Vec<f32> = b.iter().zip(&a).map(|(x, y)| x + y).collect();
            assert_eq!(acc, want);
            // Every alignment of the destination, so the streamed middle,
            // the cached head and the tail all get exercised.
            for offset in 0..4 {
                let mut buf = vec![f32::NAN; len + offset];
                store_streaming(&mut buf[offset..], &a, None);
                fence();
                assert_eq!(&buf[offset..], &a[..]);
                store_streaming(&mut buf[offset..], &a, Some(1.7));
                fence();
                let want: Vec<f32> = a.iter().map(|x| x * 1.7).collect();
                assert_eq!(&buf[offset..], &want[..]);
            }
        }
    }
}
