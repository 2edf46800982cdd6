//! The task planner: cuts the groups (and, for a dense sweep, the untouched
//! rows between them) into tasks of disjoint rows (trick 4 of the folder's
//! notes), splits hot rows into column blocks (trick 5), carves the table
//! and the optimiser state into one slice per task, and runs the tasks.

use super::Groups;
use crate::kernels::tuning::{GROUP_TASK_BYTES, LINE_FLOATS};
use crate::simd::{Body, Isa, Lanes};
use core::ops::Range;

/// One task: groups `groups`, covering `span` (table rows, or group
/// indices for a coalesced gradient), columns `cols`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Task {
    pub(crate) groups: Range<usize>,
    pub(crate) span: Range<usize>,
    pub(crate) cols: Range<usize>,
}

/// What the tasks index: table rows (dense and fused) or groups (coalesced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    /// Spans are table rows; with `Some(rows)`, every row of `0..rows` must
    /// be covered (the dense backward writes untouched rows too).
    Rows(Option<usize>),
    /// Spans are group indices (one output row per group).
    Groups,
}

/// Cuts the groups (and, for a dense sweep, the untouched rows between
/// them) into tasks of about a task budget each; a group heavier than that
/// becomes column-block tasks when `split_hot` and `dim` allow (trick 5).
///
/// Task spans never overlap, except the column blocks of one hot row, which
/// follow each other; for `Space::Rows(Some(rows))` they cover `0..rows`.
pub(crate) fn plan(
    groups: &Groups,
    dim: usize,
    space: Space,
    split_hot: bool,
    budget: usize,
) -> Vec<Task> {
    let budget = budget.max(dim);
    let (dense, total) = match space {
        Space::Rows(Some(rows)) => (true, rows),
        _ => (false, 0),
    };
    let unit = |g: usize| match space {
        Space::Rows(_) => groups.rows[g],
        Space::Groups => g,
    };
    let mut p = Planner {
        tasks: Vec::new(),
        dim,
        chunk: (budget / dim.max(1)).max(1),
        g0: 0,
        s0: 0,
        end: 0,
        cost: 0,
    };
    for g in 0..groups.len() {
        let u = unit(g);
        // Saturating: a bag's positions may be many more than its gradient
        // rows, and this is only a cost.
        let weight = (groups.positions(g).len() + 1).saturating_mul(dim);
        if dense {
            let gap = (u - p.end) * dim;
            if p.g0 < g && p.cost + gap > budget {
                p.close(g);
            }
            if p.g0 == g && gap > budget {
                // A long stretch of untouched rows: zero-only tasks.
                p.zeros(u);
            }
            p.cost += (u - p.end) * dim;
        } else if p.g0 == g {
            p.s0 = u;
        }
        if split_hot && weight > budget && dim >= 2 * LINE_FLOATS {
            // Trick 5: the hot row alone, in column blocks of whole lines.
            if p.g0 < g {
                p.close(g);
            }
            if dense {
                p.zeros(u);
            }
            let blocks = (weight / budget).clamp(2, dim / LINE_FLOATS);
            let mut cut = 0;
            for k in 1..=blocks {
                let next = if k == blocks {
                    dim
                } else {
                    // In u128: `k × dim` may pass usize for a very wide row.
                    let at = k as u128 * dim as u128 / blocks as u128;
                    at as usize / LINE_FLOATS * LINE_FLOATS
                };
                if next > cut {
                    p.tasks.push(Task {
                        groups: g..g + 1,
                        span: u..u + 1,
                        cols: cut..next,
                    });
                    cut = next;
                }
            }
            (p.g0, p.s0, p.end, p.cost) = (g + 1, u + 1, u + 1, 0);
            continue;
        }
        p.cost += weight;
        p.end = u + 1;
        if p.cost >= budget {
            p.close(g + 1);
        }
    }
    if p.g0 < groups.len() {
        p.close(groups.len());
    }
    if dense {
        p.zeros(total);
    }
    p.tasks
}

/// The state of [`plan`]: the open run of groups `g0..` over span `s0..end`.
struct Planner {
    tasks: Vec<Task>,
    dim: usize,
    /// Units per zero-only task.
    chunk: usize,
    g0: usize,
    s0: usize,
    end: usize,
    cost: usize,
}

