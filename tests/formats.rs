//! Reduced-precision tables: the packing rules of `formats` on the rows where
//! they matter (ties, constant rows, signed zeros, every width), the errors
//! for rows PyTorch would pack into garbage, readback bounds, and the same
//! bytes on every thread count. PyTorch's own bytes are compared in
//! `formats_golden` below when its golden file is present.

use crate::common;

use crate::common::{SplitMix, pools, row, run_table};
use embedding_kernels::formats::{self, PackedTable, RowWise};
use embedding_kernels::{EmbeddingError, Operand, Parallelism};

const ALL: [RowWise; 3] = [RowWise::Int8, RowWise::Int4, RowWise::Int2];

fn unpack(format: RowWise, packed: &[u8], dim: usize) -> Vec<f32> {
    let rows = PackedTable::new(format, dim, packed).unwrap().rows();
    let mut out = vec![f32::NAN; rows * dim];
    format.dequantize(packed, dim, &mut out).unwrap();
    out
}

#[test]
fn row_sizes_follow_pytorch_layouts() {
    for dim in 0..40 {
        assert_eq!(RowWise::Int8.row_bytes(dim), Some(dim + 8));
        assert_eq!(RowWise::Int4.row_bytes(dim), Some(dim.div_ceil(2) + 4));
        assert_eq!(RowWise::Int2.row_bytes(dim), Some(dim.div_ceil(4) + 4));
    }
    assert_eq!(RowWise::Int8.row_bytes(usize::MAX), None);
}

/// 8 bits: a row from 0 to 255 has scale 1 and bias 0, so `k + 0.5` lies
/// exactly between two levels and must go to the even one; the scale and
/// bias are stored after the codes, little-endian.
#[test]
fn eight_bit_ties_go_to_even_levels() {
    let mut x = vec![0.0f32, 255.0];
    x.extend((0..254).map(|k| k as f32 + 0.5));
    let dim = x.len();
    let packed = RowWise::Int8.prepack(&x, dim).unwrap();
    // 255 / (255 + 1e-8) rounds to 1 in f32, so the products are exact.
    for (c, &v) in x.iter().enumerate() {
        let want = v.round_ties_even() as u8;
        assert_eq!(packed[c], want, "column {c}, value {v}");
    }
    let scale = f32::from_le_bytes(packed[dim..dim + 4].try_into().unwrap());
    let bias = f32::from_le_bytes(packed[dim + 4..dim + 8].try_into().unwrap());
    assert_eq!((scale, bias), (1.0, 0.0));
}

/// 4 and 2 bits: levels of a row from 0 to L, ties to even, the even column
/// in the low bits, scale and bias as `f16` after the codes.
#[test]
fn nbit_codes_pack_low_bits_first_with_ties_to_even() {
    for (format, levels) in [(RowWise::Int4, 15u8), (RowWise::Int2, 3u8)] {
        let mut x: Vec<f32> = vec![0.0, f32::from(levels)];
        x.extend((0..levels).map(|k| f32::from(k) + 0.5));
        x.extend((0..=levels).map(f32::from));
        let dim = x.len();
        let packed = RowWise::prepack(format, &x, dim).unwrap();
        let per_byte = 8 / format.bits() as usize;
        for (c, &v) in x.iter().enumerate() {
            let q = (packed[c / per_byte] >> ((c % per_byte) as u32 * format.bits())) & levels;
            assert_eq!(
                q,
                v.round_ties_even() as u8,
                "{format:?} column {c}, value {v}"
            );
        }
        let table = PackedTable::new(format, dim, &packed).unwrap();
        assert_eq!(table.scale_bias(0), Some((1.0, 0.0)), "{format:?}");
        assert_eq!(table.scale_bias(1), None);
        // Far past the table, where `r · row_bytes` would overflow.
        assert_eq!(table.scale_bias(1 << 60), None);
        assert_eq!(table.scale_bias(usize::MAX), None);
        assert_eq!(table.code(usize::MAX, 0), None);
    }
}

/// A constant row reads back exactly (8 bits: scale 0, bias the value; 4
/// and 2 bits: scale 1 and an `f16` bias, exact for an `f16` value), and an
/// empty row packs to its scale and bias alone.
#[test]
fn constant_and_empty_rows() {
    for format in ALL {
        for v in [0.0f32, -0.0, 1.5, -3.25, 1000.0] {
            let x = vec![v; 9];
            let packed = format.prepack(&x, 9).unwrap();
            let back = unpack(format, &packed, 9);
            assert!(
                back.iter().all(|&b| b == v),
                "{format:?} constant {v}: {back:?}"
            );
        }
        let packed = format.prepack(&[], 0).unwrap();
        assert!(packed.is_empty());
    }
}

