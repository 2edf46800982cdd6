//! The transformer's input layer: token embeddings, optionally scaled, plus
//! absolute position embeddings, built on [`Embedding`] and the fused kernels
//! of [`positions`](crate::positions).
//!
//! In PyTorch this is the first line of nearly every transformer's
//! `forward`, with `ids` of shape `[B, T]`:
//!
//! ```python
//! tok_emb = nn.Embedding(vocab, d)
//! pos_emb = nn.Embedding(max_len, d)   # learned (BERT, GPT-2), or a fixed
//!                                      # buffer: sinusoidal(max_len, d) (Vaswani et al.)
//! x = tok_emb(ids) * math.sqrt(d) + pos_emb(torch.arange(T))
//! ```
//!
//! | PyTorch | here |
//! | --- | --- |
//! | `register_buffer("pe", sinusoidal(max_len, d))` | [`InputEmbedding::sinusoidal`], [`Positions::Fixed`] |
//! | `pos_emb = nn.Embedding(max_len, d)` | [`InputEmbedding::learned`], [`Positions::Learned`] |
//! | `tok_emb(ids) * math.sqrt(d) + pos_emb(arange(T))` | [`InputEmbedding::forward`]`(&ids, B, T)` |
//! | `x.backward(g)`, then both tables' `.grad` | [`InputEmbedding::backward`] |
//! | `SGD(sparse=True).step()` on both tables | [`InputEmbedding::sparse_sgd_step`] |
//!
//! ```text
//! forward:  check [B, T] = ids.len(), T <= max_len, out length, every id
//!           renormalise the looked-up rows of each table that has max_norm
//!           out[b, t, :] = tokens[ids[b, t], :] * scale + positions[t, :]    (one pass)
//! backward: check the same, then into zeroed buffers, in one pass:
//!           grad_tokens[ids[b, t], :] += grad_output[b, t, :] * scale
//!           grad_positions[t, :]      += grad_output[b, t, :]              (learned only)
//!           then the token options: ÷ count (scale_grad_by_freq), padding row = 0
//! ```
//!
//! 1. **One pass, the bits of the composition.** The forward is
//!    [`embed_positions_with`](crate::embed_positions_with): each value is
//!    `w * scale + p`, a rounded product then a rounded sum (no fused
//!    multiply-add), so it equals [`Embedding::forward`], then `* scale`,
//!    then `+ positions[t]`, bit for bit, on any thread count. `scale: None`
//!    adds without multiplying.
//! 2. **The token gradient is `Embedding::backward_dense(grad_output * scale)`,
//!    bit for bit.** The fused backward adds each `g * scale` (rounded) into a
//!    zeroed table in position order, which is what the grouped dense
//!    backward does with a scaled gradient: a sum from `+0.0` in position
//!    order. The options are applied afterwards, exactly: a row is divided by
//!    its id's count as `backward_dense` divides it, and the padding row is
//!    overwritten with zeros, so even an infinite or NaN gradient at a padded
//!    position leaves it zero (the position gradient still receives it, as in
//!    PyTorch: padding concerns the token table only).
//! 3. **A learned position table is an `Embedding`, looked up at
//!    `arange(T)`**, so its options mean what they mean in PyTorch: `max_norm`
//!    renormalises rows `0..T` before the lookup, the `padding_idx` row gets
//!    no gradient, and `scale_grad_by_freq` changes nothing (each position
//!    occurs once in `arange(T)`; its gradient is the sum over the batch,
//!    `b = 0, 1, …` in order). Position gradients are never scaled.
//! 4. **A fixed table has no gradient.** Its backward is the token half of
//!    the kernel alone ([`scatter_add_scaled_with`]), which skips summing a
//!    position gradient nobody reads and gives the same token bits.
//! 5. **Checks first.** Every call checks the shape, `T ≤ max_len`, the
//!    buffer lengths and every id before it changes anything, the tables
//!    included (`max_norm` renormalises in place). Errors are as in
//!    [`embed_positions`](crate::embed_positions), except that a
//!    shape error names the caller's `[batch, seq_len]`.
//! 6. **Threads.** The fused kernels run with the layer's own
//!    [`Parallelism`] ([`Parallelism::Auto`] unless
//!    [`with_parallelism`](InputEmbedding::with_parallelism) says otherwise,
//!    which also sets both tables'). Results are the same bits for every
//!    choice.
//!
//! ```
//! use embedding_kernels::{Embedding, EmbeddingOptions, InputEmbedding};
//!
//! let options = EmbeddingOptions { padding_idx: Some(0), seed: Some(7), ..Default::default() };
//! let tokens = Embedding::with_options(100, 8, options)?;
//! let mut input = InputEmbedding::sinusoidal(tokens, 16, true)?; // scale = sqrt(8)
//!
//! let ids = [5u32, 7, 0, 5, 9, 0]; // 2 sequences of 3 tokens, 0 = padding
//! let x = input.forward(&ids, 2, 3)?;
//! assert_eq!(x.shape, [2, 3, 8]);
//!
//! let grads = input.backward(&vec![1.0; 2 * 3 * 8], &ids, 2, 3)?;
//! assert!(grads.positions.is_none()); // sinusoidal positions are not trained
//! assert_eq!(grads.tokens[..8], [0.0; 8]); // the padding row
//! assert_eq!(grads.tokens[5 * 8], 2.0 * 8f32.sqrt()); // id 5 occurs twice
//! # Ok::<(), embedding_kernels::EmbeddingError>(())
//! ```

