//! Checks `gather` (plain, `gather_with(Serial | Rayon | Auto)` and the
//! scalar baseline), on 1 to 4 threads, against the one-hot
//! `reference::gather`: the same `Ok` or error, the same bits in every
//! output element, and the output untouched on an error; outputs past 8 MiB
//! run split across the pool. The table holds any bit pattern,
//! signalling NaNs included; the reference computes `-0.0 + 1.0 × x`, which
//! quiets those, so against it they count as their quiet selves, while on
//! success every element must also equal a bit copy of its table row.
#![no_main]

use embedding_kernels::reference::loops;
use embedding_kernels::{EmbeddingError, gather, gather_with, reference};
use embedding_kernels_fuzz::{
    Agreement, Call, Case, Id, Target, Values, Writes, assert_same_bits, run,
};
use libfuzzer_sys::fuzz_target;

struct Gather;

impl Target for Gather {
    const TABLE: Values = Values::AnyBits;
    const PER_ID: Values = Values::AnyBits;
    const WRITES: Writes = Writes::PerId;
    const AGREEMENT: Agreement = Agreement::UpToQuieting;

    fn call<I: Id>(case: &Case<I>, call: Call, out: &mut [f32]) -> Result<(), EmbeddingError> {
        let (table, dim, ids) = (&case.table[..], case.dim, &case.ids[..]);
        match call {
            Call::Plain => gather(table, dim, ids, out),
            Call::With(par) => gather_with(par, table, dim, ids, out),
            Call::Scalar => loops::gather(table, dim, ids, out),
            Call::Reference => reference::gather(table, dim, ids, out),
        }
    }

    fn check_output<I: Id>(case: &Case<I>, out: &[f32]) {
        let dim = case.dim;
        let mut copied = Vec::with_capacity(out.len());
        for id in &case.ids {
            let start = id.key() as usize * dim;
            copied.extend_from_slice(&case.table[start..start + dim]);
        }
        assert_same_bits("the call", out, "a bit copy of the rows", &copied, case);
    }
}

fuzz_target!(|data: &[u8]| run::<Gather>(data));
