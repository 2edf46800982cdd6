//! The checks of the `formats` targets (`fuzz_targets/formats.rs`, whose
//! notes say what they cover, and `fuzz_targets/formats_u32.rs`): one
//! decoded [`Case`] run with the ids of one type. Each target runs one id
//! type, so that each binary compiles the kernels for one row type (the
//! bags and lookups pick the table format at run time, so every call site
//! compiles all of them): built side by side, the two take about half the
//! time of one target running both.
use case::{Case, Cut, Table, faulty};
use embedding_kernels::formats::{Format, OwnedTable, PackedTable, RowWise, TableRef};
use embedding_kernels::{
    Bags, EmbeddingError, Half, Mode, Operand, Parallelism, Pooling, bag_forward_with, gather_half,
    gather_half_with, reference, table_bag_forward, table_bag_forward_strided_with,
    table_bag_forward_with, table_gather, table_gather_with,
};
use embedding_kernels_fuzz::{Id, assert_bits_as, one_nan, pool};
use half::{bf16, f16};
use oracle::{
    decode_packed_row, expected_bag, expected_lookup, expected_owned_rows, expected_prepack,
    expected_rows, layout, round_trip_bound, scale_bias, value_rows, widen_half,
};

#[path = "case.rs"]
mod case;
#[path = "oracle.rs"]
mod oracle;

/// What every output element holds before a call: a quiet NaN with a
/// payload.
const CANARY: u32 = 0x7fc0_0bad;

/// The canary of a half output.
const HALF_CANARY: u16 = 0x7e5a;

/// What `max_indices` holds before a call; no winner is ever this.
const INDEX_CANARY: i64 = i64::MIN + 7;

/// Every way a `_with` call may use threads.
const PARS: [Parallelism; 3] = [Parallelism::Serial, Parallelism::Rayon, Parallelism::Auto];

/// How an output is held to its oracle's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Nans {
    /// Every bit: copies, exact decodes, and one call against another.
    Exact,
    /// Every bit, but any NaN matches any NaN: results of arithmetic in
    /// which two NaNs may meet (a packed row's NaN scale and NaN bias, a sum
    /// holding NaNs of two rows), whose payload depends on the operand order
    /// the compiler picks for a commutative operation.
    Any,
}

/// How a failure names a call: `f_with(par)`, or the plain `f`.
fn name(f: &str, par: Option<Parallelism>) -> String {
    match par {
        Some(par) => format!("{f}_with({par:?})"),
        None => f.to_string(),
    }
}

/// A half type's `to_bits` and `from_bits`.
type HalfBits<H> = (fn(H) -> u16, fn(u16) -> H);

impl Case {
    fn check<I: Id>(&self) {
        let ids: Vec<I> = self.ids.iter().map(|&v| I::wrap(v)).collect();
        let dim = self.dim;
        let expected = expected_rows(&self.table, dim);
        // The table decoded by hand, when it is one.
        let decoded: Option<Vec<f32>> = expected.as_ref().ok().map(|&rows| match &self.table {
            Table::Half { bf16, bits } => bits.iter().map(|&b| widen_half(b, *bf16)).collect(),
            Table::Packed { format, bytes } => {
                let mut out = Vec::with_capacity(rows * dim);
                if let Some(row_bytes) = layout(*format, dim).2 {
                    for row in bytes.chunks_exact(row_bytes) {
                        decode_packed_row(*format, dim, row, &mut out);
                    }
                }
                out
            }
        });
        let owned = self.check_owned(decoded.as_deref());
        let owned = owned.as_ref().map(OwnedTable::as_ref);
        match &self.table {
            Table::Half { bf16: false, bits } => {
                let values: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
                let table = TableRef::f16(&values, dim);
                self.check_constructor(&table, &expected);
                self.check_gather_half(&values, (f16::to_bits, f16::from_bits), &ids);
                self.check_table(table.ok(), owned, None, decoded.as_deref(), &ids);
            }
            Table::Half { bf16: true, bits } => {
                let values: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
                let table = TableRef::bf16(&values, dim);
                self.check_constructor(&table, &expected);
                self.check_gather_half(&values, (bf16::to_bits, bf16::from_bits), &ids);
                self.check_table(table.ok(), owned, None, decoded.as_deref(), &ids);
            }
            Table::Packed { format, bytes } => {
                let packed = PackedTable::new(*format, dim, bytes);
                let table = packed.clone().map(TableRef::packed);
                self.check_constructor(&table, &expected);
                if let Ok(p) = &packed {
                    assert_eq!(p.format(), *format);
                    assert_eq!(p.bytes().len(), bytes.len());
                }
                self.check_dequantize(*format, bytes, decoded.as_deref());
                let table = table.ok();
                self.check_table(table, owned, packed.ok(), decoded.as_deref(), &ids);
            }
        }
        self.check_prepack();
    }