use crate::embedding::{Embedded, Embedding, EmbeddingOptions, check_shape};
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, RowId, ValidIds};
use crate::kernels::{
    embed_positions_backward_with, embed_positions_valid, scatter_add_scaled_with, scatter_add_with,
};
use crate::optim::Sgd;
use crate::parallel::Parallelism;
use crate::positions::sinusoidal_positions;
use crate::shape::{check_len, rows_len, table_rows};

/// The position table of an [`InputEmbedding`]: `max_len` rows of the
/// token table's width.
#[derive(Clone, Debug)]
pub enum Positions {
    /// A table that is never trained, `max_len × embedding_dim` values,
    /// row-major: usually
    /// [`sinusoidal_positions`], as a
    /// PyTorch module keeps it in a buffer.
    Fixed(Vec<f32>),
    /// A trained table of `max_len` rows, as `nn.Embedding(max_len, d)`
    /// (BERT, GPT-2). Its options apply as described in the
    /// [module notes](self) (trick 3).
    Learned(Embedding),
}

impl Positions {
    /// The table, `max_len × embedding_dim`, row-major.
    pub fn weight(&self) -> &[f32] {
        match self {
            Positions::Fixed(table) => table,
            Positions::Learned(table) => table.weight(),
        }
    }

    /// Whether the table is trained (and so has a gradient).
    pub fn is_learned(&self) -> bool {
        matches!(self, Positions::Learned(_))
    }
}

/// The gradients of both tables, as [`InputEmbedding::backward`] returns
/// them.
#[derive(Clone, Debug, PartialEq)]
pub struct InputGrads {
    /// The dense gradient of the token table (`num_embeddings ×
    /// embedding_dim`): `Embedding::backward_dense` of `grad_output * scale`,
    /// bit for bit.
    pub tokens: Vec<f32>,
    /// The dense gradient of a learned position table (`max_len ×
    /// embedding_dim`; rows from `seq_len` on are zero), or `None` for a fixed
    /// table.
    pub positions: Option<Vec<f32>>,
}

/// Token embeddings, optionally scaled, plus absolute position embeddings:
/// `out[b, t, :] = tokens[ids[b, t], :] * scale + positions[t, :]`. See the
/// [module notes](self).
///
/// The two tables always have the same width, and that width is at least 1;
/// the accessors hand out the tables' values for changes by hand, never the
/// tables themselves, so this holds for the layer's whole life
/// ([`into_parts`](Self::into_parts) gives them back).
#[derive(Clone, Debug)]
pub struct InputEmbedding {
    tokens: Embedding,
    positions: Positions,
    max_len: usize,
    scale: Option<f32>,
    parallelism: Parallelism,
}

