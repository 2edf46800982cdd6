//! Test helpers shared by the integration tests: local rayon pools, bit
//! comparisons, a deterministic value generator and id patterns.

#![allow(dead_code)]

use rayon::{ThreadPool, ThreadPoolBuilder};
use std::sync::OnceLock;

/// Local pools of 1, 2, 3 and 8 threads (never the global pool).
pub fn pools() -> &'static [ThreadPool] {
    static POOLS: OnceLock<Vec<ThreadPool>> = OnceLock::new();
    POOLS.get_or_init(|| {
        [1, 2, 3, 8]
            .iter()
            .map(|&n| ThreadPoolBuilder::new().num_threads(n).build().unwrap())
            .collect()
    })
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A small deterministic generator, so big tables cost nothing to shrink.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Values of very different magnitudes (so summation order shows in the
    /// bits), with the odd `-0.0`.
    pub fn value(&mut self) -> f32 {
        let r = self.next();
        if r.is_multiple_of(97) {
            return -0.0;
        }
        let mantissa = (r >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let exponent = ((r >> 8) % 24) as i32 - 12;
        mantissa * 2f32.powi(exponent)
    }

    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }

    /// A value in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// A value of any magnitude from 2^-12 to 2^12 (and now and then `-0.0`),
    /// so that the order of a sum shows in its bits.
    pub fn wild(&mut self) -> f32 {
        let r = self.next();
        if r.is_multiple_of(89) {
            return -0.0;
        }
        let exponent = ((r >> 8) % 25) as i32 - 12;
        self.unit() * 2f32.powi(exponent)
    }

    pub fn wilds(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.wild()).collect()
    }

    pub fn units(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

/// How the ids of a case are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Pattern {
    /// Uniform over all rows.
    Uniform,
    /// Only from a handful of rows.
    FewDistinct,
    /// 90 % one row, the rest uniform.
    Hot,
}

pub fn draw_ids(rows: usize, n: usize, pattern: Pattern, seed: u64) -> Vec<u64> {
    let mut rng = SplitMix(seed ^ 0xA5A5);
    let rows = rows as u64;
    let few: Vec<u64> = (0..3).map(|_| rng.next() % rows).collect();
    let hot = rng.next() % rows;
    (0..n)
        .map(|_| match pattern {
            Pattern::Uniform => rng.next() % rows,
            Pattern::FewDistinct => few[(rng.next() % 3) as usize],
            Pattern::Hot if !rng.next().is_multiple_of(10) => hot,
            Pattern::Hot => rng.next() % rows,
        })
        .collect()
}

pub fn convert<I: TryFrom<u64>>(ids: &[u64]) -> Vec<I> {
    ids.iter()
        .map(|&id| I::try_from(id).ok().expect("test ids fit every type"))
        .collect()
}