    /// The constructor's result is the predicted one.
    fn check_constructor(
        &self,
        table: &Result<TableRef<'_>, EmbeddingError>,
        expected: &Result<usize, EmbeddingError>,
    ) {
        let got = table.as_ref().map(|t| (t.rows(), t.dim(), t.format()));
        let want = expected
            .as_ref()
            .map(|&rows| (rows, self.dim, self.table.format()));
        assert_eq!(got, want, "table constructor\n{}", self.summary());
    }

    /// `OwnedTable::from_le_bytes` as predicted, its bytes back, and its
    /// `f32`s the ones decoded by hand.
    fn check_owned(&self, decoded: Option<&[f32]>) -> Option<OwnedTable> {
        let (format, dim) = (self.table.format(), self.dim);
        let bytes = self.table.le_bytes();
        let owned = OwnedTable::from_le_bytes(format, dim, &bytes);
        let want = expected_owned_rows(&self.table, dim);
        assert_eq!(
            owned.as_ref().map(OwnedTable::rows),
            want.as_ref().copied(),
            "OwnedTable::from_le_bytes\n{}",
            self.summary()
        );
        let owned = owned.ok()?;
        assert_eq!((owned.format(), owned.dim()), (format, dim));
        assert_eq!(
            owned.to_le_bytes().unwrap(),
            bytes,
            "to_le_bytes\n{}",
            self.summary()
        );
        assert_eq!(owned.as_ref().rows(), owned.rows());
        if let Some(decoded) = decoded {
            let values = owned
                .to_f32()
                .unwrap_or_else(|e| panic!("to_f32: {e}\n{}", self.summary()));
            // A half widens exactly, signalling NaNs included (`bf16` by
            // its bits, as the lookup does); a packed value is arithmetic.
            let nans = match self.table.format() {
                Format::Bf16 | Format::F16 => Nans::Exact,
                _ => Nans::Any,
            };
            let want = decoded.to_vec();
            self.assert_bits("OwnedTable::to_f32", &values, "by hand", &want, nans);
        }
        Some(owned)
    }

    /// The lookups and the bags of one table.
    fn check_table<I: Id>(
        &self,
        table: Option<TableRef<'_>>,
        owned: Option<TableRef<'_>>,
        packed: Option<PackedTable<'_>>,
        decoded: Option<&[f32]>,
        ids: &[I],
    ) {
        let (Some(table), Some(decoded)) = (table, decoded) else {
            return;
        };
        self.check_lookup(table, owned, decoded, ids);
        self.check_bags(table, owned, packed, decoded, ids);
    }

    /// `table_gather(_with)` against the rows decoded by hand.
    fn check_lookup<I: Id>(
        &self,
        table: TableRef<'_>,
        owned: Option<TableRef<'_>>,
        decoded: &[f32],
        ids: &[I],
    ) {
        let (dim, rows) = (self.dim, table.rows());
        let out_len = faulty(ids.len().checked_mul(dim), self.faults[0]);
        let expected = expected_lookup(rows, dim, ids, out_len);
        let want: Vec<f32> = match expected {
            Ok(()) => ids
                .iter()
                .flat_map(|id| {
                    let r = id.to_i128() as usize;
                    decoded[r * dim..(r + 1) * dim].iter().copied()
                })
                .collect(),
            Err(_) => vec![f32::from_bits(CANARY); out_len],
        };
        let nans = match table.format().row_wise() {
            Some(_) => Nans::Any,
            None => Nans::Exact,
        };
        let mut first = None;
        let calls = PARS.map(Some).into_iter().chain([None, None]);
        for (k, par) in calls.enumerate() {
            let mut out = vec![f32::from_bits(CANARY); out_len];
            let result = match (par, k) {
                (Some(par), _) => table_gather_with(par, table, ids, &mut out),
                (None, 3) => table_gather(table, ids, &mut out),
                (None, _) => match owned {
                    Some(owned) => table_gather(owned, ids, &mut out),
                    None => continue,
                },
            };
            let what = match k {
                4 => "table_gather on OwnedTable::as_ref".to_string(),
                _ => name("table_gather", par),
            };
            assert_eq!(result, expected, "{what}\n{}", self.summary());
            self.assert_bits(&what, &out, "by hand", &want, nans);
            self.assert_same_as_first(&what, out, &mut first);
        }
    }

