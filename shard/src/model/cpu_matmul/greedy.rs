//! The greedy token of an output layer's rows, exactly, without computing every logit.
//!
//! A greedy request that reports no score needs only its row's argmax: the token the full
//! product ranks first, ties to the smaller id (`sampling::order::argmax`). Over a
//! 49,152- or 262,144-token vocabulary that product is a fifth (SmolLM2) to three fifths
//! (Gemma 3) of a decode step's multiply-adds, and its log-softmax more. Here a cheaper, approximate product rules out the tokens that cannot be
//! first, and the exact kernel computes the tiles of the few that can:
//!
//! 1. Each row's inputs are rounded to 8 bits, a scale per block of 32: `x ≈ s r`, `|x - s
//!    r| ≤ h` ([`quantize`]). A Q8_0 matrix's quants are 8-bit integers too, so `Σ q r`
//!    is an exact integer, 64 products an instruction with AVX-512 VNNI where the exact
//!    kernel does 16 f32 multiply-adds: `Ã_v = Σ_b d_b s_b Σ_i q_i r_i` (`kernel`).
//! 2. The logit `L_v` the exact product computes lies in `[lo_v, hi_v] = Ã_v ∓ β_v`,
//!    `β_v` from `E_v = Σ_b |d_b| (Σ_i |q_i|) h_b`, which bounds `|Σ w x - Ã_v|` in real
//!    arithmetic, widened for the f32 rounding of `L_v` and of `Ã_v` (see [`margin`]).
//! 3. A token with `hi_v` below the largest `lo_u` has a logit strictly below token u's:
//!    it is neither the argmax nor tied with it. The tiles (16 columns) holding the other
//!    tokens are computed by the exact kernel, to the bits of the full product (each
//!    output is computed alone: `cpu_matmul`'s contract), and the first of their largest
//!    logits is the full row's argmax.
//!
//! So the token is the one the full product gives, always; only the time it takes depends
//! on how many tokens come near the first (typically a few tiles). Rows with a NaN or
//! infinite input, or a candidate logit that is not finite, get `None`: the caller computes
//! the full row, which then reports what the full path reports.

use std::sync::OnceLock;

use half::f16;

use super::blocks::{Q8_0, TILE};
use super::formats::Tiles;
use super::CpuQuantMatrix;
use crate::team::Team;

#[cfg(target_arch = "x86_64")]
mod kernel;
#[cfg(test)]
mod tests;

/// Elsewhere no CPU has the kernel's instructions: no index is ever made.
#[cfg(not(target_arch = "x86_64"))]
mod kernel {
    use super::{Column, Out, Rows};

    #[derive(Clone, Copy)]
    pub(super) struct Vnni;

    impl Vnni {
        pub(super) fn detect() -> Option<Self> {
            None
        }
        pub(super) fn tile(self, _: Column, _: Rows, _: Out) {}
    }
}

use kernel::Vnni;

/// One tile column's `nb` tiles and their index entries, the factor on `E`, and the
/// tiles to ask memory for meanwhile (the next column's, or none).
#[derive(Clone, Copy)]
struct Column<'a> {
    tiles: &'a [Q8_0],
    spread: &'a [[f32; TILE]],
    margin: f32,
    next: &'a [Q8_0],
}

/// Some rows of the quantized inputs: at most [`GROUP`].
struct Rows<'a> {
    q: &'a Quantized,
    range: std::ops::Range<usize>,
}

/// Where a group's bounds go: a row's 16 columns each.
struct Out<'a> {
    lo: &'a mut [[f32; TILE]; GROUP],
    hi: &'a mut [[f32; TILE]; GROUP],
}

/// Inputs of a Q8_0 block, and 4-input chunks of one (a VNNI lane's products).
const BLOCK: usize = 32;
const CHUNKS: usize = BLOCK / 4;
/// `1.5 · 2^23`: see [`quantize`].
const ROUND: f32 = 12_582_912.0;
/// Rows a kernel pass takes: their accumulators (an integer and an f32 one each) fit
/// AVX-512's 32 registers beside the quants.
const GROUP: usize = 8;
/// Tasks per thread for the approximate product, so uneven progress evens out.
const TASKS_PER_THREAD: usize = 4;