impl Planner {
    /// Ends the open run before group `g`.
    fn close(&mut self, g: usize) {
        self.tasks.push(Task {
            groups: self.g0..g,
            span: self.s0..self.end,
            cols: 0..self.dim,
        });
        (self.g0, self.s0, self.cost) = (g, self.end, 0);
    }

    /// Zero-only tasks from the open (empty) run's start up to `unit`.
    fn zeros(&mut self, unit: usize) {
        while self.s0 < unit {
            let end = (self.s0 + self.chunk).min(unit);
            self.tasks.push(Task {
                groups: self.g0..self.g0,
                span: self.s0..end,
                cols: 0..self.dim,
            });
            self.s0 = end;
        }
        (self.end, self.cost) = (unit, 0);
    }
}

/// Carves `buf` (`width` floats per span unit) into one slice per task, in
/// task order. Column-split tasks of one span share its unit, split by
/// columns when `width == dim`; a `width` of 0 gives empty slices.
pub(crate) fn carve<'a, P>(
    tasks: &[Task],
    buf: &'a mut [P],
    width: usize,
    dim: usize,
) -> Vec<&'a mut [P]> {
    let mut parts = Vec::with_capacity(tasks.len());
    let mut rest = buf;
    let mut at = 0; // the span unit `rest` starts at
    let mut i = 0;
    while i < tasks.len() {
        let t = &tasks[i];
        let skip = (t.span.start - at) * width;
        let take = t.span.len() * width;
        let (_, tail) = core::mem::take(&mut rest).split_at_mut(skip);
        let (mine, tail) = tail.split_at_mut(take);
        rest = tail;
        at = t.span.end;
        // The column-split tasks of this one span, if any.
        let mut j = i + 1;
        while j < tasks.len() && tasks[j].span == t.span && t.cols != (0..dim) {
            j += 1;
        }
        if j == i + 1 {
            parts.push(mine);
        } else if width == dim {
            let mut unit = mine;
            for task in &tasks[i..j] {
                let (piece, tail) = core::mem::take(&mut unit).split_at_mut(task.cols.len());
                parts.push(piece);
                unit = tail;
            }
        } else {
            // A width that does not follow the columns: only the first task
            // gets the unit (callers never split such rows).
            parts.push(mine);
            for _ in i + 1..j {
                parts.push(Default::default());
            }
        }
        i = j;
    }
    parts
}

/// What a consumer does with one task: its part of the table (or of a
/// fresh output, `P` = `MaybeUninit<f32>`) and of the state, with lanes `V`.
/// Implementations are `#[inline(always)]`, so each task's loop is compiled
/// inside [`Isa::run`].
pub(crate) trait TaskBody<P = f32>: Sync {
    /// Runs task `t` on its part of the table and of the state.
    fn task<V: Lanes>(&self, t: &Task, part: &mut [P], state: &mut [f32]);
}

/// One task of a [`TaskBody`], as a [`Body`] for [`Isa::run`].
struct OneTask<'a, B, P> {
    body: &'a B,
    t: &'a Task,
    part: &'a mut [P],
    state: &'a mut [f32],
}

impl<P, B: TaskBody<P>> Body for OneTask<'_, B, P> {
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        self.body.task::<V>(self.t, self.part, self.state);
    }
}

/// Runs `body` on every task with its part of the table and of the state,
/// on the pool when `par`, else in order on the calling thread.
pub(crate) fn run<P: Send, B: TaskBody<P>>(
    par: bool,
    tasks: &[Task],
    table: Vec<&mut [P]>,
    state: Vec<&mut [f32]>,
    body: &B,
) {
    debug_assert_eq!(table.len(), tasks.len(), "one part of the table a task");
    debug_assert_eq!(state.len(), tasks.len(), "one part of the state a task");
    let isa = Isa::detect();
    let one = |((t, part), state): ((&Task, &mut [P]), &mut [f32])| {
        isa.run(OneTask {
            body,
            t,
            part,
            state,
        })
    };
    let work = tasks.iter().zip(table).zip(state);
    if par {
        crate::executor::for_each_part(work.collect(), |_, w| one(w));
    } else {
        work.for_each(one);
    }
}

/// Calls `f` once on each row of `weight` that `groups` touch, on the pool
/// when `par` (rows are disjoint, so the order does not matter).
pub(crate) fn for_each_row<F>(par: bool, groups: &Groups, weight: &mut [f32], dim: usize, f: F)
where
    F: Fn(&mut [f32]) + Sync,
{
    if dim == 0 || groups.len() == 0 {
        return;
    }
    let tasks = plan(groups, dim, Space::Rows(None), false, GROUP_TASK_BYTES / 4);
    let parts = carve(&tasks, weight, dim, dim);
    let none = tasks.iter().map(|_| Default::default()).collect();
    run(par, &tasks, parts, none, &EachRow { groups, dim, f });
}