    /// `gather_half(_with)` (and the shape rule for its table): a bit copy
    /// of the rows.
    fn check_gather_half<H: Half, I: Id>(
        &self,
        table: &[H],
        (to_bits, from_bits): HalfBits<H>,
        ids: &[I],
    ) {
        let dim = self.dim;
        let out_len = faulty(ids.len().checked_mul(dim), self.faults[1]);
        let expected =
            value_rows(table.len(), dim).and_then(|rows| expected_lookup(rows, dim, ids, out_len));
        let want: Vec<u16> = match expected {
            Ok(()) => ids
                .iter()
                .flat_map(|id| {
                    let r = id.to_i128() as usize;
                    table[r * dim..(r + 1) * dim].iter().map(|&h| to_bits(h))
                })
                .collect(),
            Err(_) => vec![HALF_CANARY; out_len],
        };
        for par in PARS.map(Some).into_iter().chain([None]) {
            let mut out = vec![from_bits(HALF_CANARY); out_len];
            let result = match par {
                Some(par) => gather_half_with(par, table, dim, ids, &mut out),
                None => gather_half(table, dim, ids, &mut out),
            };
            let what = name("gather_half", par);
            assert_eq!(result, expected, "{what}\n{}", self.summary());
            let got: Vec<u16> = out.iter().map(|&h| to_bits(h)).collect();
            if let Some(i) = (0..out_len).find(|&i| got[i] != want[i]) {
                panic!(
                    "{what} differs at element {i}: {:#06x} vs {:#06x} by hand\n{}",
                    got[i],
                    want[i],
                    self.summary()
                );
            }
        }
    }

