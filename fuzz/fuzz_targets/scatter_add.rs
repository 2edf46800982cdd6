//! Checks `scatter_add` (plain, `scatter_add_with(Serial | Rayon | Auto)`
//! and the scalar baseline), on 1 to 4 threads, against the one-hot
//! `reference::scatter_add`: the same `Ok` or error, the same bits in every
//! element of the accumulated `grad_table` (so every value received its
//! gradients in position order, whatever the thread count and however the
//! columns were split), and `grad_table` untouched on an error. Gradients
//! and the starting `grad_table` hold no NaN; values of widely spread
//! exponents make every sum order-sensitive.
#![no_main]

use embedding_kernels::reference::loops;
use embedding_kernels::{EmbeddingError, reference, scatter_add, scatter_add_with};
use embedding_kernels_fuzz::{Agreement, Call, Case, Id, Target, Values, Writes, run};
use libfuzzer_sys::fuzz_target;

struct ScatterAdd;

impl Target for ScatterAdd {
    const TABLE: Values = Values::NoNan;
    const PER_ID: Values = Values::NoNan;
    const WRITES: Writes = Writes::Table;
    const AGREEMENT: Agreement = Agreement::Exact;

    fn call<I: Id>(case: &Case<I>, call: Call, grad: &mut [f32]) -> Result<(), EmbeddingError> {
        let (grad_output, dim, ids) = (&case.per_id[..], case.dim, &case.ids[..]);
        match call {
            Call::Plain => scatter_add(grad_output, dim, ids, grad),
            Call::With(par) => scatter_add_with(par, grad_output, dim, ids, grad),
            Call::Scalar => loops::scatter_add(grad_output, dim, ids, grad),
            Call::Reference => reference::scatter_add(grad_output, dim, ids, grad),
        }
    }
}

fuzz_target!(|data: &[u8]| run::<ScatterAdd>(data));