/// What the approximate product needs beyond a Q8_0 matrix's tiles: each column's
/// `spread = |d| Σ |q|`, per tile (16 columns) and block.
#[derive(Clone)]
pub(super) struct GreedyIndex {
    spread: Vec<[f32; TILE]>,
    vnni: Vnni,
}

impl GreedyIndex {
    /// The index of a Q8_0 matrix, on a CPU with AVX-512 VNNI and VBMI; `None` for other
    /// formats, other CPUs, or a scale that is not finite.
    pub(super) fn new(tiles: &Tiles) -> Option<Self> {
        let Tiles::Q8_0(tiles) = tiles else {
            return None;
        };
        let vnni = Vnni::detect()?;
        let spread = tiles.iter().map(spread).collect::<Option<Vec<_>>>()?;
        Some(GreedyIndex { spread, vnni })
    }

    /// Bytes the index takes.
    pub(super) fn bytes(&self) -> usize {
        self.spread.len() * size_of::<[f32; TILE]>()
    }
}

/// A tile's `|d| Σ |q|` per column; `None` if a scale is not finite.
fn spread(tile: &Q8_0) -> Option<[f32; TILE]> {
    let mut spread = [0f32; TILE];
    for (c, spread) in spread.iter_mut().enumerate() {
        let d = f16::from_bits(tile.scale_bits()[c]).to_f32();
        if !d.is_finite() {
            return None;
        }
        let abs: i32 = tile
            .quant_bytes_all()
            .iter()
            .map(|pair| {
                i32::from((pair[c] as i8).unsigned_abs())
                    + i32::from((pair[TILE + c] as i8).unsigned_abs())
            })
            .sum();
        // Exact: |d| is an f16 and Σ |q| ≤ 4096, 11 + 13 bits.
        *spread = d.abs() * abs as f32;
    }
    Some(spread)
}

/// Rows of inputs rounded to 8 bits per block of 32, as the kernel reads them.
pub(super) struct Quantized {
    nb: usize,
    /// Per row and block: the scale `s`.
    scale: Vec<f32>,
    /// Per row and block: `h ≥ |x - s r|` for each input of the block.
    half: Vec<f32>,
    /// Per row and block: `-128 Σ r`. The kernel multiplies `q + 128` (VNNI takes one
    /// unsigned operand, and the inputs are the broadcast one, which must be the signed),
    /// so `Σ (q + 128) r + corr = Σ q r`.
    corr: Vec<i32>,
    /// Per row, block and chunk: the chunk's 4 inputs `r`, a byte each, in the order the
    /// tile's quants come in (inputs `2c, 2c + 16, 2c + 1, 2c + 17` of the block: tile
    /// pairs `2c` and `2c + 1`).
    bytes: Vec<u32>,
}

impl Quantized {
    /// Rows held.
    fn rows(&self) -> usize {
        self.scale.len() / self.nb.max(1)
    }
}

/// `x` (rows of `k`, a multiple of 32) rounded as the kernel reads it; `None` if an input
/// is NaN or infinite.
///
/// Per block: `m = max |x|`, `s = m / 127`, `r = round(x · (127 / m))`. Then `|r - x/s|`
/// is at most `1/2` plus the two roundings of `x · (127 / m)` (≤ 127 · 2.0001 u, `u` =
/// 2^-24), and `s` itself is rounded once (≤ 127 u more on `|s r - x|`): `|x - s r| ≤ s ·
/// 0.500023`, which `h = s · 0.5001` covers. A block of `m < 1e-30` (all but zero) is
/// taken as zeros: `r = 0`, `h = m`.
pub(super) fn quantize(x: &[f32], k: usize) -> Option<Quantized> {
    if k == 0 || !k.is_multiple_of(BLOCK) || !x.iter().all(|v| v.is_finite()) {
        return None;
    }
    let nb = k / BLOCK;
    let blocks = x.len() / BLOCK;
    let mut q = Quantized {
        nb,
        scale: Vec::with_capacity(blocks),
        half: Vec::with_capacity(blocks),
        corr: Vec::with_capacity(blocks),
        bytes: Vec::with_capacity(blocks * CHUNKS),
    };
    for block in x.chunks_exact(BLOCK) {
        let m = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let mut r = [0i8; BLOCK];
        if m < 1e-30 {
            q.scale.push(0.0);
            q.half.push(m);
        } else {
            let inv = 127.0 / m;
            for (r, v) in r.iter_mut().zip(block) {
                // To the nearest integer: adding 1.5 · 2^23 leaves no fraction bits
                // (|v · inv| < 2^22), and taking it off again is exact; `f32::round` is a
                // library call per input on the baseline x86-64.
                let y = (v * inv + ROUND) - ROUND;
                *r = y.clamp(-127.0, 127.0) as i8;
            }
            let s = m / 127.0;
            q.scale.push(s);
            q.half.push(s * 0.5001);
        }
        q.corr
            .push(-128 * r.iter().map(|&v| i32::from(v)).sum::<i32>());
        for c in 0..CHUNKS {
            let j = 2 * c;
            let bytes = [r[j], r[j + 16], r[j + 1], r[j + 17]].map(|v| v as u8);
            q.bytes.push(u32::from_le_bytes(bytes));
        }
    }
    Some(q)
}

