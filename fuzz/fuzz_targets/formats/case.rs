//! From the fuzzer's bytes to one [`Case`] of the `formats` target (the
//! target's notes say what the header picks): the header read with
//! [`Unstructured`], the table's bytes after it, the rest from a SplitMix64
//! stream seeded by the header.

use super::oracle::layout;
use arbitrary::Unstructured;
use embedding_kernels::Mode;
use embedding_kernels::formats::{Format, RowWise};
use embedding_kernels_fuzz::{Padding, SplitMix64};
use half::{bf16, f16};

/// The widest row of an ordinary case.
const MAX_DIM: usize = 70;

/// Row counts of the many-rows mode: the parallel packer and unpacker split
/// at 256 rows a task.
const MANY_ROWS: [usize; 8] = [255, 256, 257, 300, 511, 512, 513, 600];

/// Widths for which any non-empty output overflows; the table is empty.
const HUGE_DIMS: [usize; 4] = [usize::MAX, usize::MAX / 2 + 1, 1 << 62, 1 << 32];

/// Scales and biases of the tame 8-bit tables, as `f32` bits.
const SPECIAL_F32: [u32; 13] = [
    0x0000_0000, // +0
    0x8000_0000, // -0
    0x7f80_0000, // inf
    0xff80_0000, // -inf
    0x7fc0_0000, // NaN
    0x7f80_0001, // signalling NaN
    0xffc0_1234, // negative NaN with a payload
    0x7f7f_ffff, // f32::MAX
    0xff7f_ffff, // f32::MIN
    0x0000_0001, // the smallest subnormal
    0x0080_0000, // f32::MIN_POSITIVE
    0x7149_f2ca, // 1e30
    0x8000_0010, // a negative subnormal
];

/// Scales and biases of the tame 4- and 2-bit tables, as `f16` bits.
const SPECIAL_F16: [u16; 13] = [
    0x0000, // +0
    0x8000, // -0
    0x7c00, // inf
    0xfc00, // -inf
    0x7e00, // NaN
    0x7c01, // signalling NaN
    0xfe12, // negative NaN with a payload
    0x7bff, // 65504, the largest f16
    0xfbff, // -65504
    0x0001, // the smallest subnormal
    0x8001, // its negative
    0x0400, // the smallest normal
    0x3c00, // 1
];

/// Values of the prepack input's specials fill.
const SPECIAL_VALUES: [f32; 16] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    f32::MAX,
    f32::MIN,
    f32::MIN_POSITIVE,
    1e-45, // the smallest subnormal
    65504.0,
    65520.0, // rounds to an infinite f16
    -65520.0,
    6e-8, // about the smallest f16 subnormal
    1e-8,
    1e30,
    0.1,
];

/// Reads the header; past the end of the bytes every read is 0.
struct Decoder<'a>(Unstructured<'a>);

impl Decoder<'_> {
    fn byte(&mut self) -> u8 {
        self.0.arbitrary().unwrap_or(0)
    }

    fn u64(&mut self) -> u64 {
        self.0.arbitrary().unwrap_or(0)
    }

    /// A number below `n` (at least 1).
    fn below(&mut self, n: usize) -> usize {
        self.0.int_in_range(0..=n - 1).unwrap_or(0)
    }

    /// A nonzero length change of at most 16 either way.
    fn delta(&mut self) -> isize {
        match self.below(32) as isize - 16 {
            0 => 1,
            d => d,
        }
    }

    /// A length fault: none most of the time, else a [`Decoder::delta`].
    fn fault(&mut self) -> isize {
        match self.below(8) {
            0..=5 => 0,
            _ => self.delta(),
        }
    }

    /// `len` bytes: the rest of the input first, then the stream.
    fn bytes(&mut self, len: usize, rng: &mut SplitMix64) -> Vec<u8> {
        let take = len.min(self.0.len());
        let mut out = self.0.bytes(take).unwrap_or(&[]).to_vec();
        while out.len() < len {
            let word = rng.next_u64().to_le_bytes();
            let more = (len - out.len()).min(8);
            out.extend_from_slice(&word[..more]);
        }
        out
    }
}