    /// `table_bag_forward(_with)` in the case's mode.
    fn check_bags<I: Id>(
        &self,
        table: TableRef<'_>,
        owned: Option<TableRef<'_>>,
        packed: Option<PackedTable<'_>>,
        decoded: &[f32],
        ids: &[I],
    ) {
        let (dim, rows, mode) = (self.dim, table.rows(), self.mode);
        let (bags, ids) = match &self.cut {
            Cut::Offsets {
                offsets,
                include_last,
                num_ids,
            } => (Bags::from_offsets(offsets, *num_ids, *include_last), ids),
            Cut::Fixed { count, size } => (
                Bags::fixed(*count, *size),
                &ids[..(count * size).min(ids.len())],
            ),
        };
        // Offsets errors are `Bags`' own (the bag target checks them).
        let Ok(bags) = bags else {
            return;
        };
        let weights = self.weights.as_ref().map(|(pool, fault)| {
            let len = ids.len().saturating_add_signed(*fault).min(pool.len());
            &pool[..len]
        });
        let pooling = Pooling {
            mode,
            per_sample_weights: weights,
            padding_idx: self.padding.row(rows, ids),
            scale_grad_by_freq: false,
        };
        let out_len = faulty(bags.len().checked_mul(dim), self.faults[3]);
        let indices_len = match mode {
            Mode::Max => faulty(bags.len().checked_mul(dim), self.faults[4]),
            _ => self.faults[4].unsigned_abs(),
        };
        let expected = expected_bag(rows, dim, ids, &bags, &pooling, out_len, indices_len);
        let (want, want_indices, oracle) = match packed {
            Some(packed) => {
                let (want, want_indices) = match expected {
                    Ok(()) => self.packed_bags(&packed, decoded, ids, &bags, &pooling, indices_len),
                    Err(_) => (
                        vec![f32::from_bits(CANARY); out_len],
                        vec![INDEX_CANARY; indices_len],
                    ),
                };
                (want, want_indices, "by hand")
            }
            // Half tables: `bag_forward` on the table widened by hand, which
            // must also fail where the call under test fails.
            None => {
                let mut out = vec![f32::from_bits(CANARY); out_len];
                let mut indices = vec![INDEX_CANARY; indices_len];
                let (o, m) = (&mut out[..], &mut indices[..]);
                let serial = Parallelism::Serial;
                let result = bag_forward_with(serial, decoded, dim, ids, &bags, &pooling, o, m);
                let oracle = "bag_forward on the widened table";
                assert_eq!(result, expected, "{oracle}\n{}", self.summary());
                (out, indices, oracle)
            }
        };
        let nans = match (packed, mode) {
            (None, Mode::Max) => Nans::Exact,
            _ => Nans::Any,
        };
        let mut first = None;
        let calls = PARS.map(Some).into_iter().chain([None, None]);
        for (k, par) in calls.enumerate() {
            let mut out = vec![f32::from_bits(CANARY); out_len];
            let mut indices = vec![INDEX_CANARY; indices_len];
            let (o, m) = (&mut out[..], &mut indices[..]);
            let result = match (par, k) {
                (Some(par), _) => table_bag_forward_with(par, table, ids, &bags, &pooling, o, m),
                (None, 3) => table_bag_forward(table, ids, &bags, &pooling, o, m),
                (None, _) => match owned {
                    Some(owned) => table_bag_forward(owned, ids, &bags, &pooling, o, m),
                    None => continue,
                },
            };
            let what = match k {
                4 => "table_bag_forward on OwnedTable::as_ref".to_string(),
                _ => name("table_bag_forward", par),
            };
            assert_eq!(result, expected, "{what}\n{}", self.summary());
            self.assert_bits(&what, &out, oracle, &want, nans);
            self.assert_same_as_first(&what, out, &mut first);
            if result.is_err() || mode != Mode::Max {
                assert!(
                    indices.iter().all(|&i| i == INDEX_CANARY),
                    "{what} wrote max_indices ({result:?})\n{}",
                    self.summary()
                );
            } else {
                assert_eq!(
                    indices,
                    want_indices,
                    "{what}: max_indices\n{}",
                    self.summary()
                );
            }
        }
        let apart = (expected, &want[..], nans);
        self.check_bags_apart(table, ids, &bags, &pooling, out_len, indices_len, apart);
    }

    /// `table_bag_forward_strided_with`, rows 1 to 4 values wider than a
    /// row apart, where the case's output length is right: the same result,
    /// each row where the oracle has it, the values between rows untouched.
    // `check_bags`' call and what it found.
    #[allow(clippy::too_many_arguments)]
    fn check_bags_apart<I: Id>(
        &self,
        table: TableRef<'_>,
        ids: &[I],
        bags: &Bags,
        pooling: &Pooling<'_>,
        out_len: usize,
        indices_len: usize,
        (expected, want, nans): (Result<(), EmbeddingError>, &[f32], Nans),
    ) {
        let dim = self.dim;
        if dim == 0 || Some(out_len) != bags.len().checked_mul(dim) {
            return;
        }
        // The case's output fits in memory, so rows a few values wider do
        // unless `dim` is near `usize::MAX` (a case of no bags).
        let Some(stride) = dim.checked_add(1 + self.faults[3].unsigned_abs() % 4) else {
            return;
        };
        let len = match bags.len() {
            0 => 0,
            n => (n - 1) * stride + dim,
        };
        let mut out = vec![f32::from_bits(CANARY); len];
        let mut indices = vec![INDEX_CANARY; indices_len];
        let (o, m) = (&mut out[..], &mut indices[..]);
        let par = Parallelism::Auto;
        let result = table_bag_forward_strided_with(par, table, ids, bags, pooling, o, stride, m);
        let what = "table_bag_forward_strided_with";
        assert_eq!(result, expected, "{what}\n{}", self.summary());
        if result.is_err() {
            assert!(
                out.iter().all(|v| v.to_bits() == CANARY),
                "{what} wrote on an error\n{}",
                self.summary()
            );
            return;
        }
        let mut rows = Vec::with_capacity(out_len);
        for (b, row) in out.chunks(stride).enumerate() {
            rows.extend_from_slice(&row[..dim]);
            let between = if b + 1 < bags.len() {
                &row[dim..]
            } else {
                &[][..]
            };
            assert!(
                between.iter().all(|v| v.to_bits() == CANARY),
                "{what} wrote between rows\n{}",
                self.summary()
            );
        }
        self.assert_bits(what, &rows, "the oracle", want, nans);
    }

