//! A product's activation rows, with the sums the formats with an offset need.
//!
//! A weight `w = a · q + b` contributes `b · Σ x` over each half of a part (see
//! `blocks`): the sum of the activations at those inputs, the same for every column. It
//! is computed once per product, per row and per run of 16 inputs (every half of every
//! format is one or two such runs, starting at a multiple of 16), not once per column.

use super::{Half, LANES};

/// `m` rows of `k` activations, and for formats with an offset the sum of each run of 16
/// (`k / 16` a row; empty when no format of the product needs them).
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub x: &'a [f32],
    pub sums: &'a [f32],
    pub k: usize,
}

impl<'a> Rows<'a> {
    /// The rows from row `r` on.
    #[inline(always)]
    pub fn from(self, r: usize) -> Self {
        Rows {
            x: &self.x[(r * self.k).min(self.x.len())..],
            sums: &self.sums[(r * self.k / LANES).min(self.sums.len())..],
            k: self.k,
        }
    }

    /// Row `r`'s activations, in chunks of 16, and its sums (empty without them).
    #[inline(always)]
    pub fn row(self, r: usize) -> (&'a [Half], &'a [f32]) {
        let x = &self.x[r * self.k..(r + 1) * self.k];
        let per_row = self.k / LANES;
        let sums = self.sums.get(r * per_row..(r + 1) * per_row).unwrap_or(&[]);
        (x.as_chunks::<LANES>().0, sums)
    }
}

/// The sum of each run of 16 activations of `x` (whole rows of a multiple of 16), always
/// in the same order: a tree over the run (lanes `i` and `i + 8`, then `i + 4`, `+ 2`,
/// `+ 1`), so that every kernel path and every batch gets the same bits.
pub(super) fn run_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(LANES)
        .map(|run| {
            let mut v: Half = [0.0; LANES];
            v.copy_from_slice(run);
            let mut width = LANES / 2;
            while width > 0 {
                for i in 0..width {
                    v[i] += v[i + width];
                }
                width /= 2;
            }
            v[0]
        })
        .collect()
}

/// The sum of `x` over the half of a part whose first input is `first` (a multiple of
/// 16) and whose length is `len` (16 or 32), from a row's run sums: the runs added left
/// to right.
#[inline(always)]
pub(super) fn half_sum(sums: &[f32], first: usize, len: usize) -> f32 {
    let runs = &sums[first / LANES..(first + len) / LANES];
    let mut total = runs[0];
    for r in &runs[1..] {
        total += r;
    }
    total
}
