//! Optimisers fused into the sparse backward: SGD, Adagrad and row-wise
//! Adagrad, applied straight to the rows a batch touched.
//!
//! [`Embedding::sparse_step`](crate::Embedding::sparse_step) groups the ids,
//! sums each touched row's gradient and updates that row at once, so no
//! gradient — dense or sparse — is ever stored; rows the batch did not touch
//! are not read. [`Embedding::apply_sparse`](crate::Embedding::apply_sparse)
//! applies an already coalesced [`SparseGrad`](crate::SparseGrad) the same
//! way, with the same bits.
//!
//! The rules and their defaults follow PyTorch (`torch.optim.SGD`,
//! `torch.optim.Adagrad`) and FBGEMM's exact row-wise Adagrad. One
//! difference, shared with FBGEMM's fused kernels: `weight_decay` is applied
//! to the rows a batch touches only (PyTorch refuses weight decay with sparse
//! gradients).

use crate::error::{EmbeddingError, Operand};

pub(crate) mod sealed {
    use crate::error::EmbeddingError;
    use crate::kernels::RowRule;

    /// What the layer needs of an optimiser, hidden so that the set stays
    /// closed.
    pub trait Sealed {
        /// The rule for one step.
        type Rule: RowRule;
        /// Everything [`begin_step`](Self::begin_step) can refuse but an
        /// allocation, and no change: the hyper-parameters, and a state made
        /// for another table than `rows × dim` (an empty state is made on
        /// the first step). A layer calls it before it allocates its own
        /// workspace, and a frozen layer in place of a step, so that it
        /// refuses exactly what an unfrozen one would.
        fn check_step(&self, rows: usize, dim: usize) -> Result<(), EmbeddingError>;
        /// Checks the hyper-parameters, makes or checks the state for a table
        /// of `rows × dim`, counts the step, and hands out the rule and the
        /// state. Nothing changes on an error.
        fn begin_step(
            &mut self,
            rows: usize,
            dim: usize,
        ) -> Result<(Self::Rule, &mut [f32]), EmbeddingError>;
    }
}

use crate::kernels::RowRule;

/// An optimiser that [`Embedding`](crate::Embedding) can fuse into its sparse
/// backward: [`Sgd`], [`Adagrad`] (or [`AdagradOn`], over a state the caller
/// holds) or [`RowWiseAdagrad`].
pub trait SparseOptimizer: sealed::Sealed {}

/// Fails unless `value` is finite and not negative.
fn non_negative(name: &'static str, value: f32) -> Result<(), EmbeddingError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(EmbeddingError::InvalidArgument {
            name,
            value: value.to_string(),
            requirement: "finite and not negative",
        })
    }
}

/// Checks `state` for a table of `rows × width` values: an empty state is
/// made on the first step, a made one must have that length.
fn check_state(state: &[f32], rows: usize, width: usize) -> Result<usize, EmbeddingError> {
    let len = rows
        .checked_mul(width)
        .ok_or(EmbeddingError::SizeOverflow {
            count: rows,
            dim: width,
        })?;
    if !state.is_empty() && state.len() != len {
        return Err(EmbeddingError::LengthMismatch {
            operand: Operand::OptimizerState,
            expected: len,
            got: state.len(),
        });
    }
    Ok(len)
}

/// Makes the state on the first step (`rows × width` values of `init`) and
/// checks it on every step (see [`check_state`]). Nothing changes on an
/// error, an allocation the allocator refuses included.
fn state_for(
    state: &mut Vec<f32>,
    rows: usize,
    width: usize,
    init: f32,
) -> Result<&mut [f32], EmbeddingError> {
    let len = check_state(state, rows, width)?;
    if state.is_empty() && len > 0 {
        *state = crate::memory::zeroed_floats(len, "optimizer state")?;
        if init != 0.0 {
            state.fill(init);
        }
    }
    Ok(state)
}