/// The longest output a case allocates (a huge `dim` times a few ids
/// does not overflow, but is not allocated either).
const MAX_OUT: usize = 1 << 24;

/// The output length for a call that wants `len` values: `len` moved by
/// `fault`; with no length (it overflowed) or one past [`MAX_OUT`], a small
/// wrong one.
pub(crate) fn faulty(len: Option<usize>, fault: isize) -> usize {
    match len {
        Some(len) if len <= MAX_OUT => len.saturating_add_signed(fault),
        _ => fault.unsigned_abs() % 4,
    }
}

/// A table as drawn: the bits of its halves, or its packed bytes.
#[derive(Debug)]
pub(crate) enum Table {
    Half { bf16: bool, bits: Vec<u16> },
    Packed { format: RowWise, bytes: Vec<u8> },
}

impl Table {
    pub(crate) fn format(&self) -> Format {
        match self {
            Table::Half { bf16: false, .. } => Format::F16,
            Table::Half { bf16: true, .. } => Format::Bf16,
            Table::Packed { format, .. } => (*format).into(),
        }
    }

    /// Its little-endian bytes, as `OwnedTable::from_le_bytes` takes them.
    pub(crate) fn le_bytes(&self) -> Vec<u8> {
        match self {
            Table::Half { bits, .. } => bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
            Table::Packed { bytes, .. } => bytes.clone(),
        }
    }

    /// Its length in values (half) or bytes (packed).
    pub(crate) fn len(&self) -> usize {
        match self {
            Table::Half { bits, .. } => bits.len(),
            Table::Packed { bytes, .. } => bytes.len(),
        }
    }
}

/// How the ids are cut into bags.
#[derive(Clone, Debug)]
pub(crate) enum Cut {
    /// `Bags::from_offsets(offsets, num_ids, include_last)` over every id.
    Offsets {
        offsets: Vec<i64>,
        include_last: bool,
        num_ids: usize,
    },
    /// `Bags::fixed(count, size)` over the first `count × size` ids.
    Fixed { count: usize, size: usize },
}

/// How the prepack input's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// `k / 8`, `k` in -128..128.
    Eighths,
    /// `k / 8 × 2^e`, `e` in -20..=20.
    Wide,
    /// Wide, with one value in 16 from [`SPECIAL_VALUES`].
    Specials,
    /// Raw bits (one in 256 not finite).
    Bits,
    /// Close to one value of the case: rows whose range is far below the
    /// value, where the `f16` bias and scale round.
    Narrow,
    /// `k × 2^e`, `e` in 100..=127: ranges that overflow.
    Huge,
    /// `k × 2^e`, `e` in -149..=-100: subnormals and the `f16` scale's
    /// underflow.
    Tiny,
}

/// One case, decoded from the fuzzer's bytes.
pub(crate) struct Case {
    pub(crate) dim: usize,
    /// The row count the table was drawn for (a fault may change it).
    rows: usize,
    pub(crate) threads: usize,
    /// The ids' type as the header chose it (`i64` or `u32`); a target
    /// that runs one type sets its own.
    pub(crate) id_type: &'static str,
    /// The ids as the caller meant them, cast to the id type with `as`.
    pub(crate) ids: Vec<i128>,
    pub(crate) table: Table,
    pub(crate) mode: Mode,
    pub(crate) cut: Cut,
    /// Weights to take a prefix from, and the prefix length's fault.
    pub(crate) weights: Option<(Vec<f32>, isize)>,
    pub(crate) padding: Padding,
    /// Length faults of the lookup's, `gather_half`'s, `dequantize`'s and the
    /// bag's outputs, and of `max_indices`.
    pub(crate) faults: [isize; 5],
    pub(crate) prepack_format: RowWise,
    pub(crate) prepack_input: Vec<f32>,
}

