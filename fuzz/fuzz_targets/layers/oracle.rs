//! The scalar oracle of the `layers` target: a plain restatement of what the
//! README and the module docs of `embedding.rs`, `embedding_bag.rs` and
//! `optim.rs` promise, kept apart from the crate (it never calls it).
//!
//! [`Model`] holds the table and the optimiser states the layer should have;
//! each `expect_*` function says whether a call is one the layer can serve
//! and, if so, what it returns, and applies the call's effect to the model.

use embedding_kernels::Mode;

/// The optimisers of the fused steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opt {
    Sgd,
    Adagrad,
    RowWise,
}

/// The hyper-parameters of one step (each optimiser reads those it has).
#[derive(Clone, Copy, Debug)]
pub struct Hyper {
    pub lr: f32,
    pub weight_decay: f32,
    pub eps: f32,
    pub lr_decay: f32,
    pub initial: f32,
}

/// What the optimiser requires of each of its hyper-parameters: finite and
/// not negative.
fn usable(x: f32) -> bool {
    x.is_finite() && x >= 0.0
}

impl Hyper {
    /// Whether `opt` accepts these values.
    pub fn valid(&self, opt: Opt) -> bool {
        let common = usable(self.lr) && usable(self.weight_decay);
        match opt {
            Opt::Sgd => common,
            Opt::Adagrad => {
                common && usable(self.lr_decay) && usable(self.eps) && usable(self.initial)
            }
            Opt::RowWise => common && usable(self.eps) && usable(self.initial),
        }
    }
}

/// The layer as its documentation describes it.
#[derive(Clone, Debug)]
pub struct Model {
    pub weight: Vec<f32>,
    pub rows: usize,
    pub dim: usize,
    pub padding: Option<usize>,
    pub max_norm: Option<f32>,
    pub norm_type: f32,
    pub scale_grad_by_freq: bool,
    pub frozen: bool,
    pub mode: Mode,
    /// Adagrad's accumulators (empty before its first step) and step count.
    pub adagrad: Vec<f32>,
    pub adagrad_steps: u64,
    /// Row-wise Adagrad's accumulators.
    pub rowwise: Vec<f32>,
}

/// The row `padding_idx` names in a table of `rows` rows (negative counts
/// from the end, as in PyTorch): `Some(None)` without one, `None` when it is
/// out of range (the documented error).
pub fn padding_row(padding_idx: Option<i64>, rows: usize) -> Option<Option<usize>> {
    let Some(p) = padding_idx else {
        return Some(None);
    };
    let row = if p < 0 {
        i128::from(p) + rows as i128
    } else {
        i128::from(p)
    };
    (0..rows as i128)
        .contains(&row)
        .then_some(Some(row as usize))
}

/// The `p`-norm of a row as `Embedding`'s notes define it, summed in `f64`:
/// 0 counts the non-zeros, ±inf take the largest or smallest magnitude.
pub fn norm(row: &[f32], p: f32) -> f64 {
    let mut magnitudes = row.iter().map(|&x| f64::from(x).abs());
    match p {
        2.0 => magnitudes.map(|m| m * m).sum::<f64>().sqrt(),
        1.0 => magnitudes.sum(),
        0.0 => magnitudes.filter(|&m| m != 0.0).count() as f64,
        f32::INFINITY => magnitudes.fold(0.0, f64::max),
        f32::NEG_INFINITY => magnitudes.fold(f64::INFINITY, f64::min),
        _ => {
            let p = f64::from(p);
            let mut sum = 0.0;
            for m in magnitudes.by_ref() {
                sum += m.powf(p);
            }
            sum.powf(1.0 / p)
        }
    }
}

impl Model {
    /// Whether `id` names a row.
    pub fn valid(&self, id: i128) -> bool {
        (0..self.rows as i128).contains(&id)
    }

    /// The rows of `ids`, if every one is valid.
    pub fn rows_of(&self, ids: &[i128]) -> Option<Vec<usize>> {
        ids.iter()
            .map(|&id| self.valid(id).then_some(id as usize))
            .collect()
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.weight[r * self.dim..(r + 1) * self.dim]
    }

