//! How a bag is pooled: [`Mode`] and the rest of PyTorch's bag arguments,
//! [`Pooling`].

/// How `nn.EmbeddingBag` pools each bag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The sum of the bag's rows (times their per-sample weights, if any).
    Sum,
    /// The sum divided by the number of rows (PyTorch's default).
    #[default]
    Mean,
    /// The largest value of each column, with the id it came from.
    Max,
}

impl core::fmt::Display for Mode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Mode::Sum => "sum",
            Mode::Mean => "mean",
            Mode::Max => "max",
        })
    }
}

/// What to pool and how: PyTorch's `mode`, `per_sample_weights` and
/// `padding_idx` (already a row number).
#[derive(Clone, Copy, Debug, Default)]
pub struct Pooling<'a> {
    /// Sum, mean or max.
    pub mode: Mode,
    /// One weight per id, multiplying its row (sum mode only).
    pub per_sample_weights: Option<&'a [f32]>,
    /// A row left out of every bag (and of mean's count).
    pub padding_idx: Option<usize>,
    /// Backward only: divide each row's gradient by how many times its id
    /// occurs in the batch (sum and mean).
    pub scale_grad_by_freq: bool,
}