    /// The bags of a packed table by hand: sum by
    /// `reference::packed_bag_sum` over the kept ids, mean that sum over the
    /// count, max the first largest decoded value of each column.
    fn packed_bags<I: Id>(
        &self,
        packed: &PackedTable<'_>,
        decoded: &[f32],
        ids: &[I],
        bags: &Bags,
        pooling: &Pooling<'_>,
        indices_len: usize,
    ) -> (Vec<f32>, Vec<i64>) {
        let dim = self.dim;
        let kept: Vec<Vec<usize>> = bags
            .iter()
            .map(|bag| {
                bag.filter(|&p| pooling.padding_idx != Some(ids[p].to_i128() as usize))
                    .collect()
            })
            .collect();
        if pooling.mode == Mode::Max {
            let mut out = vec![0.0f32; bags.len() * dim];
            let mut indices = vec![-1i64; indices_len];
            for (b, positions) in kept.iter().enumerate() {
                for c in 0..dim {
                    let mut best: Option<(f32, usize)> = None;
                    for &p in positions {
                        let r = ids[p].to_i128() as usize;
                        let v = decoded[r * dim + c];
                        // Strictly greater replaces: ties keep the earlier
                        // id, and a NaN neither wins nor is replaced.
                        if best.is_none_or(|(x, _)| v > x) {
                            best = Some((v, r));
                        }
                    }
                    if let Some((v, r)) = best {
                        out[b * dim + c] = v;
                        indices[b * dim + c] = r as i64;
                    }
                }
            }
            return (out, indices);
        }
        // `packed_bag_sum` knows no `padding_idx`: give it the kept ids
        // (and their weights) in their bags.
        let kept_ids: Vec<I> = kept.iter().flatten().map(|&p| ids[p]).collect();
        let kept_weights: Option<Vec<f32>> = pooling
            .per_sample_weights
            .map(|w| kept.iter().flatten().map(|&p| w[p]).collect());
        let mut offsets = vec![0usize];
        for positions in &kept {
            offsets.push(offsets.last().copied().unwrap_or(0) + positions.len());
        }
        let kept_bags = Bags::from_offsets(&offsets, kept_ids.len(), true)
            .unwrap_or_else(|e| panic!("the kept bags: {e}\n{}", self.summary()));
        let mut sum =
            reference::packed_bag_sum(packed, &kept_ids, &kept_bags, kept_weights.as_deref())
                .unwrap_or_else(|e| panic!("packed_bag_sum: {e}\n{}", self.summary()));
        if pooling.mode == Mode::Mean {
            for (b, positions) in kept.iter().enumerate() {
                if !positions.is_empty() {
                    let n = positions.len() as f32;
                    for v in &mut sum[b * dim..(b + 1) * dim] {
                        *v /= n;
                    }
                }
            }
        }
        (sum, vec![INDEX_CANARY; indices_len])
    }

    /// `RowWise::dequantize(_with)` against the table decoded by hand.
    fn check_dequantize(&self, format: RowWise, bytes: &[u8], decoded: Option<&[f32]>) {
        let dim = self.dim;
        let rows = expected_rows(&self.table, dim);
        let out_len = faulty(
            rows.as_ref().ok().and_then(|&rows| rows.checked_mul(dim)),
            self.faults[2],
        );
        let expected = rows.and_then(|rows| {
            let len = rows
                .checked_mul(dim)
                .ok_or(EmbeddingError::SizeOverflow { count: rows, dim })?;
            match len == out_len {
                true => Ok(()),
                false => Err(EmbeddingError::LengthMismatch {
                    operand: Operand::Output,
                    expected: len,
                    got: out_len,
                }),
            }
        });
        let want = match (&expected, decoded) {
            (Ok(()), Some(decoded)) => decoded.to_vec(),
            _ => vec![f32::from_bits(CANARY); out_len],
        };
        let mut first = None;
        for par in PARS.map(Some).into_iter().chain([None]) {
            let mut out = vec![f32::from_bits(CANARY); out_len];
            let result = match par {
                Some(par) => format.dequantize_with(par, bytes, dim, &mut out),
                None => format.dequantize(bytes, dim, &mut out),
            };
            let what = name(&format!("{format:?}.dequantize"), par);
            assert_eq!(result, expected, "{what}\n{}", self.summary());
            self.assert_bits(&what, &out, "by hand", &want, Nans::Any);
            self.assert_same_as_first(&what, out, &mut first);
        }
    }

