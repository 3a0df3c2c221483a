//! A product's activation rows, with the sums the formats with an offset need.
//!
//! A weight `w = a · q + b` contributes `b · Σ x` over each half of a part (see
//! `blocks`): the sum of the activations at those inputs, the same for every column. It
//! is computed once per product, per row and per run of 16 inputs (every half of every
//! format is one or two such runs, starting at a multiple of 16), not once per column.

use super::simd::Simd;
use super::{Half, Line, LANES};

/// `m` rows of `k` activations, and for formats with an offset the sum of each run of 16
/// (`k / 16` a row; empty when no format of the product needs them); the first rows may
/// also come in lanes ([`Lanes`]), for the kernel that takes them so.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub x: &'a [f32],
    pub sums: &'a [f32],
    pub k: usize,
    pub lanes: Lanes<'a>,
}

impl<'a> Rows<'a> {
    /// The rows from row `r` on (`r > 0`: none in lanes).
    #[inline(always)]
    pub fn from(self, r: usize) -> Self {
        Rows {
            x: &self.x[(r * self.k).min(self.x.len())..],
            sums: &self.sums[(r * self.k / LANES).min(self.sums.len())..],
            k: self.k,
            lanes: if r == 0 { self.lanes } else { Lanes::NONE },
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

/// The first `rows` rows of a product in groups of 16, each group transposed: input `i` of
/// the group's rows is one vector, lane `r` holding row `16 g + r` (rows past `rows` are
/// zero, and their outputs never stored), and so are their run sums. The kernel that puts
/// rows in the vector lanes (`kernel::lanes`) reads them so.
#[derive(Clone, Copy)]
pub(super) struct Lanes<'a> {
    /// Group `g`'s inputs at `g * k ..`.
    pub x: &'a [Line],
    /// Group `g`'s run sums at `g * k / 16 ..` (empty without them).
    pub sums: &'a [Line],
    /// Rows held (the last group holds fewer than 16 if this is no multiple of 16).
    pub rows: usize,
}

impl Lanes<'_> {
    /// No rows.
    pub const NONE: Self = Lanes {
        x: &[],
        sums: &[],
        rows: 0,
    };
}

/// The storage of [`Lanes`].
pub(super) struct LaneRows {
    x: Vec<Line>,
    sums: Vec<Line>,
    rows: usize,
}

impl LaneRows {
    /// The first `rows` rows of `x` (rows of `k`), and of their run sums `sums` (empty for
    /// none), in lanes.
    pub fn new(x: &[f32], sums: &[f32], k: usize, rows: usize) -> Self {
        LaneRows {
            x: transpose(x, k, rows),
            sums: transpose(sums, k / LANES, if sums.is_empty() { 0 } else { rows }),
            rows,
        }
    }

    pub fn lanes(&self) -> Lanes<'_> {
        Lanes {
            x: &self.x,
            sums: &self.sums,
            rows: self.rows,
        }
    }
}

/// The first `rows` rows of `v` (rows of `len`) in groups of 16, each group `len` vectors
/// of its rows' values (lane `r` = the group's row `r`; zero past `rows`).
fn transpose(v: &[f32], len: usize, rows: usize) -> Vec<Line> {
    let mut out = vec![Line::ZERO; rows.div_ceil(LANES) * len];
    if len == 0 {
        return out;
    }
    let v = &v[..(rows * len).min(v.len())];
    for (rows, group) in v.chunks(LANES * len).zip(out.chunks_exact_mut(len)) {
        // Blocks of 16 inputs: 16 rows' worth read (a line each), 16 lines written.
        for (b, lines) in group.chunks_mut(LANES).enumerate() {
            for (r, row) in rows.chunks_exact(len).enumerate() {
                let run = &row[b * LANES..(b * LANES + lines.len())];
                for (line, &value) in lines.iter_mut().zip(run) {
                    line.0[r] = value;
                }
            }
        }
    }
    out
}

/// [`half_sum`] for the 16 rows of a group at once, from their run sums in lanes: each
/// lane is the same additions in the same order as its row's.
#[inline(always)]
pub(super) fn half_sum_lanes<S: Simd>(s: S, sums: &[Line], first: usize, len: usize) -> S::V {
    let runs = &sums[first / LANES..(first + len) / LANES];
    let mut total = s.load(&runs[0].0);
    for r in &runs[1..] {
        total = s.add(total, s.load(&r.0));
    }
    total
}