/// Stochastic gradient descent: `w ← w − lr · (g + weight_decay · w)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// The learning rate.
    pub lr: f32,
    /// L2 penalty, applied to touched rows only (default 0).
    pub weight_decay: f32,
}

impl Sgd {
    /// SGD with learning rate `lr` and no weight decay.
    pub fn new(lr: f32) -> Sgd {
        Sgd {
            lr,
            weight_decay: 0.0,
        }
    }

    /// The same with `weight_decay`.
    pub fn with_weight_decay(self, weight_decay: f32) -> Sgd {
        Sgd {
            weight_decay,
            ..self
        }
    }

    /// One dense step over a whole table, `weight[i] −= lr · (grad[i] +
    /// weight_decay · weight[i])`, for gradients that are already dense.
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] for a bad hyper-parameter,
    /// [`EmbeddingError::LengthMismatch`] if `grad` is not as long as
    /// `weight`; then `weight` is untouched.
    pub fn step_dense(&self, weight: &mut [f32], grad: &[f32]) -> Result<(), EmbeddingError> {
        self.validate()?;
        if grad.len() != weight.len() {
            return Err(EmbeddingError::LengthMismatch {
                operand: Operand::GradTable,
                expected: weight.len(),
                got: grad.len(),
            });
        }
        const CHUNK: usize = 1 << 16;
        let rule = *self;
        let body = |(w, g): (&mut [f32], &[f32])| rule.update(w, g, &mut []);
        if weight.len() >= 4 * CHUNK {
            let tasks = weight.chunks_mut(CHUNK).zip(grad.chunks(CHUNK)).collect();
            crate::executor::for_each_part(tasks, |_, task| body(task));
        } else {
            body((weight, grad));
        }
        Ok(())
    }
}

impl Sgd {
    /// Checks the hyper-parameters (every step does too), so a training
    /// loop can refuse a bad configuration before it starts.
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] naming the first bad one.
    pub fn validate(&self) -> Result<(), EmbeddingError> {
        non_negative("lr", self.lr)?;
        non_negative("weight_decay", self.weight_decay)
    }
}

impl RowRule for Sgd {
    fn state_width(&self, _dim: usize) -> usize {
        0
    }

    #[inline]
    fn update(&self, weight: &mut [f32], grad: &[f32], _state: &mut [f32]) {
        let (lr, wd) = (self.lr, self.weight_decay);
        if wd == 0.0 {
            for (w, &g) in weight.iter_mut().zip(grad) {
                *w -= lr * g;
            }
        } else {
            for (w, &g) in weight.iter_mut().zip(grad) {
                *w -= lr * (g + wd * *w);
            }
        }
    }
}

impl sealed::Sealed for Sgd {
    type Rule = Sgd;
    fn check_step(&self, _rows: usize, _dim: usize) -> Result<(), EmbeddingError> {
        self.validate()
    }
    fn begin_step(
        &mut self,
        _rows: usize,
        _dim: usize,
    ) -> Result<(Sgd, &mut [f32]), EmbeddingError> {
        self.validate()?;
        Ok((*self, &mut []))
    }
}
impl SparseOptimizer for Sgd {}

/// Adagrad with one accumulator per weight, as `torch.optim.Adagrad`:
///
/// ```text
/// clr = lr / (1 + (step − 1) · lr_decay)
/// g  ← g + weight_decay · w
/// s  ← s + g · g
/// w  ← w − clr · g / (sqrt(s) + eps)
/// ```
///
/// The state (`num_embeddings × embedding_dim` values) is made on the first
/// step; only touched rows' accumulators change.
#[derive(Clone, Debug, PartialEq)]
pub struct Adagrad {
    /// The learning rate (PyTorch's default is 0.01).
    pub lr: f32,
    /// Learning-rate decay per step (default 0).
    pub lr_decay: f32,
    /// L2 penalty, applied to touched rows only (default 0).
    pub weight_decay: f32,
    /// Added to the root of the accumulator (default 1e-10).
    pub eps: f32,
    /// Every accumulator's starting value (default 0).
    pub initial_accumulator_value: f32,
    step: u64,
    state: Vec<f32>,
}

