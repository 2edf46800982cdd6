//! Checks `gather_scaled` (plain, `gather_scaled_with(Serial | Rayon |
//! Auto)` and the scalar baseline), on 1 to 4 threads, against the one-hot
//! `reference::gather_scaled`: the same `Ok` or error, the same bits in
//! every output element, and the output untouched on an error; outputs past
//! 8 MiB run split across the pool. The table holds no NaN (so no two
//! NaN payloads ever meet in one multiplication); the scale may be
//! anything, NaN, ±inf, ±0 and subnormals included.
#![no_main]

use embedding_kernels::reference::loops;
use embedding_kernels::{EmbeddingError, gather_scaled, gather_scaled_with, reference};
use embedding_kernels_fuzz::{Agreement, Call, Case, Id, Target, Values, Writes, run};
use libfuzzer_sys::fuzz_target;

struct GatherScaled;

impl Target for GatherScaled {
    const TABLE: Values = Values::NoNan;
    const PER_ID: Values = Values::AnyBits;
    const WRITES: Writes = Writes::PerId;
    const AGREEMENT: Agreement = Agreement::Exact;

    fn call<I: Id>(case: &Case<I>, call: Call, out: &mut [f32]) -> Result<(), EmbeddingError> {
        let (table, dim, ids, scale) = (&case.table[..], case.dim, &case.ids[..], case.scale);
        match call {
            Call::Plain => gather_scaled(table, dim, ids, scale, out),
            Call::With(par) => gather_scaled_with(par, table, dim, ids, scale, out),
            Call::Scalar => loops::gather_scaled(table, dim, ids, scale, out),
            Call::Reference => reference::gather_scaled(table, dim, ids, scale, out),
        }
    }
}

fuzz_target!(|data: &[u8]| run::<GatherScaled>(data));
