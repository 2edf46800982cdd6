//! Kernels run on a caller's [`Executor`] give the bits they give on one
//! thread, whatever the executor does with the tasks it is handed (runs them
//! on three threads, or skips some and repeats others), refuse a bad id in
//! the same way and write nothing; and the executor is the one that ran them.

use crate::common::{SplitMix, bits};
use embedding_kernels::formats::{PackedTable, RowWise, TableRef};
use embedding_kernels::{
    Bags, Embedding, EmbeddingOptions, Executor, Mode, Parallelism, Pooling, Sgd,
    bag_backward_with, bag_forward_with, bag_sparse_step_with, dense_backward_with, gather_with,
    scatter_add_with, sparse_backward_with, sparse_step_with, table_bag_forward_with,
    with_executor,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs tasks on `threads` scoped threads taking indices from a counter.
/// A `sloppy` one runs only the even indices, then index 0 again and one
/// past the end: the kernels must still run every task once.
struct Threads {
    threads: usize,
    sloppy: bool,
    calls: AtomicUsize,
}

impl Executor for Threads {
    fn threads(&self) -> usize {
        self.threads
    }

    fn run(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..self.threads {
                s.spawn(|| {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= count {
                            break;
                        }
                        if !self.sloppy || k.is_multiple_of(2) {
                            task(k);
                        }
                    }
                });
            }
        });
        if self.sloppy {
            task(0);
            task(count);
        }
    }
}

/// `f(Serial)` on the calling thread, then `f(Rayon)` on each executor;
/// all must be equal, and with `split` (a call large enough to cut into
/// tasks) each executor must have been handed work.
fn same_on_executors<T: PartialEq + std::fmt::Debug>(
    what: &str,
    split: bool,
    f: impl Fn(Parallelism) -> T,
) {
    let want = f(Parallelism::Serial);
    for sloppy in [false, true] {
        let executor = Arc::new(Threads {
            threads: 3,
            sloppy,
            calls: AtomicUsize::new(0),
        });
        let got = with_executor(executor.clone(), || f(Parallelism::Rayon));
        assert_eq!(got, want, "{what}, sloppy {sloppy}");
        if split {
            let calls = executor.calls.load(Ordering::Relaxed);
            assert!(calls > 0, "{what}: the executor ran the tasks");
        }
    }
}

fn ids(rng: &mut SplitMix, rows: usize, n: usize) -> Vec<i64> {
    (0..n).map(|_| (rng.next() % rows as u64) as i64).collect()
}

fn pooling(mode: Mode, weights: Option<&[f32]>) -> Pooling<'_> {
    Pooling {
        mode,
        per_sample_weights: weights,
        padding_idx: Some(3),
        scale_grad_by_freq: false,
    }
}

#[test]
fn lookups_and_bags_are_the_same_bits_on_an_executor() {
    let mut rng = SplitMix(5);
    for dim in [1, 7, 16, 67, 128] {
        let rows = 300;
        let table = rng.values(rows * dim);
        let ids = ids(&mut rng, rows, 2_000);
        same_on_executors("gather", dim >= 16, |par| {
            let mut out = vec![f32::NAN; ids.len() * dim];
            gather_with(par, &table, dim, &ids, &mut out).unwrap();
            bits(&out)
        });
        let offsets: Vec<i64> = (0..ids.len() as i64).step_by(13).collect();
        let bags = Bags::from_offsets(&offsets, ids.len(), false).unwrap();
        let weights = rng.values(ids.len());
        for (mode, w) in [
            (Mode::Sum, Some(&weights[..])),
            (Mode::Mean, None),
            (Mode::Max, None),
        ] {
            same_on_executors("bag forward", dim >= 67, |par| {
                let mut out = vec![f32::NAN; bags.len() * dim];
                let mut max = vec![-7; bags.len() * dim];
                let p = pooling(mode, w);
                bag_forward_with(par, &table, dim, &ids, &bags, &p, &mut out, &mut max).unwrap();
                (bits(&out), max)
            });
        }
        for format in [RowWise::Int8, RowWise::Int4] {
            let packed = format.prepack(&table, dim).unwrap();
            same_on_executors("prepack", true, |par| {
                format.prepack_with(par, &table, dim).unwrap()
            });
            same_on_executors("dequantize", true, |par| {
                let mut out = vec![f32::NAN; table.len()];
                format.dequantize_with(par, &packed, dim, &mut out).unwrap();
                bits(&out)
            });
            let t = TableRef::packed(PackedTable::new(format, dim, &packed).unwrap());
            same_on_executors("packed bag sum", dim >= 67, |par| {
                let mut out = vec![f32::NAN; bags.len() * dim];
                let p = pooling(Mode::Sum, None);
                table_bag_forward_with(par, t, &ids, &bags, &p, &mut out, &mut []).unwrap();
                bits(&out)
            });
        }
    }
}