    /// `max_norm`: each distinct row of `rows` whose norm exceeds it scaled
    /// by `max_norm / (norm + 1e-7)`, once.
    pub fn renorm(&mut self, rows: &[usize]) {
        let Some(max_norm) = self.max_norm else {
            return;
        };
        let mut distinct = rows.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let dim = self.dim;
        for r in distinct {
            let row = &mut self.weight[r * dim..(r + 1) * dim];
            let n = norm(row, self.norm_type);
            if n > f64::from(max_norm) {
                let scale = (f64::from(max_norm) / (n + 1e-7)) as f32;
                for x in row {
                    *x *= scale;
                }
            }
        }
    }

    /// The looked-up rows, one after the other.
    pub fn gather(&self, rows: &[usize]) -> Vec<f32> {
        rows.iter().flat_map(|&r| self.row(r).to_vec()).collect()
    }

    /// The dense gradient of `contributions` (position `p` adds `row` to row
    /// `r`): every row summed from `+0.0` in position order, divided by its
    /// count when it has more than one contribution and `scale_grad_by_freq`
    /// is set; the padding row zero.
    pub fn dense_grad(&self, contributions: &[(usize, Vec<f32>)]) -> Vec<f32> {
        let dim = self.dim;
        let mut grad = vec![0.0f32; self.rows * dim];
        let mut counts = vec![0usize; self.rows];
        for (r, row) in contributions {
            if Some(*r) == self.padding {
                continue;
            }
            counts[*r] += 1;
            for (g, &x) in grad[r * dim..(r + 1) * dim].iter_mut().zip(row) {
                *g += x;
            }
        }
        if self.scale_grad_by_freq {
            for (r, &count) in counts.iter().enumerate() {
                if count > 1 {
                    for g in &mut grad[r * dim..(r + 1) * dim] {
                        *g /= count as f32;
                    }
                }
            }
        }
        grad
    }

    /// The rows a sparse gradient or a fused step touches: the distinct rows
    /// of `contributions`, ascending, less the padding row.
    pub fn touched(&self, contributions: &[(usize, Vec<f32>)]) -> Vec<usize> {
        let mut rows: Vec<usize> = contributions
            .iter()
            .map(|&(r, _)| r)
            .filter(|&r| Some(r) != self.padding)
            .collect();
        rows.sort_unstable();
        rows.dedup();
        rows
    }

    /// Whether the optimiser's state fits this table (or is still to be made).
    pub fn state_fits(&self, opt: Opt) -> bool {
        match opt {
            Opt::Sgd => true,
            Opt::Adagrad => self.adagrad.is_empty() || self.adagrad.len() == self.rows * self.dim,
            Opt::RowWise => self.rowwise.is_empty() || self.rowwise.len() == self.rows,
        }
    }

    /// One optimiser step on `rows` (ascending, no padding), row `rows[k]`
    /// taking gradient `grad(rows[k])`. A frozen table changes nothing, the
    /// optimiser's state included.
    pub fn step(&mut self, opt: Opt, h: Hyper, rows: &[usize], grad: impl Fn(usize) -> Vec<f32>) {
        if self.frozen {
            return;
        }
        let dim = self.dim;
        // A starting value of -0.0 starts the accumulators at +0.0: the
        // sign of a zero sum of squares is not part of the contract.
        let initial = if h.initial == 0.0 { 0.0 } else { h.initial };
        let clr = match opt {
            Opt::Adagrad => {
                if self.adagrad.is_empty() && self.rows * dim > 0 {
                    self.adagrad = vec![initial; self.rows * dim];
                }
                self.adagrad_steps += 1;
                h.lr / (1.0 + (self.adagrad_steps - 1) as f32 * h.lr_decay)
            }
            Opt::RowWise => {
                if self.rowwise.is_empty() && self.rows > 0 {
                    self.rowwise = vec![initial; self.rows];
                }
                h.lr
            }
            Opt::Sgd => h.lr,
        };
        let wd = h.weight_decay;
        // PyTorch's rule: the decay term only when the decay is not zero.
        let decayed = |w: f32, g: f32| if wd == 0.0 { g } else { g + wd * w };
        for &r in rows {
            let g = grad(r);
            let w = &mut self.weight[r * dim..(r + 1) * dim];
            match opt {
                Opt::Sgd => {
                    for (w, &g) in w.iter_mut().zip(&g) {
                        *w -= clr * decayed(*w, g);
                    }
                }
                Opt::Adagrad => {
                    let s = &mut self.adagrad[r * dim..(r + 1) * dim];
                    for ((w, &g), s) in w.iter_mut().zip(&g).zip(s) {
                        let g = decayed(*w, g);
                        *s += g * g;
                        *w += -clr * (g / (s.sqrt() + h.eps));
                    }
                }
                Opt::RowWise => {
                    let mut squares = 0.0f32;
                    for (&w, &g) in w.iter().zip(&g) {
                        let g = decayed(w, g);
                        squares += g * g;
                    }
                    self.rowwise[r] += squares / dim.max(1) as f32;
                    let step = clr / (self.rowwise[r].sqrt() + h.eps);
                    for (w, &g) in w.iter_mut().zip(&g) {
                        *w -= step * decayed(*w, g);
                    }
                }
            }
        }
    }
}

