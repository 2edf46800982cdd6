//! Reduced-precision tables against PyTorch's own bytes and bits, from
//! `tests/data/pytorch_quantized.json` (written by
//! `tests/data/pytorch_golden.py` with PyTorch 2.15; `cargo test` never needs
//! PyTorch). For every case:
//!
//! * `f16` and `bf16` conversions give PyTorch's bits (NaN as NaN);
//! * every row this crate packs has PyTorch's bytes, at 8, 4 and 2 bits,
//!   and every row it refuses is one PyTorch packs into bytes that read
//!   back as non-finite values although the row was finite, or a row with a
//!   non-finite value;
//! * unpacking PyTorch's bytes gives PyTorch's unpacked bits;
//! * the reference bag sum over PyTorch's packed table gives PyTorch's bag
//!   sums, bit for bit, with and without per-sample weights.

use embedding_kernels::formats::{self, PackedTable, RowWise};
use embedding_kernels::{reference, Bags, EmbeddingError};
use serde_json::Value;

fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/pytorch_quantized.json"
    );
    let text = std::fs::read_to_string(path).expect("the golden file is committed");
    serde_json::from_str(&text).expect("valid JSON")
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("a number"))
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    numbers(v)
        .into_iter()
        .map(|b| f32::from_bits(b as u32))
        .collect()
}

/// Bits equal, or both NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

const FORMATS: [(RowWise, &str); 3] = [
    (RowWise::Int8, "byte"),
    (RowWise::Int4, "nbit4"),
    (RowWise::Int2, "nbit2"),
];

#[test]
fn half_conversions_have_pytorchs_bits() {
    let golden = golden();
    for case in golden["cases"].as_array().unwrap() {
        let x = floats(&case["weight_f32_bits"]);
        let name = case["name"].as_str().unwrap();
        let f16 = formats::f16_to_f32(&formats::to_f16(&x));
        let want = numbers(&case["f16_bits"]);
        for (k, (&got, &w)) in f16.iter().zip(&want).enumerate() {
            let w = half::f16::from_bits(w as u16).to_f32();
            assert!(same(got, w), "{name} f16 value {k}: {got} vs {w}");
        }
        let bf16 = formats::bf16_to_f32(&formats::to_bf16(&x));
        for (k, (&got, &w)) in bf16.iter().zip(&numbers(&case["bf16_bits"])).enumerate() {
            let w = half::bf16::from_bits(w as u16).to_f32();
            assert!(same(got, w), "{name} bf16 value {k}: {got} vs {w}");
        }
    }
}

#[test]
fn packed_rows_have_pytorchs_bytes_and_refused_rows_are_garbage_there() {
    let golden = golden();
    let (mut compared, mut refused) = (0, 0);
    for case in golden["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let (rows, dim) = (
            case["rows"].as_u64().unwrap() as usize,
            case["dim"].as_u64().unwrap() as usize,
        );
        let x = floats(&case["weight_f32_bits"]);
        for (format, key) in FORMATS {
            let Some(theirs) = case[format!("{key}_prepack")].as_array() else {
                // PyTorch refuses the width (4 and 2 bits want multiples of
                // 2 and 4); this crate packs any width.
                assert!(case[format!("{key}_error")].is_string(), "{name} {key}");
                continue;
            };
            let theirs: Vec<u8> = theirs.iter().map(|b| b.as_u64().unwrap() as u8).collect();
            let their_unpack = floats(&case[format!("{key}_unpack_f32_bits")]);
            let row_bytes = format.row_bytes(dim).unwrap();
            assert_eq!(theirs.len(), rows * row_bytes, "{name} {key}: layout");
            for r in 0..rows {
                let row = &x[r * dim..(r + 1) * dim];
                let what = format!("{name} {key} row {r}");
                match format.prepack(row, dim) {
                    Ok(ours) => {
                        assert_eq!(ours, theirs[r * row_bytes..(r + 1) * row_bytes], "{what}");
                        compared += 1;
                    }
                    Err(EmbeddingError::NotFinite { .. }) => {
                        assert!(row.iter().any(|v| !v.is_finite()), "{what}");
                        refused += 1;
                    }
                    Err(EmbeddingError::RangeOverflow { .. }) => {
                        let back = &their_unpack[r * dim..(r + 1) * dim];
                        assert!(
                            row.iter().all(|v| v.is_finite())
                                && back.iter().any(|v| !v.is_finite()),
                            "{what}: PyTorch reads this row back as {back:?}"
                        );
                        refused += 1;
                    }
                    Err(e) => panic!("{what}: {e}"),
                }
            }
        }
    }
    assert!(
        compared > 500 && refused > 10,
        "compared {compared}, refused {refused}"
    );
}

