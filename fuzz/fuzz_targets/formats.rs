//! Checks the reduced-precision table paths (`f16`, `bf16`, and the
//! row-wise quantized `int8`, `int4`, `int2`) against scalar oracles written
//! here from the crate's documentation (`formats/oracle.rs`), on tables of
//! arbitrary bits: packed rows whose scales and biases are NaN, infinite or
//! subnormal, garbage in the unused bits of the last code byte, halves of
//! every bit pattern.
//!
//! For one decoded case it calls, with `Serial`, `Rayon` and `Auto` (on 1
//! to 4 threads) and the plain forms:
//!
//! * the table constructors, `TableRef::f16` / `TableRef::bf16` or
//!   `PackedTable::new`, and `OwnedTable::from_le_bytes` (with `to_f32`,
//!   `to_le_bytes` and `as_ref`): the result the layout rules of `formats/`
//!   predict, error values included;
//! * `table_gather_with` and `table_gather`, on the `TableRef` and on the
//!   `OwnedTable`'s: the predicted `Ok` or error (from the documented check
//!   order), the output untouched on an error (a NaN canary in every
//!   element, compared bit for bit), and on success every value the row
//!   decoded by hand: `f16::from_bits(h).to_f32()`, a `bf16` as `h << 16`,
//!   a packed value as `f32::mul_add(q, scale, bias)` with `q` read lowest
//!   bits first and the scale and bias after the codes (`f32` LE for 8 bits,
//!   `f16` LE for 4 and 2);
//! * `gather_half(_with)` (half tables): a bit copy of the rows;
//! * `table_bag_forward(_with)` in every mode, with per-sample weights and
//!   `padding_idx` (also where they are an error), arbitrary offsets, wrong
//!   output and `max_indices` lengths: the predicted `Ok` or error, both
//!   buffers untouched on an error, `max_indices` untouched outside max
//!   mode, and on success, for half tables, what `bag_forward` gives on the
//!   table widened by hand (the same error too); for packed tables, in sum
//!   mode `reference::packed_bag_sum` (over the ids that are not
//!   `padding_idx`), in mean mode that sum divided by the kept count, in max
//!   mode the first largest decoded value of each column and its id (0.0
//!   and -1 for an empty bag); and `table_bag_forward_strided_with`, rows
//!   1 to 4 values wider than a row apart: the same result, the same rows,
//!   the values between them untouched;
//! * `RowWise::dequantize(_with)`: the predicted result and the table
//!   decoded by hand;
//! * `RowWise::prepack(_with)` and `OwnedTable::from_f32` on arbitrary `f32`
//!   rows: the same bytes on every thread count, the first bad row's error
//!   by the rules of `formats/rowwise.rs`, and on success every value read
//!   back within half a level of its input (`oracle::round_trip_bound`).
//!
//! # Bits, and NaNs
//!
//! Every call must give the bits of the first call of its kind, NaN
//! payloads included, whatever its `Parallelism` and thread count. Against
//! the oracles, copies and exact decodes (`gather_half`, half lookups, max
//! over half rows) are held to every bit too. Arithmetic results (a packed
//! value's `fma`, sums and means) are held to every bit except that any NaN
//! matches any NaN: where two NaNs meet (a row's NaN scale and NaN bias,
//! NaNs of two rows in one sum) the payload that survives depends on the
//! operand order the compiler picks for a commutative operation, which Rust
//! leaves unspecified.
//!
//! # From bytes to a case
//!
//! A header read with [`arbitrary::Unstructured`] (zeros past the end of
//! the input) picks the format, `dim` (0..=70, or a huge one with an empty
//! table), the row count (0..=64, or 255..=600 so that the parallel drivers
//! split), the thread count, the id type (a byte still read so that inputs
//! decode as before; each target uses its own type), the id count (up
//! to 2523), up to four planted ids (the last row, the first invalid one,
//! -1, `i64::MIN`, `i64::MAX`, `u32::MAX`, 2^32, raw bits), where the table
//! comes from (raw bytes, tame codes with scales and biases from a list of
//! specials, or the `f32` input prepacked), a table length fault, the bag
//! cut and its faults, weights, `padding_idx`, output length faults, the
//! kind of the prepack's `f32` input, and a seed. The bytes after the
//! header are the table itself (raw source), so the fuzzer writes the scales
//! and biases; what they do not cover comes from a SplitMix64 stream seeded
//! by the header (`formats/case.rs`).
//!
//! # Two targets, one id type each
//!
//! This target runs every case with `i64` ids, `formats_u32` with `u32`
//! ids (the header's id-type choice is ignored); the checks are
//! `formats/check.rs`. Each binary then compiles the kernels for one row
//! type only.
//!
//! # Running
//!
//! ```text
//! cargo fuzz run -s none --no-trace-compares formats -- -len_control=0
//! cargo fuzz run -s none --no-trace-compares formats_u32 -- -len_control=0
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "formats/check.rs"]
mod check;

fuzz_target!(|data: &[u8]| check::run::<i64>(data));