impl Case {
    pub(crate) fn decode(data: &[u8]) -> Case {
        let d = &mut Decoder(Unstructured::new(data));
        // An all-zero header: f16, dim 0, no rows, two threads, no ids.
        let format = [
            Format::F16,
            Format::Bf16,
            Format::Int8,
            Format::Int4,
            Format::Int2,
        ][d.below(5)];
        let mut dim = usize::from(d.byte()) % (MAX_DIM + 1);
        let rows = match d.byte() {
            b @ 0..=0xef => usize::from(b) % 65,
            b => MANY_ROWS[usize::from(b % 8)],
        };
        let threads = [2, 1, 3, 4][d.below(4)];
        // Read even though each target runs its own id type, so that every
        // later field, and every committed seed, decodes as before.
        let id_type = ["i64", "u32"][d.below(2)];
        let n = match d.below(4) {
            0 => d.below(4),
            1 => d.below(17),
            2 => d.below(301),
            _ => 1024 + d.below(1500),
        };
        let plants: Vec<(u64, u8, u64)> = (0..[0, 0, 1, 1, 2, 4][d.below(6)])
            .map(|_| (d.u64(), d.byte(), d.u64()))
            .collect();
        let pattern = d.below(4);
        let source = d.below(4);
        let table_fault = match d.below(16) {
            0..=12 => 0,
            13 | 14 => d.delta(),
            _ => {
                dim = HUGE_DIMS[d.below(HUGE_DIMS.len())];
                0
            }
        };
        let huge = dim > MAX_DIM;
        let mode = [Mode::Sum, Mode::Mean, Mode::Max][d.below(3)];
        let fixed = d.below(8) == 7;
        let count_byte = d.byte();
        let include_last = d.below(2) == 1;
        let offset_fault = (d.below(16), d.byte(), d.u64());
        let num_ids_fault = d.below(16);
        let weights = match d.below(8) {
            0..=3 => None,
            4..=6 => Some(0),
            _ => Some(d.delta()),
        };
        let weight_fill = d.below(3);
        let padding = match d.below(8) {
            0..=3 => Padding::None,
            4 | 5 => Padding::IdAt(d.byte()),
            6 => Padding::Last,
            _ => Padding::Bad(d.below(2) == 1),
        };
        let faults = [d.fault(), d.fault(), d.fault(), d.fault(), d.fault()];
        let prepack_format = match format.row_wise() {
            Some(f) if d.below(4) != 0 => f,
            _ => [RowWise::Int8, RowWise::Int4, RowWise::Int2][d.below(3)],
        };
        let prepack_rows = match d.byte() {
            b @ 0..=0xef => usize::from(b) % 33,
            b => MANY_ROWS[usize::from(b % 8)],
        };
        let fill = [
            Fill::Wide,
            Fill::Eighths,
            Fill::Specials,
            Fill::Bits,
            Fill::Narrow,
            Fill::Huge,
            Fill::Tiny,
        ][d.below(7)];
        let prepack_fault = d.fault();
        let seed = d.u64();
        let rng = &mut SplitMix64(seed);

        let ids = draw_ids(n, rows, pattern, &plants, rng);
        let prepack_len = match huge {
            true => 0,
            false => (prepack_rows * dim).saturating_add_signed(prepack_fault),
        };
        let base = draw_value(rng, Fill::Wide, 0.0);
        let prepack_input: Vec<f32> = (0..prepack_len)
            .map(|_| draw_value(rng, fill, base))
            .collect();
        let table = draw_table(
            d,
            rng,
            format,
            dim,
            rows,
            source,
            table_fault,
            &prepack_input,
        );
        let cut = draw_cut(
            n,
            fixed,
            count_byte,
            include_last,
            offset_fault,
            num_ids_fault,
            rng,
        );
        let weights = weights.map(|fault| {
            let pool = (0..n + 16).map(|_| draw_weight(rng, weight_fill)).collect();
            (pool, fault)
        });
        Case {
            dim,
            rows,
            threads,
            id_type,
            ids,
            table,
            mode,
            cut,
            weights,
            padding,
            faults,
            prepack_format,
            prepack_input,
        }
    }