/// Every value reads back within half a level of itself (plus, for 4 and 2
/// bits, the `f16` rounding of the row's minimum), for rows of every width
/// and magnitudes from 2^-12 to 2^12.
#[test]
fn readback_is_within_half_a_level() {
    let mut rng = SplitMix(5);
    for dim in [1, 2, 3, 5, 8, 16, 17, 31, 64, 130] {
        for format in ALL {
            let x = rng.wilds(7 * dim);
            let packed = format.prepack(&x, dim).unwrap();
            let back = unpack(format, &packed, dim);
            let table = PackedTable::new(format, dim, &packed).unwrap();
            for r in 0..7 {
                let row = &x[r * dim..(r + 1) * dim];
                let (scale, bias) = table.scale_bias(r).unwrap();
                let min = row.iter().copied().fold(f32::INFINITY, f32::min);
                let slack = scale * 0.5 + (bias - min).abs() + 1e-6 * min.abs().max(1.0);
                for (c, (&v, &b)) in row.iter().zip(&back[r * dim..]).enumerate() {
                    assert!(
                        (v - b).abs() <= slack * 1.0001,
                        "{format:?} dim {dim} row {r} col {c}: {v} read back as {b} (scale {scale})"
                    );
                }
            }
        }
    }
}

#[test]
fn every_thread_count_packs_the_same_bytes() {
    let mut rng = SplitMix(9);
    let dim = 48;
    let x = rng.wilds(3000 * dim); // 576 KiB: split with `Rayon`
    for format in ALL {
        let serial = format.prepack_with(Parallelism::Serial, &x, dim).unwrap();
        let mut back = vec![0.0; x.len()];
        format
            .dequantize_with(Parallelism::Serial, &serial, dim, &mut back)
            .unwrap();
        for pool in pools() {
            let (packed, unpacked) = pool.install(|| {
                let packed = format.prepack_with(Parallelism::Rayon, &x, dim).unwrap();
                let mut unpacked = vec![0.0; x.len()];
                format
                    .dequantize_with(Parallelism::Rayon, &packed, dim, &mut unpacked)
                    .unwrap();
                (packed, unpacked)
            });
            assert_eq!(
                packed,
                serial,
                "{format:?}, {} threads",
                pool.current_num_threads()
            );
            assert_eq!(common::bits(&unpacked), common::bits(&back));
        }
    }
}

/// Rows that PyTorch would pack into meaningless bytes are errors, naming
/// the first bad row, on one thread and on the pool.
#[test]
fn rows_without_a_meaningful_scale_are_errors() {
    let dim = 4;
    let with = |r: usize, row: [f32; 4]| {
        let mut t = vec![0.5f32; 2000 * dim];
        t[r * dim..(r + 1) * dim].copy_from_slice(&row);
        t
    };
    let not_finite = |row, column| EmbeddingError::NotFinite { row, column };
    let overflow = |row| EmbeddingError::RangeOverflow { row };
    let all = ALL.to_vec();
    let nbit = vec![RowWise::Int4, RowWise::Int2];
    let rows = vec![
        row(
            "+inf",
            (all.clone(), with(3, [0.0, f32::INFINITY, 1.0, 2.0])),
            not_finite(3, 1),
        ),
        row(
            "-inf",
            (all.clone(), with(1999, [f32::NEG_INFINITY, 0.0, 1.0, 2.0])),
            not_finite(1999, 0),
        ),
        row(
            "NaN",
            (all.clone(), with(700, [0.0, 1.0, 2.0, f32::NAN])),
            not_finite(700, 3),
        ),
        row(
            "range past f32",
            (all.clone(), with(5, [-3e38, 3e38, 0.0, 0.0])),
            overflow(5),
        ),
        row(
            "min past f16",
            (nbit.clone(), with(8, [-1e6, -1e6, -1e6, -1e6])),
            overflow(8),
        ),
        row(
            "scale past f16",
            (nbit, with(9, [0.0, 3e6, 1.0, 1.0])),
            overflow(9),
        ),
        row(
            "not whole rows",
            (all, vec![0.0; 7]),
            EmbeddingError::NotMultipleOfDim {
                operand: Operand::Table,
                len: 7,
                dim,
            },
        ),
    ];
    // A range that only an f16 scale cannot hold is fine with 8 bits.
    assert!(
        RowWise::Int8
            .prepack(&with(9, [0.0, 3e6, 1.0, 1.0]), dim)
            .is_ok()
    );
    run_table(&rows, |(formats, table), want| {
        for &format in formats {
            for par in [Parallelism::Serial, Parallelism::Rayon] {
                let got = pools()[1].install(|| format.prepack_with(par, table, dim));
                assert_eq!(got, Err(want.clone()), "{format:?} {par:?}");
            }
        }
    });
}

#[test]
fn packed_lengths_are_checked_and_nothing_is_written() {
    let packed = vec![0u8; 3 * 12 + 5];
    assert_eq!(
        PackedTable::new(RowWise::Int8, 4, &packed).unwrap_err(),
        EmbeddingError::PackedLength {
            len: 41,
            row_bytes: 12
        }
    );
    let packed = RowWise::Int4
        .prepack(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3)
        .unwrap();
    let mut out = vec![f32::NAN; 5];
    let err = RowWise::Int4.dequantize(&packed, 3, &mut out).unwrap_err();
    assert_eq!(
        err,
        EmbeddingError::LengthMismatch {
            operand: Operand::Output,
            expected: 6,
            got: 5
        }
    );
    assert!(out.iter().all(|x| x.is_nan()), "nothing written");
}