#[test]
fn unpacking_pytorchs_bytes_gives_pytorchs_values() {
    let golden = golden();
    for case in golden["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let dim = case["dim"].as_u64().unwrap() as usize;
        for (format, key) in FORMATS {
            let Some(theirs) = case[format!("{key}_prepack")].as_array() else {
                continue;
            };
            let packed: Vec<u8> = theirs.iter().map(|b| b.as_u64().unwrap() as u8).collect();
            let want = floats(&case[format!("{key}_unpack_f32_bits")]);
            let mut out = vec![0.0; want.len()];
            format.dequantize(&packed, dim, &mut out).unwrap();
            for (k, (&got, &w)) in out.iter().zip(&want).enumerate() {
                assert!(same(got, w), "{name} {key} value {k}: {got} vs {w}");
            }
        }
    }
}

/// One set of golden bags over one of PyTorch's packed tables.
struct GoldenBags<'a> {
    what: String,
    table: PackedTable<'a>,
    ids: Vec<i64>,
    bags: Bags,
    weights: Option<Vec<f32>>,
    want: Vec<f32>,
}

/// Calls `check` on every set of golden bags that PyTorch summed, and
/// returns how many there were.
fn for_each_golden_bag_sum(check: impl Fn(&GoldenBags<'_>)) -> usize {
    let golden = golden();
    let mut count = 0;
    for case in golden["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let dim = case["dim"].as_u64().unwrap() as usize;
        for (format, key) in FORMATS {
            let Some(theirs) = case[format!("{key}_prepack")].as_array() else {
                continue;
            };
            let packed: Vec<u8> = theirs.iter().map(|b| b.as_u64().unwrap() as u8).collect();
            let table = PackedTable::new(format, dim, &packed).unwrap();
            for (k, bag) in case["bags"].as_array().unwrap().iter().enumerate() {
                if !bag[format!("{key}_sum_f32_bits")].is_array() {
                    continue;
                }
                let ids = numbers(&bag["indices"])
                    .into_iter()
                    .map(|i| i as i64)
                    .collect::<Vec<_>>();
                let offsets: Vec<i64> = numbers(&bag["offsets"])
                    .into_iter()
                    .map(|i| i as i64)
                    .collect();
                let last = bag["include_last_offset"].as_bool().unwrap();
                check(&GoldenBags {
                    what: format!("{name} {key} bag set {k}"),
                    table,
                    bags: Bags::from_offsets(&offsets, ids.len(), last).unwrap(),
                    ids,
                    weights: bag["per_sample_weights_bits"]
                        .as_array()
                        .map(|_| floats(&bag["per_sample_weights_bits"])),
                    want: floats(&bag[format!("{key}_sum_f32_bits")]),
                });
                count += 1;
            }
        }
    }
    count
}

/// `got` has `want`'s bits (NaN as NaN).
fn assert_same(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (v, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(same(g, w), "{what} value {v}: {g} vs {w}");
    }
}

#[test]
fn reference_bag_sums_have_pytorchs_bits() {
    let count = for_each_golden_bag_sum(|g| {
        let got =
            reference::packed_bag_sum(&g.table, &g.ids, &g.bags, g.weights.as_deref()).unwrap();
        assert_same(&g.what, &got, &g.want);
    });
    assert!(count > 50, "compared {count} bag sets");
}

#[test]
fn packed_bag_kernel_sums_have_pytorchs_bits() {
    use embedding_kernels::{table_bag_forward_with, Mode, Parallelism, Pooling};
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let count = for_each_golden_bag_sum(|g| {
        let pooling = Pooling {
            mode: Mode::Sum,
            per_sample_weights: g.weights.as_deref(),
            ..Pooling::default()
        };
        for par in [Parallelism::Serial, Parallelism::Rayon] {
            let mut out = vec![f32::NAN; g.want.len()];
            pool.install(|| {
                table_bag_forward_with(
                    par,
                    g.table.into(),
                    &g.ids,
                    &g.bags,
                    &pooling,
                    &mut out,
                    &mut [],
                )
            })
            .unwrap();
            assert_same(&format!("{} {par:?}", g.what), &out, &g.want);
        }
    });
    assert!(count > 50, "compared {count} bag sets");
}
