//! Non-temporal (streaming) stores: whole lines go to memory without first
//! being read into the cache. For sweeps that write far more than the caches
//! hold and read none of it back soon (the dense backward's table). A plain
//! store reads every line it writes, doubling the traffic.
//!
//! [`Lanes::stream`](super::Lanes::stream) picks the register: 32 bytes with
//! AVX (half the store instructions, which the sweep of zeros needs to keep
//! up with a memset), 16 bytes otherwise. Call [`fence`] before another
//! thread reads what was streamed.

#![allow(unsafe_code)]

/// `dst = src`, or zeros, with 16-byte streaming stores wherever `dst` is
/// 16-byte aligned; plain stores off x86-64.
#[inline(always)]
pub(crate) fn sse(dst: &mut [f32], src: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128, _mm_stream_ps};
        with::<__m128, 4>(dst, src, |d, v| {
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

/// The body of both widths: `dst` cut at the alignment of `V`, a register of
/// `W` floats; the unaligned head and tail written plainly, every whole
/// register by `store` (a streaming store), from `src` or zeros.
#[inline(always)]
pub(crate) fn with<V: bytemuck::Pod, const W: usize>(
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

/// Orders the streaming stores before every later store, so a task that
/// streamed can hand its rows to another thread.
#[inline(always)]
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders stores; it needs SSE, which every x86-64
    // CPU has.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::super::{Body, Isa, Lanes};

    struct Stream<'a>(&'a mut [f32], Option<&'a [f32]>);

    impl Body for Stream<'_> {
        type Output = ();
        fn run<V: Lanes>(self) {
            V::stream(self.0, self.1);
        }
    }

    #[test]
    fn every_width_writes_the_row_or_zeros_at_any_alignment() {
        let src: Vec<f32> = (0..80).map(|i| i as f32 - 40.5).collect();
        for isa in Isa::all() {
            for start in 0..8 {
                for len in 0..=70 {
                    let from = &src[..len];
                    let mut out = vec![f32::NAN; start + len];
                    isa.run(Stream(&mut out[start..], Some(from)));
                    super::fence();
                    assert_eq!(&out[start..], from, "{isa:?} start {start} len {len}");
                    isa.run(Stream(&mut out[start..], None));
                    super::fence();
                    assert!(out[start..].iter().all(|&x| x == 0.0));
                    assert!(
                        out[..start].iter().all(|x| x.is_nan()),
                        "{isa:?}: nothing before the row"
                    );
                }
            }
        }
    }
}