#[test]
fn half_tables_round_to_nearest_even() {
    // 1 + 2^-11 lies halfway between two f16s (1 and 1 + 2^-10): to even, 1.
    let x = [
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65520.0,
        -0.0,
    ];
    let h = formats::to_f16(&x).unwrap();
    let back = formats::f16_to_f32(&h).unwrap();
    assert_eq!(back[0], 1.0);
    assert_eq!(back[1], 1.0 + 2.0 * 2f32.powi(-10));
    assert!(back[2].is_infinite(), "65520 rounds up past f16's largest");
    assert_eq!(back[3].to_bits(), (-0.0f32).to_bits());
    // bf16 keeps 8 bits of mantissa: 1 + 2^-8 is a tie, to even (1).
    let b = formats::bf16_to_f32(&formats::to_bf16(&[1.0 + 2f32.powi(-8), 3e38]).unwrap()).unwrap();
    assert_eq!(b[0], 1.0);
    assert!((b[1] - 3e38).abs() / 3e38 < 1e-2);
}

/// An owned table of every format: its bytes read back as the same table,
/// its `f32` readback is the format's conversion, its lent view has its
/// shape; bytes that are not whole rows are refused.
#[test]
fn owned_tables_round_trip_through_their_bytes() {
    use embedding_kernels::formats::{Format, OwnedTable};
    let mut rng = SplitMix(41);
    for dim in [1, 3, 8, 13] {
        let rows = 9;
        let table = rng.wilds(rows * dim);
        for format in Format::ALL {
            let owned = OwnedTable::from_f32(&table, dim, format).unwrap();
            assert_eq!(
                (owned.format(), owned.dim(), owned.rows()),
                (format, dim, rows)
            );
            let bytes = owned.to_le_bytes().unwrap();
            assert_eq!(
                bytes.len(),
                rows * format.row_bytes(dim).unwrap(),
                "{format}"
            );
            assert_eq!(owned.byte_len(), bytes.len());
            let back = OwnedTable::from_le_bytes(format, dim, &bytes).unwrap();
            assert_eq!(back, owned, "{format} dim {dim}");
            let want = match format {
                Format::F32 => table.clone(),
                Format::F16 => formats::f16_to_f32(&formats::to_f16(&table).unwrap()).unwrap(),
                Format::Bf16 => formats::bf16_to_f32(&formats::to_bf16(&table).unwrap()).unwrap(),
                _ => unpack(format.row_wise().unwrap(), &bytes, dim),
            };
            assert_eq!(common::bits(&owned.to_f32().unwrap()), common::bits(&want));
            let view = owned.as_ref();
            assert_eq!(
                (view.format(), view.dim(), view.rows()),
                (format, dim, rows)
            );
            let err = OwnedTable::from_le_bytes(format, dim, &bytes[1..]).unwrap_err();
            assert_eq!(
                err,
                EmbeddingError::PackedLength {
                    len: bytes.len() - 1,
                    row_bytes: format.row_bytes(dim).unwrap()
                }
            );
        }
    }
    assert_eq!(Format::from_name("int4"), Some(Format::Int4));
    assert!(
        Format::ALL
            .iter()
            .all(|f| Format::from_name(f.name()) == Some(*f))
    );
}

/// An empty table of an absurd width splits into no tasks: no size is
/// computed from the width alone (found by the `formats` fuzz target:
/// `TASK_ROWS * dim` overflowed).
#[test]
fn empty_tables_of_any_width_pack_and_unpack() {
    for pool in pools() {
        for format in ALL {
            for dim in [1usize << 40, 1 << 62, usize::MAX / 2] {
                let mut out: [f32; 0] = [];
                pool.install(|| format.dequantize_with(Parallelism::Rayon, &[], dim, &mut out))
                    .unwrap();
                let packed = pool.install(|| format.prepack_with(Parallelism::Rayon, &[], dim));
                assert_eq!(packed.map(|p| p.len()), Ok(0), "{format:?} dim {dim}");
            }
        }
    }
}

/// `bf16` back to `f32` keeps every bit, signalling NaNs too (as the
/// kernels read it).
#[test]
fn bf16_widening_keeps_signalling_nans() {
    let bits = [0x7f86u16, 0xff81, 0x7fc0, 0x0001, 0x8000];
    let halves: Vec<half::bf16> = bits.iter().map(|&b| half::bf16::from_bits(b)).collect();
    let wide = formats::bf16_to_f32(&halves).unwrap();
    let want: Vec<u32> = bits.iter().map(|&b| u32::from(b) << 16).collect();
    assert_eq!(common::bits(&wide), want);
}