impl Adagrad {
    /// Adagrad with learning rate `lr` and PyTorch's other defaults.
    pub fn new(lr: f32) -> Adagrad {
        Adagrad {
            lr,
            lr_decay: 0.0,
            weight_decay: 0.0,
            eps: 1e-10,
            initial_accumulator_value: 0.0,
            step: 0,
            state: Vec::new(),
        }
    }

    /// Checks the hyper-parameters (every step does too).
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] naming the first bad one.
    pub fn validate(&self) -> Result<(), EmbeddingError> {
        non_negative("lr", self.lr)?;
        non_negative("lr_decay", self.lr_decay)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("eps", self.eps)?;
        non_negative("initial_accumulator_value", self.initial_accumulator_value)
    }

    /// The accumulators (`num_embeddings × embedding_dim`), empty before the
    /// first step.
    pub fn state(&self) -> &[f32] {
        &self.state
    }

    /// How many steps were taken.
    pub fn steps(&self) -> u64 {
        self.step
    }
}

/// One step's Adagrad rule.
#[derive(Clone, Copy, Debug)]
pub struct AdagradRule {
    clr: f32,
    weight_decay: f32,
    eps: f32,
}

impl RowRule for AdagradRule {
    fn state_width(&self, dim: usize) -> usize {
        dim
    }

    #[inline]
    fn update(&self, weight: &mut [f32], grad: &[f32], state: &mut [f32]) {
        for ((w, &g), s) in weight.iter_mut().zip(grad).zip(state) {
            let g = if self.weight_decay == 0.0 {
                g
            } else {
                g + self.weight_decay * *w
            };
            *s += g * g;
            *w += -self.clr * (g / (s.sqrt() + self.eps));
        }
    }
}

impl AdagradRule {
    /// The rule of step `step` (counted from 1), PyTorch's
    /// `clr = lr / (1 + (step − 1) · lr_decay)`.
    fn at_step(lr: f32, lr_decay: f32, weight_decay: f32, eps: f32, step: u64) -> AdagradRule {
        AdagradRule {
            clr: lr / (1.0 + (step - 1) as f32 * lr_decay),
            weight_decay,
            eps,
        }
    }
}

impl sealed::Sealed for Adagrad {
    type Rule = AdagradRule;
    fn check_step(&self, rows: usize, dim: usize) -> Result<(), EmbeddingError> {
        self.validate()?;
        check_state(&self.state, rows, dim).map(drop)
    }
    fn begin_step(
        &mut self,
        rows: usize,
        dim: usize,
    ) -> Result<(AdagradRule, &mut [f32]), EmbeddingError> {
        self.validate()?;
        state_for(&mut self.state, rows, dim, self.initial_accumulator_value)?;
        self.step += 1;
        let rule = AdagradRule::at_step(
            self.lr,
            self.lr_decay,
            self.weight_decay,
            self.eps,
            self.step,
        );
        Ok((rule, &mut self.state))
    }
}
impl SparseOptimizer for Adagrad {}

/// [`Adagrad`] over accumulators the caller holds: a NumPy array, a
/// framework's optimiser state (PyTorch's `state_sum`). The same rule and
/// bits; the state is `num_embeddings × embedding_dim` values from the first
/// step on (fill it with `initial_accumulator_value` before it), and the
/// step count starts from the steps already taken.
#[derive(Debug, PartialEq)]
pub struct AdagradOn<'s> {
    /// The learning rate.
    pub lr: f32,
    /// Learning-rate decay per step (default 0).
    pub lr_decay: f32,
    /// L2 penalty, applied to touched rows only (default 0).
    pub weight_decay: f32,
    /// Added to the root of the accumulator (default 1e-10).
    pub eps: f32,
    step: u64,
    state: &'s mut [f32],
}

