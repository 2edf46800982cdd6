//! [`Written`], a test output that records which values a kernel wrote.

use super::slot::Slot;

/// An output value that tells whether the kernel wrote it: what the
/// layers' fresh outputs (`MaybeUninit<f32>`s, written once) need of the
/// kernel, checked without reading uninitialised memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Written(pub(crate) Option<u32>);

impl Slot for Written {
    fn put(dst: &mut [Self], src: &[f32]) {
        assert_eq!(dst.len(), src.len());
        for (d, s) in dst.iter_mut().zip(src) {
            *d = Written(Some(s.to_bits()));
        }
    }

    fn zero(dst: &mut [Self]) {
        dst.fill(Written(Some(0.0f32.to_bits())));
    }
}