impl InputEmbedding {
    /// The layer over existing tables: `tokens`, `positions` (of `tokens`'
    /// width) and the token scale (`None` for none, `Some((d as
    /// f32).sqrt())` for *Attention Is All You Need*'s `sqrt(d_model)`, or
    /// any other factor).
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] (`embedding_dim`) if the tokens'
    /// width is 0 or a learned position table's width differs from it;
    /// [`EmbeddingError::NotMultipleOfDim`] ([`Operand::Positions`]) if a
    /// fixed table is not a whole number of rows.
    pub fn new(
        tokens: Embedding,
        positions: Positions,
        scale: Option<f32>,
    ) -> Result<InputEmbedding, EmbeddingError> {
        let dim = tokens.embedding_dim();
        if dim == 0 {
            return Err(EmbeddingError::InvalidArgument {
                name: "embedding_dim",
                value: "0".to_string(),
                requirement: "at least 1 (a position table of width 0 has no rows)",
            });
        }
        let max_len = match &positions {
            Positions::Fixed(table) => table_rows(table.len(), dim, Operand::Positions)?,
            Positions::Learned(table) => {
                if table.embedding_dim() != dim {
                    return Err(EmbeddingError::InvalidArgument {
                        name: "embedding_dim",
                        value: format!(
                            "{} for the positions and {dim} for the tokens",
                            table.embedding_dim()
                        ),
                        requirement: "the same for both tables",
                    });
                }
                table.num_embeddings()
            }
        };
        Ok(InputEmbedding {
            tokens,
            positions,
            max_len,
            scale,
            parallelism: Parallelism::Auto,
        })
    }

    /// The layer with the sinusoidal positions of *Attention Is All You
    /// Need* ([`sinusoidal_positions`]`(max_len, d)`),
    /// never trained, and the tokens scaled by `sqrt(d)` when
    /// `scale_by_sqrt_dim`.
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if `max_len × d` overflows,
    /// [`EmbeddingError::AllocationFailed`] if the table cannot be
    /// allocated, or as [`new`](Self::new).
    pub fn sinusoidal(
        tokens: Embedding,
        max_len: usize,
        scale_by_sqrt_dim: bool,
    ) -> Result<InputEmbedding, EmbeddingError> {
        let dim = tokens.embedding_dim();
        let table = sinusoidal_positions(max_len, dim)?;
        InputEmbedding::new(
            tokens,
            Positions::Fixed(table),
            sqrt_dim(dim, scale_by_sqrt_dim),
        )
    }

    /// The layer with a learned position table of `max_len` rows, drawn from
    /// N(0, 1) as `nn.Embedding(max_len, d)` initialises it, from `seed`
    /// (the bits of [`Embedding::with_options`] with that seed); the tokens
    /// scaled by `sqrt(d)` when `scale_by_sqrt_dim`. A position table with
    /// other options is made with [`Embedding::with_options`] and passed to
    /// [`new`](Self::new).
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if `max_len × d` overflows,
    /// [`EmbeddingError::AllocationFailed`] if the table cannot be
    /// allocated, or as [`new`](Self::new).
    pub fn learned(
        tokens: Embedding,
        max_len: usize,
        seed: u64,
        scale_by_sqrt_dim: bool,
    ) -> Result<InputEmbedding, EmbeddingError> {
        let dim = tokens.embedding_dim();
        let options = EmbeddingOptions {
            seed: Some(seed),
            ..EmbeddingOptions::default()
        };
        let table = Embedding::with_options(max_len, dim, options)?;
        InputEmbedding::new(
            tokens,
            Positions::Learned(table),
            sqrt_dim(dim, scale_by_sqrt_dim),
        )
    }

    /// The same layer with another token scale (`None`: no multiplication).
    pub fn with_scale(self, scale: Option<f32>) -> InputEmbedding {
        InputEmbedding { scale, ..self }
    }

    /// The same layer with another threading choice, for its fused kernels
    /// and for both tables' own.
    pub fn with_parallelism(self, parallelism: Parallelism) -> InputEmbedding {
        let positions = match self.positions {
            Positions::Learned(table) => Positions::Learned(table.with_parallelism(parallelism)),
            fixed => fixed,
        };
        InputEmbedding {
            tokens: self.tokens.with_parallelism(parallelism),
            positions,
            parallelism,
            ..self
        }
    }

    /// The token table.
    pub fn tokens(&self) -> &Embedding {
        &self.tokens
    }

    /// The position table.
    pub fn positions(&self) -> &Positions {
        &self.positions
    }

    /// The token table's values, for changes by hand.
    pub fn token_weight_mut(&mut self) -> &mut [f32] {
        self.tokens.weight_mut()
    }

    /// The position table's values (fixed or learned), for changes by hand.
    pub fn position_weight_mut(&mut self) -> &mut [f32] {
        match &mut self.positions {
            Positions::Fixed(table) => table,
            Positions::Learned(table) => table.weight_mut(),
        }
    }

    /// Both tables, taken out of the layer.
    pub fn into_parts(self) -> (Embedding, Positions) {
        (self.tokens, self.positions)
    }

    /// The row width of both tables.
    pub fn embedding_dim(&self) -> usize {
        self.tokens.embedding_dim()
    }

    /// The longest sequence the position table covers.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The token scale, if any.
    pub fn scale(&self) -> Option<f32> {
        self.scale
    }

    /// The threading choice of the fused kernels.
    pub fn parallelism(&self) -> Parallelism {
        self.parallelism
    }

    /// `tokens[ids[b, t], :] * scale + positions[t, :]` for the flat,
    /// row-major `[batch, seq_len]` batch `ids`, with shape `[batch, seq_len,
    /// embedding_dim]`. Rows of a table with `max_norm` are renormalised
    /// first, as [`Embedding::forward`] does (the tokens' looked-up rows, a
    /// learned table's rows `0..seq_len`).
    ///
    /// # Errors
    /// [`EmbeddingError::IdsShape`] if `batch × seq_len` is not `ids.len()`,
    /// [`EmbeddingError::SequenceTooLong`] if `seq_len > max_len`,
    /// [`EmbeddingError::SizeOverflow`], or
    /// [`EmbeddingError::IndexOutOfRange`] for the first bad id (all checked
    /// before anything is allocated), then
    /// [`EmbeddingError::AllocationFailed`] for the output or the
    /// renormalisations' workspace; then both tables are untouched.
    pub fn forward<I: Index>(
        &mut self,
        ids: &[I],
        batch: usize,
        seq_len: usize,
    ) -> Result<Embedded, EmbeddingError> {
        self.check_batch(ids.len(), batch, seq_len)?;
        let dim = self.embedding_dim();
        let len = rows_len(ids.len(), dim)?;
        let valid = ValidIds::new(ids, self.tokens.num_embeddings())?;
        let mut values = crate::memory::zeroed_floats(len, "output")?;
        self.embed_valid(valid, seq_len, &mut values)?;
        Ok(Embedded {
            values,
            shape: vec![batch, seq_len, dim],
        })
    }

    /// [`forward`](Self::forward) into a caller's buffer of `ids.len() ×
    /// embedding_dim` values.
    ///
    /// # Errors
    /// As [`forward`](Self::forward), and
    /// [`EmbeddingError::LengthMismatch`] ([`Operand::Output`]) for `out`,
    /// or [`EmbeddingError::AllocationFailed`] for the renormalisations'
    /// workspace; then `out` and both tables are untouched.
    pub fn forward_into<I: Index>(
        &mut self,
        ids: &[I],
        batch: usize,
        seq_len: usize,
        out: &mut [f32],
    ) -> Result<(), EmbeddingError> {
        self.check_batch(ids.len(), batch, seq_len)?;
        let dim = self.embedding_dim();
        check_len(Operand::Output, rows_len(ids.len(), dim)?, out.len())?;
        let valid = ValidIds::new(ids, self.tokens.num_embeddings())?;
        self.embed_valid(valid, seq_len, out)
    }

    /// The renormalisations and the fused lookup of checked ids into an
    /// output of the right length; fails only before anything is written.
    fn embed_valid<R: RowId>(
        &mut self,
        valid: ValidIds<'_, R>,
        seq_len: usize,
        out: &mut [f32],
    ) -> Result<(), EmbeddingError> {
        // Both renormalisations' workspaces first: after them nothing can
        // fail, and the first table to change is not left changed alone.
        let tokens_plan = self.tokens.renorm_plan(valid)?;
        let mut positions_plan = None;
        if let Positions::Learned(table) = &self.positions
            && table.max_norm().is_some()
        {
            let mut arange = crate::buffer::with_capacity(seq_len, "workspace")?;
            arange.extend(0..seq_len);
            // `seq_len <= max_len`, checked by the caller: valid ids.
            positions_plan = table.renorm_plan(ValidIds::new(&arange, self.max_len)?)?;
        }
        self.tokens.renorm(tokens_plan);
        if let Positions::Learned(table) = &mut self.positions {
            table.renorm(positions_plan);
        }
        // The shapes were checked by the caller, the ids into `valid`.
        embed_positions_valid(
            self.parallelism,
            self.tokens.weight(),
            self.positions.weight(),
            self.embedding_dim(),
            valid.by_row(),
            seq_len,
            self.scale,
            out,
        );
        Ok(())
    }

    /// The gradients of both tables for `grad_output` (`[batch, seq_len,
    /// embedding_dim]`, flat), in new zeroed buffers: the token gradient is
    /// [`Embedding::backward_dense`] of `grad_output * scale`, bit for bit
    /// (each product rounded, then summed in position order; the token
    /// table's `padding_idx` row zero, rows divided by their id's count with
    /// `scale_grad_by_freq`); the learned position gradient's row `t` is
    /// `grad_output[0, t] + grad_output[1, t] + …`, in that order (its
    /// `padding_idx` row zero). The tables' `sparse` options do not apply:
    /// both gradients are dense. See the [module notes](self).
    ///
    /// # Errors
    /// [`EmbeddingError::IdsShape`], [`EmbeddingError::SequenceTooLong`],
    /// [`EmbeddingError::SizeOverflow`] as in [`forward`](Self::forward),
    /// [`EmbeddingError::LengthMismatch`] ([`Operand::GradOutput`]) for
    /// `grad_output`, or [`EmbeddingError::IndexOutOfRange`]; checked
    /// before anything is allocated. Then
    /// [`EmbeddingError::AllocationFailed`] if a gradient cannot be
    /// allocated.
    pub fn backward<I: Index>(
        &self,
        grad_output: &[f32],
        ids: &[I],
        batch: usize,
        seq_len: usize,
    ) -> Result<InputGrads, EmbeddingError> {
        let valid = self.check_backward(grad_output, ids, batch, seq_len)?;
        let (dim, par) = (self.embedding_dim(), self.parallelism);
        let mut tokens = crate::memory::zeroed_floats(self.tokens.weight().len(), "gradient")?;
        let positions = match &self.positions {
            Positions::Fixed(_) => {
                // Trick 4: the token half of the kernel only.
                match self.scale {
                    None => scatter_add_with(par, grad_output, dim, ids, &mut tokens)?,
                    Some(s) => scatter_add_scaled_with(par, grad_output, dim, ids, s, &mut tokens)?,
                }
                None
            }
            Positions::Learned(table) => {
                let mut grad = crate::memory::zeroed_floats(table.weight().len(), "gradient")?;
                embed_positions_backward_with(
                    par,
                    grad_output,
                    dim,
                    ids,
                    seq_len,
                    self.scale,
                    &mut tokens,
                    &mut grad,
                )?;
                if let Some(p) = table.padding_idx() {
                    grad[p * dim..(p + 1) * dim].fill(0.0);
                }
                Some(grad)
            }
        };
        apply_token_options(&self.tokens, valid, &mut tokens)?;
        Ok(InputGrads { tokens, positions })
    }

    /// Backward and one SGD step for both tables, without storing a dense
    /// gradient: the token table by [`Embedding::sparse_step`] on
    /// `grad_output * scale` (only the rows the batch touched change), a
    /// learned position table by the same on rows `0..seq_len` with their
    /// summed gradient. Without weight decay, the tables end up as a dense
    /// SGD step with [`backward`](Self::backward)'s gradients would leave
    /// them, bit for bit; weight decay, as in every fused step of the crate,
    /// applies to touched rows only. Frozen tables and padding rows do not
    /// change; a fixed position table never does.
    ///
    /// Only SGD is offered: it has no state, so every argument can be checked
    /// before either table changes. A stateful optimiser per table could fail
    /// on the second table after the first had moved.
    ///
    /// # Errors
    /// As [`backward`](Self::backward), or
    /// [`EmbeddingError::InvalidArgument`] for a bad learning rate or weight
    /// decay; then neither table has changed.
    pub fn sparse_sgd_step<I: Index>(
        &mut self,
        grad_output: &[f32],
        ids: &[I],
        batch: usize,
        seq_len: usize,
        sgd: &Sgd,
    ) -> Result<(), EmbeddingError> {
        let valid = self.check_backward(grad_output, ids, batch, seq_len)?;
        sgd.validate()?;
        let dim = self.embedding_dim();
        let mut rule = *sgd;
        // Every workspace before either table changes: the position
        // gradient, the scaled token gradient, both groupings.
        let mut positions_step = None;
        if let Positions::Learned(table) = &self.positions
            && !table.is_frozen()
        {
            let grad = sum_over_batch(grad_output, dim, seq_len)?;
            let mut arange = crate::buffer::with_capacity(seq_len, "workspace")?;
            arange.extend(0..seq_len);
            // `seq_len <= max_len`, checked above: valid ids.
            let groups = table.step_groups(ValidIds::new(&arange, self.max_len)?)?;
            positions_step = Some((grad, groups));
        }
        let mut tokens_step = None;
        if !self.tokens.is_frozen() {
            let scaled = match self.scale {
                None => None,
                Some(s) => {
                    let mut scaled = crate::buffer::with_capacity(grad_output.len(), "gradient")?;
                    scaled.extend(grad_output.iter().map(|&g| g * s));
                    Some(scaled)
                }
            };
            tokens_step = Some((scaled, self.tokens.step_groups(valid)?));
        }
        // SGD has no state: neither step below can fail.
        if let (Some((grad, groups)), Positions::Learned(table)) =
            (positions_step, &mut self.positions)
        {
            table.step_grouped(&grad, &groups, &mut rule)?;
        }
        if let Some((scaled, groups)) = tokens_step {
            let grad = scaled.as_deref().unwrap_or(grad_output);
            self.tokens.step_grouped(grad, &groups, &mut rule)?;
        }
        Ok(())
    }

    /// `ids.len()` ids as `[batch, seq_len]`, and a sequence that fits.
    fn check_batch(&self, len: usize, batch: usize, seq_len: usize) -> Result<(), EmbeddingError> {
        check_shape(len, &[batch, seq_len])?;
        if seq_len > self.max_len {
            return Err(EmbeddingError::SequenceTooLong {
                seq_len,
                max_len: self.max_len,
            });
        }
        Ok(())
    }

    /// Every check of a backward call, in the crate's order.
    fn check_backward<'a, I: Index>(
        &self,
        grad_output: &[f32],
        ids: &'a [I],
        batch: usize,
        seq_len: usize,
    ) -> Result<ValidIds<'a, I::Row>, EmbeddingError> {
        self.check_batch(ids.len(), batch, seq_len)?;
        let len = rows_len(ids.len(), self.embedding_dim())?;
        check_len(Operand::GradOutput, len, grad_output.len())?;
        ValidIds::new(ids, self.tokens.num_embeddings())
    }
}