    /// A one-line summary for failure messages (rerun the input for more).
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} table of {} (values or bytes), dim {}, drawn for {} rows; {} ids of type {} (first {:?}); {} threads; {:?}, {:?}, weights {:?}, padding {:?}, length faults {:?}; prepack {:?} of {} values",
            self.table.format(),
            self.table.len(),
            self.dim,
            self.rows,
            self.ids.len(),
            self.id_type,
            &self.ids[..self.ids.len().min(8)],
            self.threads,
            self.mode,
            self.cut,
            self.weights.as_ref().map(|(_, fault)| fault),
            self.padding,
            self.faults,
            self.prepack_format,
            self.prepack_input.len(),
        )
    }
}

/// `n` ids: valid rows drawn by `pattern`, then the planted ones.
fn draw_ids(
    n: usize,
    rows: usize,
    pattern: usize,
    plants: &[(u64, u8, u64)],
    rng: &mut SplitMix64,
) -> Vec<i128> {
    let hot = rng.below(rows as u64);
    let mut ids: Vec<i128> = (0..n)
        .map(|i| {
            i128::from(match pattern {
                0 | 1 => rng.below(rows as u64),
                2 => hot,
                _ => i as u64 % rows.max(1) as u64,
            })
        })
        .collect();
    if n > 0 {
        for &(at, kind, raw) in plants {
            let rows = rows as i128;
            ids[(at % n as u64) as usize] = match kind % 9 {
                0 => rows - 1,
                1 => rows,
                2 => rows + 1 + i128::from(raw as u8),
                3 => -1,
                4 => i128::from(i64::MIN),
                5 => i128::from(i64::MAX),
                6 => i128::from(u32::MAX),
                7 => 1 << 32,
                _ => i128::from(raw as i64),
            };
        }
    }
    ids
}

/// One value of the prepack input.
fn draw_value(rng: &mut SplitMix64, fill: Fill, base: f32) -> f32 {
    let r = rng.next_u64();
    let k = (r % 256) as i32 - 128;
    let pow2 = |e: i32| 2f32.powi(e);
    let wide = k as f32 / 8.0 * pow2(((r >> 8) % 41) as i32 - 20);
    match fill {
        Fill::Eighths => k as f32 / 8.0,
        Fill::Wide => wide,
        Fill::Specials if (r >> 16).is_multiple_of(16) => {
            SPECIAL_VALUES[((r >> 20) % SPECIAL_VALUES.len() as u64) as usize]
        }
        Fill::Specials => wide,
        Fill::Bits => f32::from_bits((r >> 32) as u32),
        Fill::Narrow => base * (1.0 + k as f32 * pow2(-18)),
        Fill::Huge => k as f32 * pow2(100 + ((r >> 8) % 21) as i32),
        Fill::Tiny => k as f32 * f32::from_bits(1) * pow2(((r >> 8) % 50) as i32),
    }
}

/// One per-sample weight: tame, from the specials, or raw bits.
fn draw_weight(rng: &mut SplitMix64, fill: usize) -> f32 {
    let r = rng.next_u64();
    match fill {
        0 => ((r % 255) as i32 - 127) as f32 / 8.0,
        1 if r.is_multiple_of(8) => f32::from_bits(SPECIAL_F32[((r >> 8) % 13) as usize]),
        1 => ((r % 255) as i32 - 127) as f32 / 16.0,
        _ => f32::from_bits((r >> 32) as u32),
    }
}

