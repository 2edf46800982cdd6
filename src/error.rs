//! The error of every kernel and layer call: [`EmbeddingError`]. (Reading
//! and writing files has its own, [`FileError`](crate::io::FileError), which
//! wraps this one.)
//!
//! Every public entry point checks its arguments before it writes a single
//! value, and reports the first problem it finds as one of these variants.
//! The checks run in a fixed order, the same for every kernel and for the
//! [`reference`](crate::reference) oracle, so two implementations given the
//! same bad call return the same error:
//!
//! 1. the table: [`ZeroDimWithData`](EmbeddingError::ZeroDimWithData), then
//!    [`NotMultipleOfDim`](EmbeddingError::NotMultipleOfDim);
//! 2. the size `ids.len() × dim`: [`SizeOverflow`](EmbeddingError::SizeOverflow);
//! 3. the other buffers, in argument order:
//!    [`LengthMismatch`](EmbeddingError::LengthMismatch);
//! 4. the ids, first to last:
//!    [`IndexOutOfRange`](EmbeddingError::IndexOutOfRange).
//!
//! A call with more arguments (bags, per-sample weights, `padding_idx`,
//! positions) checks them before the ids, in the order its `# Errors`
//! section lists.

use core::fmt;

/// Names the buffer an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// The embedding table (`weight`) read by a forward kernel.
    Table,
    /// The output buffer written by a forward kernel.
    Output,
    /// The gradient of the output, read by a backward kernel.
    GradOutput,
    /// The gradient of the table, accumulated into by a backward kernel.
    GradTable,
    /// A table of position vectors (`max_len × dim`).
    Positions,
    /// The gradient of a table of position vectors.
    GradPositions,
    /// The per-row or per-element state of an optimiser.
    OptimizerState,
    /// The ids of a bag call (their count must match the bags').
    Ids,
    /// The per-sample weights of a bag call.
    PerSampleWeights,
    /// The ids of the winning rows of a max bag call.
    MaxIndices,
    /// The left factor `A` of a [`reference`](crate::reference) product.
    MatrixA,
    /// The right factor `B` of a [`reference`](crate::reference) product.
    MatrixB,
    /// The accumulator `C` of [`reference::matmul_tn_acc`](crate::reference::matmul_tn_acc).
    MatrixC,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operand::Table => "table",
            Operand::Output => "output",
            Operand::GradOutput => "grad_output",
            Operand::GradTable => "grad_table",
            Operand::Positions => "positions",
            Operand::GradPositions => "grad_positions",
            Operand::OptimizerState => "optimizer state",
            Operand::Ids => "ids",
            Operand::PerSampleWeights => "per_sample_weights",
            Operand::MaxIndices => "max_indices",
            Operand::MatrixA => "matrix A",
            Operand::MatrixB => "matrix B",
            Operand::MatrixC => "matrix C",
        })
    }
}