    /// `RowWise::prepack(_with)` and `OwnedTable::from_f32`: the predicted
    /// result, the same bytes on every thread count, and the values back
    /// within half a level.
    fn check_prepack(&self) {
        let (format, x, dim) = (self.prepack_format, &self.prepack_input[..], self.dim);
        let expected = expected_prepack(format, x, dim);
        let mut first: Option<Vec<u8>> = None;
        for par in PARS.map(Some).into_iter().chain([None]) {
            let result = match par {
                Some(par) => format.prepack_with(par, x, dim),
                None => format.prepack(x, dim),
            };
            let what = name(&format!("{format:?}.prepack"), par);
            assert_eq!(
                result.as_ref().map(Vec::len),
                expected.as_ref().copied(),
                "{what}\n{}",
                self.summary()
            );
            if let Ok(bytes) = result {
                match &first {
                    Some(first) => assert!(
                        *first == bytes,
                        "{what} packs other bytes than Serial\n{}",
                        self.summary()
                    ),
                    None => first = Some(bytes),
                }
            }
        }
        let owned = OwnedTable::from_f32(x, dim, format.into());
        assert_eq!(
            owned
                .as_ref()
                .ok()
                .map(|t| t.to_le_bytes().expect("the bytes of a small table")),
            first,
            "OwnedTable::from_f32\n{}",
            self.summary()
        );
        if let Some(packed) = first {
            self.check_round_trip(format, x, &packed);
        }
    }

    /// Each prepacked value read back within half a level of the input; see
    /// [`round_trip_bound`].
    fn check_round_trip(&self, format: RowWise, x: &[f32], packed: &[u8]) {
        let dim = self.dim;
        let mut y = vec![f32::from_bits(CANARY); x.len()];
        format
            .dequantize(packed, dim, &mut y)
            .unwrap_or_else(|e| panic!("dequantize after prepack: {e}\n{}", self.summary()));
        let Some(row_bytes) = layout(format, dim).2 else {
            return;
        };
        if dim == 0 {
            return;
        }
        for (r, (row, (xs, ys))) in packed
            .chunks_exact(row_bytes)
            .zip(x.chunks_exact(dim).zip(y.chunks_exact(dim)))
            .enumerate()
        {
            let (scale, bias) = scale_bias(format, dim, row);
            for (c, (&v, &got)) in xs.iter().zip(ys).enumerate() {
                let bound = round_trip_bound(format, xs, scale, bias, v);
                let error = (f64::from(got) - f64::from(v)).abs();
                assert!(
                    error <= bound,
                    "{format:?} row {r} column {c}: {v:e} ({:#010x}) reads back as {got:e} ({:#010x}), off by {error:e} > {bound:e}; scale {scale:e}, bias {bias:e}\n{}",
                    v.to_bits(),
                    got.to_bits(),
                    self.summary()
                );
            }
        }
    }

    /// Asserts that `got` and `want` (what `against` gives) hold the same
    /// bits, up to `nans`, naming the first difference.
    fn assert_bits(&self, what: &str, got: &[f32], against: &str, want: &[f32], nans: Nans) {
        let canonical: fn(u32) -> u32 = match nans {
            Nans::Exact => |bits| bits,
            Nans::Any => one_nan,
        };
        assert_bits_as(what, got, against, want, canonical, self.dim, || {
            self.summary()
        });
    }

    /// Asserts that a call gave the bits of the first call of its kind
    /// (another `Parallelism`, the plain form), NaN payloads included: the
    /// same code on other threads; keeps the first.
    fn assert_same_as_first(&self, what: &str, got: Vec<f32>, first: &mut Option<Vec<f32>>) {
        match first {
            Some(first) => self.assert_bits(what, &got, "the first call", first, Nans::Exact),
            None => *first = Some(got),
        }
    }
}

/// Decodes `data` into a case and runs its checks with ids of type `I`,
/// on a pool of the case's thread count.
pub(crate) fn run<I: Id>(data: &[u8]) {
    let mut case = Case::decode(data);
    case.id_type = I::NAME;
    pool(case.threads).install(|| case.check::<I>());
}