/// The table of a case: its bytes from the input (raw), tame codes with
/// scales and biases from the specials, or the prepack input (packed, or
/// rounded to halves).
#[allow(clippy::too_many_arguments)]
fn draw_table(
    d: &mut Decoder<'_>,
    rng: &mut SplitMix64,
    format: Format,
    dim: usize,
    rows: usize,
    source: usize,
    fault: isize,
    x: &[f32],
) -> Table {
    let huge = dim > MAX_DIM;
    match format.row_wise() {
        None => {
            let is_bf16 = format == Format::Bf16;
            let bits: Vec<u16> = match source {
                _ if huge => Vec::new(),
                3 if is_bf16 => x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect(),
                3 => x.iter().map(|&v| f16::from_f32(v).to_bits()).collect(),
                _ => {
                    let len = (rows * dim).saturating_add_signed(fault);
                    let raw = d.bytes(len * 2, rng);
                    let halves = raw
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]));
                    match source {
                        // Tame: no NaN or infinity (the top exponent bit
                        // cleared where the exponent is all ones).
                        2 => halves
                            .map(|h| {
                                let top = if is_bf16 { 0x7f80 } else { 0x7c00 };
                                if h & top == top {
                                    h & !(top & !(top >> 1))
                                } else {
                                    h
                                }
                            })
                            .collect(),
                        _ => halves.collect(),
                    }
                }
            };
            Table::Half {
                bf16: is_bf16,
                bits,
            }
        }
        Some(packing) => {
            let (bits, code_bytes, row_bytes) = layout(packing, dim);
            let bytes = match (source, row_bytes) {
                _ if huge => Vec::new(),
                (3, _) => packing
                    .prepack(x, dim)
                    .unwrap_or_else(|_| d.bytes(rows * row_bytes.unwrap_or(0), rng)),
                (_, None) => Vec::new(),
                (2, Some(row_bytes)) => {
                    let mut bytes = d.bytes(rows * row_bytes, rng);
                    for row in bytes.chunks_exact_mut(row_bytes) {
                        let tail = &mut row[code_bytes..];
                        for half in 0..2 {
                            let r = rng.next_u64();
                            let special = r.is_multiple_of(4);
                            let tame = ((r >> 8) % 255) as f32 / 64.0 - 2.0;
                            if bits == 8 {
                                let v = match special {
                                    true => SPECIAL_F32[((r >> 16) % 13) as usize],
                                    false => tame.to_bits(),
                                };
                                tail[half * 4..half * 4 + 4].copy_from_slice(&v.to_le_bytes());
                            } else {
                                let v = match special {
                                    true => SPECIAL_F16[((r >> 16) % 13) as usize],
                                    false => f16::from_f32(tame).to_bits(),
                                };
                                tail[half * 2..half * 2 + 2].copy_from_slice(&v.to_le_bytes());
                            }
                        }
                    }
                    bytes
                }
                (_, Some(row_bytes)) => {
                    d.bytes((rows * row_bytes).saturating_add_signed(fault), rng)
                }
            };
            Table::Packed {
                format: packing,
                bytes,
            }
        }
    }
}

/// The bag cut of a case of `n` ids: sorted offsets (or a fixed shape),
/// with a planted fault sometimes.
fn draw_cut(
    n: usize,
    fixed: bool,
    count_byte: u8,
    include_last: bool,
    (fault, at, raw): (usize, u8, u64),
    num_ids_fault: usize,
    rng: &mut SplitMix64,
) -> Cut {
    let count = match count_byte {
        c @ 0xf0.. => 1 + usize::from(c - 0xf0) * 40,
        c => usize::from(c % 65),
    };
    if fixed {
        let size = count % 9;
        let count = match size {
            0 => count % 4,
            _ => (n / size).min(600),
        };
        return Cut::Fixed { count, size };
    }
    let mut offsets: Vec<i64> = (0..count).map(|_| rng.below(n as u64 + 1) as i64).collect();
    offsets.sort_unstable();
    if let Some(first) = offsets.first_mut() {
        *first = 0;
    }
    if include_last && !offsets.is_empty() {
        let last = *offsets.last().unwrap_or(&0);
        offsets.push(last + rng.below(n as u64 - last as u64 + 1) as i64);
    }
    if !offsets.is_empty() {
        let at = usize::from(at) % offsets.len();
        match fault {
            12 => offsets[at] = -1 - (raw % 3) as i64,
            13 => offsets[at] = n as i64 + 1 + (raw % 3) as i64,
            14 => offsets[at] = [i64::MIN, i64::MAX, raw as i64][(raw % 3) as usize],
            15 if at > 0 => offsets[at] = offsets[at - 1] - 1,
            15 => offsets[0] = 1,
            _ => {}
        }
    }
    let num_ids = match num_ids_fault {
        15 => n + 1,
        14 => n.saturating_sub(1),
        _ => n,
    };
    Cut::Offsets {
        offsets,
        include_last,
        num_ids,
    }
}
