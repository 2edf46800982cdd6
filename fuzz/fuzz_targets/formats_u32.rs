//! `formats` (`fuzz_targets/formats.rs`, whose notes say what is checked)
//! with `u32` ids: the same decoded cases and checks, the kernels compiled
//! for the other row type.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "formats/check.rs"]
mod check;

fuzz_target!(|data: &[u8]| check::run::<u32>(data));