impl<'s> AdagradOn<'s> {
    /// Adagrad with learning rate `lr` and PyTorch's other defaults, on
    /// `state`, after `steps_taken` steps (0 for a new one; the next step is
    /// step `steps_taken + 1`, PyTorch's `state["step"]` after it).
    pub fn new(lr: f32, state: &'s mut [f32], steps_taken: u64) -> AdagradOn<'s> {
        AdagradOn {
            lr,
            lr_decay: 0.0,
            weight_decay: 0.0,
            eps: 1e-10,
            step: steps_taken,
            state,
        }
    }

    /// Checks the hyper-parameters (every step does too).
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] naming the first bad one.
    pub fn validate(&self) -> Result<(), EmbeddingError> {
        non_negative("lr", self.lr)?;
        non_negative("lr_decay", self.lr_decay)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("eps", self.eps)
    }

    /// How many steps were taken, those before [`new`](Self::new) included.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Fails unless the state holds `rows × dim` values.
    fn check(&self, rows: usize, dim: usize) -> Result<(), EmbeddingError> {
        self.validate()?;
        let len = check_state(&[], rows, dim)?;
        if self.state.len() != len {
            return Err(EmbeddingError::LengthMismatch {
                operand: Operand::OptimizerState,
                expected: len,
                got: self.state.len(),
            });
        }
        Ok(())
    }
}

impl sealed::Sealed for AdagradOn<'_> {
    type Rule = AdagradRule;
    fn check_step(&self, rows: usize, dim: usize) -> Result<(), EmbeddingError> {
        self.check(rows, dim)
    }
    fn begin_step(
        &mut self,
        rows: usize,
        dim: usize,
    ) -> Result<(AdagradRule, &mut [f32]), EmbeddingError> {
        self.check(rows, dim)?;
        self.step = self.step.saturating_add(1);
        let rule = AdagradRule::at_step(
            self.lr,
            self.lr_decay,
            self.weight_decay,
            self.eps,
            self.step,
        );
        Ok((rule, &mut *self.state))
    }
}
impl SparseOptimizer for AdagradOn<'_> {}

/// Row-wise Adagrad, as FBGEMM's `EXACT_ROWWISE_ADAGRAD`: one accumulator per
/// row, fed the mean square of the row's gradient, so the state is
/// `num_embeddings` values instead of a second table:
///
/// ```text
/// g ← g + weight_decay · w
/// s[r] ← s[r] + mean(g · g)
/// w ← w − lr / (sqrt(s[r]) + eps) · g
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RowWiseAdagrad {
    /// The learning rate.
    pub lr: f32,
    /// L2 penalty, applied to touched rows only (default 0).
    pub weight_decay: f32,
    /// Added to the root of the accumulator (default 1e-8, FBGEMM's).
    pub eps: f32,
    /// Every accumulator's starting value (default 0).
    pub initial_accumulator_value: f32,
    state: Vec<f32>,
}

impl RowWiseAdagrad {
    /// Row-wise Adagrad with learning rate `lr` and the defaults above.
    pub fn new(lr: f32) -> RowWiseAdagrad {
        RowWiseAdagrad {
            lr,
            weight_decay: 0.0,
            eps: 1e-8,
            initial_accumulator_value: 0.0,
            state: Vec::new(),
        }
    }

    /// Checks the hyper-parameters (every step does too).
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] naming the first bad one.
    pub fn validate(&self) -> Result<(), EmbeddingError> {
        non_negative("lr", self.lr)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("eps", self.eps)?;
        non_negative("initial_accumulator_value", self.initial_accumulator_value)
    }

    /// The accumulators, one per row, empty before the first step.
    pub fn state(&self) -> &[f32] {
        &self.state
    }
}

/// One step's row-wise Adagrad rule.
#[derive(Clone, Copy, Debug)]
pub struct RowWiseAdagradRule {
    lr: f32,
    weight_decay: f32,
    eps: f32,
}

impl RowRule for RowWiseAdagradRule {
    fn state_width(&self, _dim: usize) -> usize {
        1
    }