/// The factor on `E_v` that covers, besides `E_v` itself, the f32 rounding of the exact
/// logit and of `Ã_v` (for `nb` blocks), with room to spare.
///
/// The exact logit sums 32 products a block, then `nb` blocks: its error is at most
/// `γ_{nb+34} Σ_b |d_b| Σ_i |q_i x_i|` (`γ_n = n u / (1 - n u)`), and `|x_i| ≤ 127 s_b ≤
/// 254 h_b` makes that sum at most `254 E_v`. `Ã_v` rounds `d_b s_b` and then each of
/// its `nb` multiply-adds, within `γ_{nb+2} · 254 E_v` likewise (`|r_i| ≤ 127`). The
/// computed `E_v` (positive terms, `nb` roundings and one on each `|d| Σ|q|`) is below
/// the true one by at most `γ_{nb+2}`. All together `E_v (1 + 510 (nb + 40) u)` at most;
/// the factor is twice that.
pub(super) fn margin(nb: usize) -> f32 {
    let u = f64::from(f32::EPSILON) / 2.0;
    (1.0 + 1024.0 * (nb as f64 + 40.0) * u) as f32
}

impl CpuQuantMatrix {
    /// Makes the index [`CpuQuantMatrix::greedy_tokens`] needs, where it can serve (a
    /// Q8_0 matrix, a CPU with AVX-512 VNNI and VBMI); returns the bytes it took.
    pub fn add_greedy_index(&mut self) -> usize {
        if self.greedy.is_none() {
            self.greedy = GreedyIndex::new(&self.tiles);
        }
        self.greedy.as_ref().map_or(0, GreedyIndex::bytes)
    }

    /// Whether [`CpuQuantMatrix::greedy_tokens`] can answer.
    pub fn has_greedy_index(&self) -> bool {
        self.greedy.is_some()
    }

    /// Each row's argmax of `x @ W^T` (rows of `k`), the same token as the full product's
    /// row would give (`sampling::order::argmax`), without computing the full product.
    /// `None` without an index, or where a row has a non-finite input or candidate logit:
    /// then the full product says what the row is.
    pub fn greedy_tokens(&self, x: &[f32]) -> Option<Vec<u32>> {
        let index = self.greedy.as_ref()?;
        let Tiles::Q8_0(tiles) = &self.tiles else {
            return None;
        };
        let q = quantize(x, self.k)?;
        let m = x.len() / self.k;
        let found = self.candidates(index, tiles, &q);
        let tokens: Vec<OnceLock<Option<u32>>> = (0..m).map(|_| OnceLock::new()).collect();
        let one = |r: usize| {
            let row = &x[r * self.k..(r + 1) * self.k];
            let _ = tokens[r].set(self.first(&found[r], row));
        };
        Team::global().run(m, &one);
        tokens
            .into_iter()
            .map(|t| t.into_inner().flatten())
            .collect()
    }