/// Everything that can be wrong with a call. Nothing has been written when
/// one of these is returned.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddingError {
    /// An id is negative or not below the number of rows.
    ///
    /// `index` is the id as a signed value, so an `i64` of -1 reads as -1 and a
    /// `u64::MAX` reads as 18446744073709551615.
    #[error(
        "id {index} at position {position} is out of range for a table of {num_embeddings} rows"
    )]
    IndexOutOfRange {
        /// Where the id sits in the flat id slice.
        position: usize,
        /// The id itself.
        index: i128,
        /// The number of rows it had to stay below.
        num_embeddings: usize,
    },

    /// `embedding_dim` is 0 yet a table holds values, so its row count is
    /// undefined.
    #[error("embedding_dim is 0 but the {operand} holds {len} values")]
    ZeroDimWithData {
        /// The table in question.
        operand: Operand,
        /// How many values it holds.
        len: usize,
    },

    /// A table's length is not a whole number of rows.
    #[error("the {operand} holds {len} values, not a multiple of embedding_dim {dim}")]
    NotMultipleOfDim {
        /// The table in question.
        operand: Operand,
        /// How many values it holds.
        len: usize,
        /// The row width it was checked against.
        dim: usize,
    },

    /// A buffer does not have the length the call implies
    /// (for an output, `ids.len() × embedding_dim`).
    #[error("the {operand} holds {got} values but {expected} were expected")]
    LengthMismatch {
        /// The buffer in question.
        operand: Operand,
        /// The length the other arguments imply.
        expected: usize,
        /// The length it has.
        got: usize,
    },

    /// `count × embedding_dim` does not fit in `usize`: the values of
    /// `count` ids (or the `count` rows of a table) cannot be counted.
    #[error("{count} rows × embedding_dim {dim} overflows usize")]
    SizeOverflow {
        /// The number of ids, or of rows.
        count: usize,
        /// The row width.
        dim: usize,
    },

    /// The shape given for the ids does not hold as many ids as were passed
    /// (its product differs from `len`, or overflows).
    #[error("an ids shape of {shape:?} does not hold the {len} ids given")]
    IdsShape {
        /// The shape given.
        shape: Vec<usize>,
        /// How many ids there are.
        len: usize,
    },

    /// A sequence is longer than the table of positions.
    #[error(
        "a sequence of {seq_len} positions is longer than the {max_len} positions of the table"
    )]
    SequenceTooLong {
        /// The sequence length of the call.
        seq_len: usize,
        /// How many positions the table holds.
        max_len: usize,
    },

    /// `padding_idx` is outside `-num_embeddings..num_embeddings`.
    #[error("padding_idx {padding_idx} is out of range for a table of {num_embeddings} rows")]
    PaddingIdxOutOfRange {
        /// The value given.
        padding_idx: i64,
        /// The number of rows of the table.
        num_embeddings: usize,
    },

    /// A numeric argument is outside what it may be (a negative learning
    /// rate, a `max_norm` that is not positive, ...).
    #[error("{name} = {value} is invalid: it must be {requirement}")]
    InvalidArgument {
        /// The argument's name, as in PyTorch.
        name: &'static str,
        /// The value given, printed.
        value: String,
        /// What it must be.
        requirement: &'static str,
    },

    /// The first offset of a bag call is not 0.
    #[error("offsets must start at 0, but the first is {first}")]
    OffsetsStart {
        /// The first offset.
        first: i128,
    },

    /// An offset is negative or past the end of the ids.
    #[error("offset {value} at position {position} is outside 0..={num_ids} (the ids' length)")]
    OffsetOutOfRange {
        /// Where it sits in `offsets`.
        position: usize,
        /// The offset.
        value: i128,
        /// How many ids there are.
        num_ids: usize,
    },

    /// An offset is below the one before it.
    #[error("offset {value} at position {position} is below the offset {previous} before it")]
    OffsetsDecrease {
        /// Where it sits in `offsets`.
        position: usize,
        /// The offset.
        value: i128,
        /// The offset before it.
        previous: i128,
    },

    /// `include_last_offset` with no offsets at all: not even the end.
    #[error("include_last_offset needs at least one offset (the end of the last bag)")]
    NoOffsets,

    /// `per_sample_weights` were given to a mode other than sum (PyTorch
    /// allows them only there).
    #[error("per_sample_weights are only supported for mode sum, not {mode}")]
    PerSampleWeightsNeedSum {
        /// The mode of the call.
        mode: crate::pooling::Mode,
    },

    /// A bag of mode max holds more ids than the kernels can record a winner
    /// position for (`u32::MAX + 1`, over four billion).
    #[error("bag {bag} holds {len} ids, more than the {max} a max bag can hold")]
    BagTooLong {
        /// Which bag.
        bag: usize,
        /// How many ids it holds.
        len: usize,
        /// The most a max bag may hold.
        max: u64,
    },

    /// A max bag's backward needs the `max_indices` of its forward
    /// (`bag_max_backward`), not the ids.
    #[error("the backward of mode max needs the forward's max_indices")]
    MaxNeedsIndices,

    /// A row to quantize holds an infinity or a NaN: its row-wise scale and
    /// bias would be meaningless.
    #[error(
        "row {row} holds a value that is not finite at column {column}, which a row-wise quantized table cannot represent"
    )]
    NotFinite {
        /// The row.
        row: usize,
        /// The first column holding an infinity or a NaN.
        column: usize,
    },

    /// A row to quantize spans a range (`max - min`) too wide for an `f32`.
    #[error(
        "row {row} spans a range wider than an f32 holds, which a row-wise quantized table cannot represent"
    )]
    RangeOverflow {
        /// The row.
        row: usize,
    },

    /// The memory a call needs could not be allocated: the allocator
    /// refused `bytes` bytes (or that many do not fit the address space).
    /// Nothing was written, and the call can be retried with less.
    #[error("could not allocate {bytes} bytes for the {what}")]
    AllocationFailed {
        /// What the memory was for ("table", "output", ...).
        what: &'static str,
        /// How many bytes were asked for.
        bytes: u128,
    },

    /// A table's bytes (packed rows, or the little-endian values of an
    /// [`OwnedTable`](crate::formats::OwnedTable)) are not a whole number of
    /// rows.
    #[error("a table of {len} bytes is not a whole number of {row_bytes}-byte rows")]
    PackedLength {
        /// Its length in bytes.
        len: usize,
        /// The length of one packed row for its format and width.
        row_bytes: usize,
    },
}