    #[inline]
    fn update(&self, weight: &mut [f32], grad: &[f32], state: &mut [f32]) {
        let wd = self.weight_decay;
        let g = |w: f32, g: f32| if wd == 0.0 { g } else { g + wd * w };
        let mut squares = 0.0f32;
        for (&w, &x) in weight.iter().zip(grad) {
            let x = g(w, x);
            squares += x * x;
        }
        state[0] += squares / grad.len().max(1) as f32;
        let step = self.lr / (state[0].sqrt() + self.eps);
        for (w, &x) in weight.iter_mut().zip(grad) {
            *w -= step * g(*w, x);
        }
    }
}

impl sealed::Sealed for RowWiseAdagrad {
    type Rule = RowWiseAdagradRule;
    fn check_step(&self, rows: usize, _dim: usize) -> Result<(), EmbeddingError> {
        self.validate()?;
        check_state(&self.state, rows, 1).map(drop)
    }
    fn begin_step(
        &mut self,
        rows: usize,
        _dim: usize,
    ) -> Result<(RowWiseAdagradRule, &mut [f32]), EmbeddingError> {
        self.validate()?;
        state_for(&mut self.state, rows, 1, self.initial_accumulator_value)?;
        let rule = RowWiseAdagradRule {
            lr: self.lr,
            weight_decay: self.weight_decay,
            eps: self.eps,
        };
        Ok((rule, &mut self.state))
    }
}
impl SparseOptimizer for RowWiseAdagrad {}

/// [`RowWiseAdagrad`] over accumulators the caller holds, one per row (a
/// framework's optimiser state, as TorchRec keeps `EXACT_ROWWISE_ADAGRAD`'s).
/// The same rule and bits; fill the state with `initial_accumulator_value`
/// before the first step.
#[derive(Debug, PartialEq)]
pub struct RowWiseAdagradOn<'s> {
    /// The learning rate.
    pub lr: f32,
    /// L2 penalty, applied to touched rows only (default 0).
    pub weight_decay: f32,
    /// Added to the root of the accumulator (default 1e-8, FBGEMM's).
    pub eps: f32,
    state: &'s mut [f32],
}

impl<'s> RowWiseAdagradOn<'s> {
    /// Row-wise Adagrad with learning rate `lr` and the defaults above, on
    /// `state` (`num_embeddings` values).
    pub fn new(lr: f32, state: &'s mut [f32]) -> RowWiseAdagradOn<'s> {
        RowWiseAdagradOn {
            lr,
            weight_decay: 0.0,
            eps: 1e-8,
            state,
        }
    }

    /// Checks the hyper-parameters (every step does too).
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] naming the first bad one.
    pub fn validate(&self) -> Result<(), EmbeddingError> {
        non_negative("lr", self.lr)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("eps", self.eps)
    }

    /// Fails unless the state holds one value a row.
    fn check(&self, rows: usize) -> Result<(), EmbeddingError> {
        self.validate()?;
        if self.state.len() != rows {
            return Err(EmbeddingError::LengthMismatch {
                operand: Operand::OptimizerState,
                expected: rows,
                got: self.state.len(),
            });
        }
        Ok(())
    }
}

impl sealed::Sealed for RowWiseAdagradOn<'_> {
    type Rule = RowWiseAdagradRule;
    fn check_step(&self, rows: usize, _dim: usize) -> Result<(), EmbeddingError> {
        self.check(rows)
    }
    fn begin_step(
        &mut self,
        rows: usize,
        _dim: usize,
    ) -> Result<(RowWiseAdagradRule, &mut [f32]), EmbeddingError> {
        self.check(rows)?;
        let rule = RowWiseAdagradRule {
            lr: self.lr,
            weight_decay: self.weight_decay,
            eps: self.eps,
        };
        Ok((rule, &mut *self.state))
    }
}
impl SparseOptimizer for RowWiseAdagradOn<'_> {}