#[test]
fn backwards_and_steps_are_the_same_bits_on_an_executor() {
    let mut rng = SplitMix(9);
    for dim in [1, 9, 32, 130] {
        let rows = 200;
        // Few rows, many ids: hot rows, split into column blocks.
        let ids = ids(&mut rng, rows, 3_000);
        let grad = rng.values(ids.len() * dim);
        let table = rng.values(rows * dim);
        same_on_executors("scatter_add", dim >= 32, |par| {
            let mut g = table.clone();
            scatter_add_with(par, &grad, dim, &ids, &mut g).unwrap();
            bits(&g)
        });
        same_on_executors("dense backward", false, |par| {
            let mut g = vec![f32::NAN; table.len()];
            dense_backward_with(par, &grad, dim, &ids, Some(3), true, &mut g).unwrap();
            bits(&g)
        });
        same_on_executors("sparse backward", dim >= 32, |par| {
            let s = sparse_backward_with(par, &grad, dim, &ids, rows, None, false).unwrap();
            (s.indices().to_vec(), bits(s.values()))
        });
        same_on_executors("sparse SGD step", dim >= 32, |par| {
            let mut w = table.clone();
            let mut sgd = Sgd::new(0.25).with_weight_decay(0.01);
            sparse_step_with(par, &mut w, dim, &grad, &ids, Some(3), true, &mut sgd).unwrap();
            bits(&w)
        });
        let offsets: Vec<i64> = (0..ids.len() as i64).step_by(7).collect();
        let bags = Bags::from_offsets(&offsets, ids.len(), false).unwrap();
        let grad_bags = rng.values(bags.len() * dim);
        same_on_executors("bag backward", false, |par| {
            let mut g = vec![f32::NAN; table.len()];
            let p = pooling(Mode::Mean, None);
            bag_backward_with(par, &grad_bags, dim, &ids, &bags, &p, &mut g).unwrap();
            bits(&g)
        });
        same_on_executors("bag SGD step", dim >= 32, |par| {
            let mut w = table.clone();
            let p = pooling(Mode::Sum, None);
            let mut sgd = Sgd::new(0.5);
            bag_sparse_step_with(par, &mut w, dim, &grad_bags, &ids, &bags, &p, &mut sgd).unwrap();
            bits(&w)
        });
    }
}

/// Work the kernels split whatever the `Parallelism` (a layer's seeded
/// initialisation, a dense step over a table of 2^18 values or more), and a
/// dense backward into a table larger than the caches, are the same on an
/// executor too.
#[test]
fn initialisation_and_dense_steps_are_the_same_on_an_executor() {
    let (rows, dim) = (4_100, 70);
    let options = EmbeddingOptions {
        seed: Some(17),
        ..EmbeddingOptions::default()
    };
    same_on_executors("initialisation", true, |_| {
        let layer = Embedding::with_options(rows, dim, options.clone()).unwrap();
        bits(layer.weight())
    });
    let mut rng = SplitMix(2);
    let (table, grad) = (rng.values(rows * dim), rng.values(rows * dim));
    same_on_executors("dense SGD step", true, |_| {
        let mut w = table.clone();
        Sgd::new(0.1).step_dense(&mut w, &grad).unwrap();
        bits(&w)
    });
    // A gradient table too large for the caches is swept in tasks.
    let (rows, dim) = (70_000, 32);
    let ids = ids(&mut rng, rows, 20_000);
    let grad = rng.values(ids.len() * dim);
    same_on_executors("dense backward, swept", true, |par| {
        let mut g = vec![f32::NAN; rows * dim];
        dense_backward_with(par, &grad, dim, &ids, None, false, &mut g).unwrap();
        bits(&g)
    });
}

/// A bad id among many (the id check itself split) is refused with the
/// error of a one-thread call, and nothing is written.
#[test]
fn a_bad_id_on_an_executor_writes_nothing() {
    let (rows, dim) = (64, 16);
    let table = vec![1.5f32; rows * dim];
    for position in [0, 70_000, 199_999] {
        let mut ids = vec![5i64; 200_000];
        ids[position] = rows as i64;
        let want = gather_with(
            Parallelism::Serial,
            &table,
            dim,
            &ids,
            &mut vec![0.0; 200_000 * dim],
        );
        let executor = Arc::new(Threads {
            threads: 2,
            sloppy: false,
            calls: AtomicUsize::new(0),
        });
        let mut out = vec![f32::NAN; ids.len() * dim];
        let got = with_executor(executor.clone(), || {
            gather_with(Parallelism::Rayon, &table, dim, &ids, &mut out)
        });
        assert_eq!(got, want);
        assert!(got.is_err());
        assert!(out.iter().all(|x| x.is_nan()), "nothing written");
        assert!(
            executor.calls.load(Ordering::Relaxed) > 0,
            "the check was split"
        );
    }
}