/// One task of [`for_each_row`].
struct EachRow<'a, F> {
    groups: &'a Groups,
    dim: usize,
    f: F,
}

impl<F: Fn(&mut [f32]) + Sync> TaskBody for EachRow<'_, F> {
    #[inline(always)]
    fn task<V: Lanes>(&self, t: &Task, part: &mut [f32], _state: &mut [f32]) {
        let dim = self.dim;
        for g in t.groups.clone() {
            let r = self.groups.rows[g] - t.span.start;
            (self.f)(&mut part[r * dim..(r + 1) * dim]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::groups::tests::{groups_of, ids_with_a_hot_row, mix};
    use super::*;

    /// Every plan, for many shapes and tiny budgets: spans are disjoint and
    /// ascending (column blocks of one row excepted, which tile the row),
    /// every group sits in exactly one task (or all of a row's blocks) inside
    /// its span, and a dense plan covers every row.
    #[test]
    fn plans_partition_the_work() {
        let mut seed = 1;
        for _ in 0..400 {
            let rows = 1 + mix(&mut seed) as usize % 200;
            let dim = 1 + mix(&mut seed) as usize % 80;
            let n = mix(&mut seed) as usize % 300;
            let ids = ids_with_a_hot_row(&mut seed, rows, n);
            let groups = groups_of(rows, &ids);
            let budget = 1 + mix(&mut seed) as usize % 4000;
            for space in [Space::Rows(Some(rows)), Space::Rows(None), Space::Groups] {
                for split_hot in [false, true] {
                    let tasks = plan(&groups, dim, space, split_hot, budget);
                    let what = format!(
                        "rows {rows} dim {dim} n {n} budget {budget} {space:?} {split_hot}"
                    );
                    let mut seen = vec![0usize; groups.len()];
                    let mut covered = 0;
                    for (k, t) in tasks.iter().enumerate() {
                        assert!(
                            t.cols.start < t.cols.end && t.cols.end <= dim,
                            "{what}: {t:?}"
                        );
                        if t.cols != (0..dim) {
                            assert!(
                                split_hot && t.groups.len() == 1 && t.span.len() == 1,
                                "{what}"
                            );
                            assert_eq!(
                                t.cols.start % LINE_FLOATS,
                                0,
                                "{what}: blocks of whole lines"
                            );
                        }
                        let continues = k > 0 && tasks[k - 1].span == t.span && t.cols.start > 0;
                        if continues {
                            assert_eq!(tasks[k - 1].cols.end, t.cols.start, "{what}");
                        } else {
                            assert!(t.span.start >= covered, "{what}: {tasks:?}");
                            if space == Space::Rows(Some(rows)) {
                                assert_eq!(t.span.start, covered, "{what}: gap before {t:?}");
                            }
                            covered = t.span.end;
                        }
                        for g in t.groups.clone() {
                            let unit = match space {
                                Space::Groups => g,
                                Space::Rows(_) => groups.rows[g],
                            };
                            assert!(t.span.contains(&unit), "{what}: {t:?} {unit}");
                            if t.cols.start == 0 {
                                seen[g] += 1;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&c| c == 1), "{what}: {seen:?}");
                    if space == Space::Rows(Some(rows)) {
                        assert_eq!(covered, rows, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn carving_hands_each_task_its_own_rows() {
        let groups = groups_of(50, &[3, 3, 3, 3, 3, 3, 3, 3, 9, 10, 40]);
        let dim = 64;
        let tasks = plan(&groups, dim, Space::Rows(Some(50)), true, 64 * 4);
        let mut table: Vec<f32> = (0..50 * dim).map(|x| x as f32).collect();
        let parts = carve(&tasks, &mut table, dim, dim);
        assert_eq!(parts.len(), tasks.len());
        for (t, part) in tasks.iter().zip(parts) {
            let first = (t.span.start * dim + t.cols.start) as f32;
            assert_eq!(part.first().copied(), Some(first), "{t:?}");
            let len = if t.cols == (0..dim) {
                t.span.len() * dim
            } else {
                t.cols.len()
            };
            assert_eq!(part.len(), len, "{t:?}");
        }
    }
}