/// One bag pooled as `EmbeddingBag`'s notes say: the kept rows (padding
/// left out) summed in position order from `-0.0`, times their per-sample
/// weights; mean divides that sum by the kept count; max takes each column's
/// first strictly largest value (a NaN, once taken, is never replaced) and
/// its id. An empty bag is `+0.0` (and id -1).
pub fn pool(
    model: &Model,
    positions: core::ops::Range<usize>,
    rows: &[usize],
    weights: Option<&[f32]>,
) -> (Vec<f32>, Vec<i64>) {
    let dim = model.dim;
    let kept: Vec<usize> = positions
        .filter(|&p| Some(rows[p]) != model.padding)
        .collect();
    if kept.is_empty() {
        let winners = if model.mode == Mode::Max {
            vec![-1; dim]
        } else {
            Vec::new()
        };
        return (vec![0.0; dim], winners);
    }
    if model.mode == Mode::Max {
        let mut out = vec![0.0; dim];
        let mut winners = vec![0i64; dim];
        for j in 0..dim {
            let mut best = (model.row(rows[kept[0]])[j], rows[kept[0]]);
            for &p in &kept[1..] {
                let x = model.row(rows[p])[j];
                if x > best.0 {
                    best = (x, rows[p]);
                }
            }
            out[j] = best.0;
            winners[j] = best.1 as i64;
        }
        return (out, winners);
    }
    let mut sum = vec![-0.0f32; dim];
    for &p in &kept {
        for (s, &x) in sum.iter_mut().zip(model.row(rows[p])) {
            *s += match weights {
                Some(w) => x * w[p],
                None => x,
            };
        }
    }
    if model.mode == Mode::Mean {
        for s in &mut sum {
            *s /= kept.len() as f32;
        }
    }
    (sum, Vec::new())
}

/// The per-position gradient rows of a sum or mean bag backward: position
/// `p` of bag `b` (padding left out) takes `grad[b]`, times its weight (sum)
/// or `1 / kept` (mean, the reciprocal rounded to `f32` first).
pub fn bag_contributions(
    model: &Model,
    bags: &[core::ops::Range<usize>],
    rows: &[usize],
    weights: Option<&[f32]>,
    grad: &[f32],
) -> Vec<(usize, Vec<f32>)> {
    let dim = model.dim;
    let mut out = Vec::new();
    for (b, bag) in bags.iter().enumerate() {
        let kept: Vec<usize> = bag
            .clone()
            .filter(|&p| Some(rows[p]) != model.padding)
            .collect();
        let g = &grad[b * dim..(b + 1) * dim];
        for &p in &kept {
            let factor = match (model.mode, weights) {
                (Mode::Mean, _) => Some(1.0 / kept.len() as f32),
                (_, Some(w)) => Some(w[p]),
                (_, None) => None,
            };
            let row = g.iter().map(|&x| factor.map_or(x, |f| x * f)).collect();
            out.push((rows[p], row));
        }
    }
    out
}
