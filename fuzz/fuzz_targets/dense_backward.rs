//! Checks the layer's grouped backward against the one-hot reference: the
//! dense gradient (`kernels::grouped::dense_backward`, plain and `_with`
//! each `Parallelism`, on 1 to 4 threads) must be, bit for bit, a zeroed
//! gradient with `reference::scatter_add` applied, and every row must be
//! written (the buffer starts out holding the case's table values, not
//! zeros). The `Scalar` entry point stands for the coalesced sparse gradient
//! (`sparse_backward_with(..).to_dense()`), held to the same bits. On an
//! error, the buffer is untouched and both sides report the same error.
#![no_main]

use embedding_kernels::{EmbeddingError, Parallelism, reference};
use embedding_kernels::{dense_backward, dense_backward_with, sparse_backward_with};
use embedding_kernels_fuzz::{Agreement, Call, Case, Id, Target, Values, Writes, run};
use libfuzzer_sys::fuzz_target;

struct DenseBackward;

impl Target for DenseBackward {
    const TABLE: Values = Values::NoNan;
    const PER_ID: Values = Values::NoNan;
    const WRITES: Writes = Writes::Table;
    const AGREEMENT: Agreement = Agreement::Exact;

    fn call<I: Id>(case: &Case<I>, call: Call, grad: &mut [f32]) -> Result<(), EmbeddingError> {
        let (grad_output, dim, ids) = (&case.per_id[..], case.dim, &case.ids[..]);
        match call {
            Call::Plain => dense_backward(grad_output, dim, ids, None, false, grad),
            Call::With(par) => dense_backward_with(par, grad_output, dim, ids, None, false, grad),
            Call::Scalar => {
                // The sparse path has no table to take the row count from:
                // give it the one the gradient implies, when it implies one.
                let Some(rows) = grad
                    .len()
                    .checked_div(dim)
                    .or((grad.is_empty()).then_some(0))
                else {
                    // dim 0 with values: let the dense path name the error.
                    return dense_backward(grad_output, dim, ids, None, false, grad);
                };
                if rows * dim != grad.len() {
                    // Not whole rows: let the dense path name the error.
                    return dense_backward(grad_output, dim, ids, None, false, grad);
                }
                let sparse = sparse_backward_with(
                    Parallelism::Auto,
                    grad_output,
                    dim,
                    ids,
                    rows,
                    None,
                    false,
                )?;
                grad.copy_from_slice(&sparse.to_dense().unwrap());
                Ok(())
            }
            Call::Reference => {
                // Zeroed, then the reference scatter; written back only on
                // success, so an error leaves `grad` as it was.
                let mut zeroed = vec![0.0; grad.len()];
                reference::scatter_add(grad_output, dim, ids, &mut zeroed)?;
                grad.copy_from_slice(&zeroed);
                Ok(())
            }
        }
    }
}

fuzz_target!(|data: &[u8]| run::<DenseBackward>(data));