/// `Some(sqrt(dim))` when asked for: the `f32` square root, correctly
/// rounded, which is also PyTorch's `math.sqrt(d)` rounded to `f32`.
fn sqrt_dim(dim: usize, wanted: bool) -> Option<f32> {
    wanted.then(|| (dim as f32).sqrt())
}

/// The token table's gradient options, applied to the summed gradient
/// `grad` of `ids` as [`Embedding::backward_dense`] applies them: each row
/// whose id occurs `n > 1` times divided by `n` (`scale_grad_by_freq`), then
/// the padding row set to zeros.
///
/// Fails only when the counts cannot be allocated.
fn apply_token_options<I: RowId>(
    tokens: &Embedding,
    ids: ValidIds<'_, I>,
    grad: &mut [f32],
) -> Result<(), EmbeddingError> {
    let dim = tokens.embedding_dim();
    if tokens.scale_grad_by_freq() {
        let mut counts = crate::buffer::zeroed::<usize>(tokens.num_embeddings(), "workspace")?;
        for row in ids.rows() {
            counts[row] += 1;
        }
        for (row, &count) in grad.chunks_exact_mut(dim).zip(&counts) {
            if count > 1 {
                let count = count as f32;
                row.iter_mut().for_each(|x| *x /= count);
            }
        }
    }
    if let Some(p) = tokens.padding_idx() {
        grad[p * dim..(p + 1) * dim].fill(0.0);
    }
    Ok(())
}

/// `Σ_b grad_output[b, t, :]` for `t` in `0..seq_len`, summed from `+0.0`
/// for `b = 0, 1, …` in order: the position gradient of the fused backward,
/// with the same bits.
/// Fails only when the sums cannot be allocated.
fn sum_over_batch(
    grad_output: &[f32],
    dim: usize,
    seq_len: usize,
) -> Result<Vec<f32>, EmbeddingError> {
    // `seq_len × dim` fits: `seq_len <= max_len`, and the position table
    // holds `max_len × dim` values.
    let mut sum = crate::buffer::zeroed::<f32>(rows_len(seq_len, dim)?, "gradient")?;
    if !sum.is_empty() {
        for sequence in grad_output.chunks_exact(sum.len()) {
            sum.iter_mut().zip(sequence).for_each(|(s, &g)| *s += g);
        }
    }
    Ok(sum)
}