    /// Each row's candidate tile columns, in order: the approximate product in column
    /// tasks on the team, each task keeping its own [`Found`] per row, then merged.
    fn candidates(&self, index: &GreedyIndex, tiles: &[Q8_0], q: &Quantized) -> Vec<Vec<usize>> {
        let m = q.rows();
        let groups = self.n.div_ceil(TILE);
        let per_task = groups
            .div_ceil(Team::global().threads() * TASKS_PER_THREAD)
            .max(1);
        let tasks = groups.div_ceil(per_task);
        let nb = q.nb;
        let widen = margin(nb);
        let found: Vec<OnceLock<Vec<Found>>> = (0..tasks).map(|_| OnceLock::new()).collect();
        let run = |t: usize| {
            let mut rows = vec![Found::default(); m];
            let (mut lo, mut hi) = ([[0f32; TILE]; GROUP], [[0f32; TILE]; GROUP]);
            for g in t * per_task..((t + 1) * per_task).min(groups) {
                let column = Column {
                    tiles: &tiles[g * nb..(g + 1) * nb],
                    spread: &index.spread[g * nb..(g + 1) * nb],
                    margin: widen,
                    next: tiles.get((g + 1) * nb..(g + 2) * nb).unwrap_or(&[]),
                };
                // The last tile's columns past the matrix are no tokens.
                let valid = TILE.min(self.n - g * TILE);
                for r0 in (0..m).step_by(GROUP) {
                    // The first group's pass asks for the next column; the others find
                    // this one in cache.
                    let column = Column {
                        next: if r0 == 0 { column.next } else { &[] },
                        ..column
                    };
                    let group = r0..(r0 + GROUP).min(m);
                    let out = Out {
                        lo: &mut lo,
                        hi: &mut hi,
                    };
                    let some = Rows {
                        q,
                        range: group.clone(),
                    };
                    index.vnni.tile(column, some, out);
                    for (i, r) in group.enumerate() {
                        rows[r].see(g, &lo[i][..valid], &hi[i][..valid]);
                    }
                }
            }
            let _ = found[t].set(rows);
        };
        Team::global().run(tasks, &run);
        let found: Vec<Vec<Found>> = found.into_iter().filter_map(OnceLock::into_inner).collect();
        (0..m)
            .map(|r| {
                let floor = found
                    .iter()
                    .map(|f| f[r].floor)
                    .fold(f32::NEG_INFINITY, f32::max);
                found
                    .iter()
                    .flat_map(|f| &f[r].tiles)
                    .filter(|&&(_, top)| top >= floor)
                    .map(|&(g, _)| g)
                    .collect()
            })
            .collect()
    }

    /// A row's argmax among the exact logits of its candidate tile columns (in order): the
    /// first largest.
    fn first(&self, tiles: &[usize], row: &[f32]) -> Option<u32> {
        let mut best: Option<(f32, usize)> = None;
        let mut exact = [0f32; TILE];
        for &g in tiles {
            let valid = TILE.min(self.n - g * TILE);
            self.tile_outputs(row, g, &mut exact[..valid]);
            for (c, &v) in exact[..valid].iter().enumerate() {
                if !v.is_finite() {
                    return None;
                }
                if best.is_none_or(|(top, _)| v > top) {
                    best = Some((v, g * TILE + c));
                }
            }
        }
        best.map(|(_, id)| id as u32)
    }
}

/// What a column task found for one row so far: the largest `lo`, and the tile columns
/// whose largest `hi` reached the largest `lo` seen until then. The largest `lo` only
/// grows, so a tile column left out here is below the row's final floor too; those kept
/// are filtered against the final floor when the tasks' findings merge.
#[derive(Clone)]
struct Found {
    floor: f32,
    tiles: Vec<(usize, f32)>,
}

impl Default for Found {
    fn default() -> Self {
        Found {
            floor: f32::NEG_INFINITY,
            tiles: Vec::new(),
        }
    }
}

impl Found {
    fn see(&mut self, g: usize, lo: &[f32], hi: &[f32]) {
        let top = |v: &[f32]| v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        self.floor = self.floor.max(top(lo));
        // A NaN bound (an overflowing sum) rules nothing out.
        let high = if hi.iter().any(|v| v.is_nan()) {
            f32::INFINITY
        } else {
            top(hi)
        };
        if high >= self.floor {
            self.tiles.push((g, high));
        }
    }
}
