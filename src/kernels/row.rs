//! Row primitives: copy, scale and add rows of `f32`s, eight lanes at a
//! time with `wide::f32x8`, then a scalar tail of `len % 8` values.
//!
//! Every lane does one IEEE operation per value (`a * s` or `a + b`), or
//! two, each rounded (`a * s + b`, never a fused multiply-add), so the
//! result is the same bits whatever width the vector unit has and whether
//! the value went through the vector body or the scalar tail. That is what
//! lets the kernels promise bitwise equality with the reference and across
//! thread counts.
//!
//! The slices are split with `as_chunks`, so the body has no bounds checks
//! and the compiler sees whole `[f32; 8]` blocks, which `bytemuck::cast`
//! turns into vectors for free (both are plain 32-byte values).

use wide::f32x8;

/// Lanes per vector.
pub(crate) const LANES: usize = 8;

#[inline(always)]
pub(crate) fn load(block: &[f32; LANES]) -> f32x8 {
    bytemuck::cast(*block)
}

#[inline(always)]
pub(crate) fn store(block: &mut [f32; LANES], v: f32x8) {
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

/// `dst = a + b`. The three rows must have the same length.
#[inline(always)]
pub(crate) fn add_rows(dst: &mut [f32], a: &[f32], b: &[f32]) {
    debug_assert_eq!(dst.len(), a.len());
    debug_assert_eq!(dst.len(), b.len());
    let (d_body, d_tail) = dst.as_chunks_mut::<LANES>();
    let (a_body, a_tail) = a.as_chunks::<LANES>();
    let (b_body, b_tail) = b.as_chunks::<LANES>();
    for ((d, x), y) in d_body.iter_mut().zip(a_body).zip(b_body) {
        store(d, load(x) + load(y));
    }
    for ((d, x), y) in d_tail.iter_mut().zip(a_tail).zip(b_tail) {
        *d = *x + *y;
    }
}

/// `dst = a * scale + b`: a multiplication, rounded, then an addition,
/// rounded (never one fused multiply-add), so each value has the bits of
/// [`scale`] followed by [`add`]. The three rows must have the same length.
#[inline(always)]
pub(crate) fn scale_add_rows(dst: &mut [f32], a: &[f32], scale: f32, b: &[f32]) {
    debug_assert_eq!(dst.len(), a.len());
    debug_assert_eq!(dst.len(), b.len());
    let s = f32x8::splat(scale);
    let (d_body, d_tail) = dst.as_chunks_mut::<LANES>();
    let (a_body, a_tail) = a.as_chunks::<LANES>();
    let (b_body, b_tail) = b.as_chunks::<LANES>();
    for ((d, x), y) in d_body.iter_mut().zip(a_body).zip(b_body) {
        store(d, load(x) * s + load(y));
    }
    for ((d, x), y) in d_tail.iter_mut().zip(a_tail).zip(b_tail) {
        *d = *x * scale + *y;
    }
}

/// `dst += src * scale`: the product is rounded before it is added (no fused
/// multiply-add), so each value has the bits of scaling `src` first and then
/// [`add`]ing it. The two rows must have the same length.
#[inline(always)]
pub(crate) fn add_scaled(dst: &mut [f32], src: &[f32], scale: f32) {
    debug_assert_eq!(dst.len(), src.len());
    let s = f32x8::splat(scale);
    let (d_body, d_tail) = dst.as_chunks_mut::<LANES>();
    let (s_body, s_tail) = src.as_chunks::<LANES>();
    for (d, x) in d_body.iter_mut().zip(s_body) {
        store(d, load(d) + load(x) * s);
    }
    for (d, x) in d_tail.iter_mut().zip(s_tail) {
        *d += *x * scale;
    }
}

/// Asks the cache for every 64-byte line `row` touches, ahead of use. A
/// hint only: it reads nothing and cannot fault, and it compiles to nothing
/// off x86-64.
///
/// A row need not start on a line: allocators align to 16 bytes, so a
/// row of 16 floats usually spans two lines and one of 128 floats nine. A
/// hint per 16 floats from the row's start would miss the last line of
/// each; the hints here step from the first line to the line of the last
/// value. (Missing that last line cost a cache miss per row: the grouped
/// dense backward of narrow's 64-byte rows took 28 ms on one thread before,
/// 17 ms after.)
#[inline(always)]
pub(crate) fn prefetch(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let Some(last) = row.last() else { return };
        let first = row.as_ptr() as usize & !63;
        let lines = (last as *const f32 as usize - first) / 64 + 1;
        let hint = |k: usize| hint(first + 64 * k);
        // Four hints per step, not one per loop trip: a bag sum over recsys
        // written for the test took 2.6 ms with its eight hints a row
        // written out and 3.1 ms with a loop of one hint (same run).
        let mut k = 0;
        while k + 4 <= lines {
            hint(k);
            hint(k + 1);
            hint(k + 2);
            hint(k + 3);
            k += 4;
        }
        while k < lines {
            hint(k);
            k += 1;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// [`prefetch`] for the block `table[at..at + N·8]`, its hints counted at
/// compile time: one every 64 bytes from the block's start (`N/2` of them,
/// at least one) and one at its last value, which for a block that starts
/// on a line repeats the line before (a hint whose line is already asked
/// for costs one instruction) and otherwise reaches the line the block
/// straddles into. Neither the range nor the hints are checked: a hint is
/// only an address, and a wrong one costs a wasted fetch, never a fault.
#[inline(always)]
pub(crate) fn prefetch_block<const N: usize>(table: &[f32], at: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        // `wrapping_add`: defined for any offset, and only an address.
        let start = table.as_ptr().wrapping_add(at) as usize;
        for k in 0..(N * LANES * 4).div_ceil(64) {
            hint(start + 64 * k);
        }
        hint(start + (N * LANES - 1) * 4);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (table, at);
}

/// One `T0` prefetch of the line holding `addr`: the single hint of
/// [`prefetch`] and [`prefetch_block`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
fn hint(addr: usize) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has (it is
    // in the target's baseline features). A prefetch never dereferences its
    // address: any address, in a live slice or not, cannot fault and changes
    // no memory.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(addr as *const i8) };
}

/// Where `src > best` (strictly; a NaN never wins), `best = src` and
/// `at = here`: one step of a running arg-max. The three rows must have the
/// same length.
#[inline(always)]
pub(crate) fn keep_max(best: &mut [f32], at: &mut [f32], src: &[f32], here: f32) {
    debug_assert_eq!(best.len(), src.len());
    debug_assert_eq!(at.len(), src.len());
    let h = f32x8::splat(here);
    let (b_body, b_tail) = best.as_chunks_mut::<LANES>();
    let (a_body, a_tail) = at.as_chunks_mut::<LANES>();
    let (s_body, s_tail) = src.as_chunks::<LANES>();
    for ((b, a), x) in b_body.iter_mut().zip(a_body).zip(s_body) {
        let (v, old) = (load(x), load(b));
        let wins = v.simd_gt(old);
        store(b, wins.bitselect(v, old));
        store(a, wins.bitselect(h, load(a)));
    }
    for ((b, a), &x) in b_tail.iter_mut().zip(a_tail).zip(s_tail) {
        if x > *b {
            *b = x;
            *a = here;
        }
    }
}

/// `dst = src`, or zeros when `src` is `None`, written with non-temporal
/// (streaming) stores wherever `dst` is aligned for them (32 bytes with
/// AVX, chosen at run time, else 16), so the lines go to memory without
/// first being read into the cache. For sweeps that write far more than the
/// caches hold and read none of it back soon (the dense backward's table).
/// Call [`stream_fence`] before anyone else reads `dst`.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn stream(dst: &mut [f32], src: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if super::avx::Avx::detect().is_some() {
        // SAFETY: the CPU has AVX, which is all `avx::stream` needs.
        unsafe { super::avx::stream(dst, src) };
        return;
    }
    stream_sse(dst, src);
}

/// [`stream`] with 16-byte stores, for any x86-64 CPU.
#[inline(always)]
#[allow(unsafe_code)]
fn stream_sse(dst: &mut [f32], src: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128, _mm_stream_ps};
        stream_with::<__m128, 4>(dst, src, |d, v| {
            // SAFETY: `d` is a live `&mut __m128` inside `dst`, so the
            // pointer is valid for 16 bytes and 16-byte aligned (what
            // `pod_align_to_mut` hands out), as `_mm_stream_ps` requires.
            // It needs SSE, which every x86-64 CPU has.
            unsafe { _mm_stream_ps((d as *mut __m128).cast::<f32>(), v) }
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    match src {
        Some(src) => dst.copy_from_slice(src),
        None => dst.fill(0.0),
    }
}

/// The body of both streams: `dst` cut at the alignment of `V`, a register
/// of `W` floats; the unaligned head and tail written plainly, every whole
/// register by `store` (a streaming store), from `src` or zeros.
#[inline(always)]
pub(crate) fn stream_with<V: bytemuck::Pod, const W: usize>(
    dst: &mut [f32],
    src: Option<&[f32]>,
    mut store: impl FnMut(&mut V, V),
) {
    let (head, body, tail) = bytemuck::pod_align_to_mut::<f32, V>(dst);
    let (h, b, t) = match src {
        Some(src) => {
            debug_assert_eq!(src.len(), head.len() + W * body.len() + tail.len());
            let (h, rest) = src.split_at(head.len());
            let (b, t) = rest.split_at(W * body.len());
            (Some(h), Some(b.as_chunks::<W>().0), Some(t))
        }
        None => (None, None, None),
    };
    match h {
        Some(h) => head.copy_from_slice(h),
        None => head.fill(0.0),
    }
    for (k, d) in body.iter_mut().enumerate() {
        let v: V = match b {
            Some(b) => bytemuck::pod_read_unaligned(bytemuck::cast_slice(&b[k])),
            None => V::zeroed(),
        };
        store(d, v);
    }
    match t {
        Some(t) => tail.copy_from_slice(t),
        None => tail.fill(0.0),
    }
}

/// Orders the streaming stores of [`stream`] before every later store, so
/// a task that streamed can hand its rows to another thread.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders stores; it needs SSE, which every x86-64
    // CPU has.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn rows(len: usize) -> (Vec<f32>, Vec<f32>) {
        let a = (0..len).map(|i| i as f32 * 0.37 - 3.0).collect();
        let b = (0..len).map(|i| 1.0 / (i as f32 + 0.5)).collect();
        (a, b)
    }

    #[test]
    fn both_streams_write_the_row_or_zeros_at_any_alignment() {
        let src: Vec<f32> = (0..80).map(|i| i as f32 - 40.5).collect();
        for start in 0..8 {
            for len in 0..=70 {
                let from = &src[..len];
                let mut sse = vec![f32::NAN; start + len];
                stream_sse(&mut sse[start..], Some(from));
                let mut ours = vec![f32::NAN; start + len];
                stream(&mut ours[start..], Some(from));
                stream_fence();
                assert_eq!(&sse[start..], from, "start {start} len {len}");
                assert_eq!(&ours[start..], from, "start {start} len {len}");
                assert!(
                    sse[..start].iter().all(|x| x.is_nan()),
                    "nothing before the row"
                );
                stream_sse(&mut sse[start..], None);
                stream(&mut ours[start..], None);
                stream_fence();
                assert!(sse[start..].iter().chain(&ours[start..]).all(|&x| x == 0.0));
                assert!(
                    ours[..start].iter().all(|x| x.is_nan()),
                    "nothing before the row"
                );
            }
        }
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

            add_rows(&mut out, &a, &b);
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            assert_eq!(out, want);
            scale_add_rows(&mut out, &a, 1.7, &b);
            // The composition it must equal: scale, then add.
            let mut want = vec![f32::NAN; len];
            scale(&mut want, &a, 1.7);
            add(&mut want, &b);
            assert_eq!(bits(&out), bits(&want));
            let mut acc = b.clone();
            add_scaled(&mut acc, &a, 1.7);
            let mut want = vec![f32::NAN; len];
            scale(&mut want, &a, 1.7);
            let mut sum = b.clone();
            add(&mut sum, &want);
            assert_eq!(bits(&acc), bits(&sum));
        }
    }
}
