//! The kernel: which instruction set, and the loops over rows, tiles and inputs.

use std::sync::OnceLock;

use super::blocks::{self, Tile, TileColumns, TILE};
use super::input::{Lanes, Rows};
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Portable, Simd};
use super::{Half, Out, LANES};
use ahead::RowGroup;
use dot::{dot, Packed, Source};

mod ahead;
mod dot;
mod lanes;
mod unpacked;

/// Bytes of activation rows swept over one group of tiles before the next group: they
/// stay in L2 while the group's weights stay in L1. Speed only.
const PIECE_BYTES: usize = 256 << 10;

/// The kernel variant, fixed once per process. Every variant computes the same bits
/// (see the module docs); they differ in speed only. The x86 variants carry the token
/// that proves their instructions exist.
#[derive(Clone, Copy)]
pub(super) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

impl std::fmt::Debug for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(_) => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(_) => "avx512",
        })
    }
}

pub(super) fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = Avx512::detect() {
                return Isa::Avx512(t);
            }
            if let Some(t) = Avx2::detect() {
                return Isa::Avx2(t);
            }
        }
        Isa::Portable
    })
}

/// The last group of rows the lanes kernel takes (`lanes`) may hold this many rows or
/// more of its 16 (the rest of its lanes computed for nothing; SmolLM2's decode-step
/// products from memory, two threads, against the other kernels: 0.85x at 12 rows, 1.06x
/// at 14, 1.07x at 16). Speed only.
const LANES_MIN_ROWS: usize = 14;

/// Rows of a product of `m` rows that the lanes kernel takes (`lanes`), the first ones: on
/// AVX-512, whole groups of 16 and a last group of [`LANES_MIN_ROWS`] or more. AVX2 (16
/// registers: 4 columns' sums per activation loaded) and the portable kernel were not
/// measured with it and keep theirs; the tests run it on every variant. Speed only.
pub(super) fn rows_in_lanes(isa: Isa, m: usize) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(_) if m % LANES >= LANES_MIN_ROWS => m,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(_) => m / LANES * LANES,
        _ => 0,
    }
}

/// Rows per piece are a multiple of this: of every kernel's row groups (8, 6, 4).
const PIECE_ROWS: usize = 24;

/// The tile columns of `m` for the rows `x` (`m.k()` f32 each) into `out`: one piece per
/// row, one sum per column (the last tile may cover fewer columns than 16), with the
/// kernel for `isa`.
///
/// The first rows, those the product put in lanes ([`rows_in_lanes`]), go to the kernel
/// that puts rows in the vector lanes (`lanes`). The others go in pieces of about
/// [`PIECE_BYTES`]; each piece is swept over every group of tiles in turn, so a group's
/// weights are read from memory once per piece and then from L1 or L2, and the piece's
/// rows from L2. A piece of many rows takes each tile column unpacked once (`unpacked`), a
/// smaller one streams the tiles ([`sweep`]). The two are separate `#[target_feature]`
/// functions: compiled as one, the single-row loop lost 7% (registers LLVM kept for the
/// other path). With several rows, either asks for the next tile columns from memory as
/// it goes (`ahead`).
pub(super) fn columns<T: Tile>(m: TileColumns<T>, x: Rows, out: &mut [&mut [Out]], isa: Isa) {
    let in_lanes = x.lanes.rows.min(out.len());
    if in_lanes > 0 {
        lanes_columns(m, x.lanes, &mut out[..in_lanes], isa);
    }
    let (x, out) = (x.from(in_lanes), &mut out[in_lanes..]);
    let rows_per_piece = (PIECE_BYTES / (4 * m.k())).max(PIECE_ROWS) / PIECE_ROWS * PIECE_ROWS;
    for (p, out) in out.chunks_mut(rows_per_piece).enumerate() {
        let x = x.from(p * rows_per_piece);
        let once = T::UNPACK_ONCE && out.len() >= unpacked::MIN_ROWS;
        match isa {
            Isa::Portable if once => unpacked::sweep::<_, T, 4, 1, 0>(Portable, m, x, out),
            Isa::Portable => sweep::<_, T, 4, 1, 0, 0, 1, 2>(Portable, m, x, out),
            // SAFETY: the token `t` exists only if the CPU has the features these
            // functions enable (see `simd`).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(t) if once => unsafe { unpacked_avx2(t, m, x, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(t) => unsafe { stream_avx2(t, m, x, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(t) if once => unsafe { unpacked_avx512(t, m, x, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(t) => unsafe { stream_avx512(t, m, x, out) },
        }
    }
}

/// The rows `x`, in lanes, against the tile columns of `m` into `out` (a row each), with
/// the lanes kernel for `isa`.
fn lanes_columns<T: Tile>(m: TileColumns<T>, x: Lanes, out: &mut [&mut [Out]], isa: Isa) {
    match isa {
        Isa::Portable if T::SPLIT => lanes::sweep::<_, T, 8>(Portable, m, x, out),
        Isa::Portable => lanes::sweep::<_, T, 16>(Portable, m, x, out),
        // SAFETY: the token `t` exists only if the CPU has the features these functions
        // enable (see `simd`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => unsafe { lanes_avx2(t, m, x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(t) => unsafe { lanes_avx512(t, m, x, out) },
    }
}

// The entry functions below (and `row`'s) are the kernel's only `#[target_feature]`
// functions: everything they call is `#[inline(always)]` and inlines into them (see
// `simd`, "Inlining"). The portable kernel needs no features.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn stream_avx2<T: Tile>(t: Avx2, m: TileColumns<T>, x: Rows, out: &mut [&mut [Out]]) {
    // A vector is 2 ymm, and each row and tile keeps a sum per half of a part (one
    // without a split): 6 rows x 1 tile = 12 sum registers, so each unpacked quant feeds 6
    // rows, leaving registers for the unpacking; one row gets 4 tiles for 8 chains (as
    // many as two FMA ports with 4-cycle latency need). The outputs themselves change
    // once per part and may live in memory. With a split (Q6_K) 4 rows take 16 registers,
    // which still beat 3 rows (39 against 34 GFLOP/s at 16 rows).
    if T::SPLIT {
        sweep::<_, T, 4, 1, 0, 0, 1, 2>(t, m, x, out)
    } else {
        sweep::<_, T, 6, 1, 4, 1, 2, 4>(t, m, x, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpacked_avx2<T: Tile>(t: Avx2, m: TileColumns<T>, x: Rows, out: &mut [&mut [Out]]) {
    // The row groups of `stream_avx2`.
    if T::SPLIT {
        unpacked::sweep::<_, T, 4, 1, 0>(t, m, x, out)
    } else {
        unpacked::sweep::<_, T, 6, 1, 4>(t, m, x, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn stream_avx512<T: Tile>(t: Avx512, m: TileColumns<T>, x: Rows, out: &mut [&mut [Out]]) {
    // 8 rows x 2 tiles = 16 sum registers of the 32: each unpacked quant vector feeds 8
    // FMAs and each row's activation (broadcast once into a register) 2. With one tile,
    // every FMA took its activation as a broadcast from memory: 16 loads beside 2 quant
    // loads per 16 FMAs, as many as the load ports do in the cycles the FMAs and the
    // widening take. At 2 tiles, one thread, the two alternated in one process: Q4_1 from
    // the wide copy (SmolLM2's shapes, 8–96 rows) 10–28% faster, Q4_0 / Q5_0 / Q5_1 4–21%,
    // Q4_K at 8 rows 47%, Q8_0 (the output layer) +12% at 16 rows, -7% at 96; 3 tiles
    // spill (0.6x). With a split, 8 rows x 1 tile already take 16 registers. 4 rows x 2
    // tiles feed each quant vector 4 FMAs; one row: 8 tiles (4 with a split), 8
    // independent chains.
    if T::SPLIT {
        sweep::<_, T, 8, 1, 4, 2, 2, 4>(t, m, x, out)
    } else {
        sweep::<_, T, 8, 2, 4, 2, 4, 8>(t, m, x, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn unpacked_avx512<T: Tile>(t: Avx512, m: TileColumns<T>, x: Rows, out: &mut [&mut [Out]]) {
    // The row groups of `stream_avx512` (Q4_K and Q5_K at 16 and 96 rows: 2 tiles 9–25%
    // faster than 1).
    if T::SPLIT {
        unpacked::sweep::<_, T, 8, 1, 4>(t, m, x, out)
    } else {
        unpacked::sweep::<_, T, 8, 2, 4>(t, m, x, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn lanes_avx2<T: Tile>(t: Avx2, m: TileColumns<T>, x: Lanes, out: &mut [&mut [Out]]) {
    // A vector is 2 ymm: 4 columns' sums take 8 of the 16 registers (with a split, 2).
    if T::SPLIT {
        lanes::sweep::<_, T, 2>(t, m, x, out)
    } else {
        lanes::sweep::<_, T, 4>(t, m, x, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn lanes_avx512<T: Tile>(t: Avx512, m: TileColumns<T>, x: Lanes, out: &mut [&mut [Out]]) {
    // 16 columns' sums in 16 of the 32 registers (with a split, 8 columns' two each).
    if T::SPLIT {
        lanes::sweep::<_, T, 8>(t, m, x, out)
    } else {
        lanes::sweep::<_, T, 16>(t, m, x, out)
    }
}

/// Lane `c` of the tile column `column` (its tiles) into `out`, with the kernel variant
/// `isa` (see `blocks::row`).
pub(super) fn row<T: Tile>(column: &[T], c: usize, out: &mut [f32], isa: Isa) {
    match isa {
        Isa::Portable => blocks::row(Portable, column, c, out),
        // SAFETY: as in `columns`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => unsafe { row_avx2(t, column, c, out) },
        // SAFETY: as in `columns`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(t) => unsafe { row_avx512(t, column, c, out) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_avx2<T: Tile>(t: Avx2, column: &[T], c: usize, out: &mut [f32]) {
    blocks::row(t, column, c, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn row_avx512<T: Tile>(t: Avx512, column: &[T], c: usize, out: &mut [f32]) {
    blocks::row(t, column, c, out)
}

/// All rows of `out` (a piece) against all tile columns of `m`: rows `R` at a time
/// against `C` tiles at a time; the rows left over `R2` at a time against `C2` tiles (if
/// `2 < R2 < R`), then 2 at a time against `C22` tiles (if `R > 2`); the last one alone
/// against `C1` tiles at a time (then fewer, for the tiles left over). Every output is
/// the same chain of multiply-adds whichever path computes it (see [`dot`]); the paths
/// differ in speed only.
///
/// The middle groups matter for small batches (a few streams, or one stream's verified
/// draft): without them the rows left over from the big groups went one by one, each
/// unpacking every weight again (on AVX-512, 5 rows cost about 5 single-row products).
#[inline(always)]
fn sweep<
    S: Simd,
    T: Tile,
    const R: usize,
    const C: usize,
    const R2: usize,
    const C2: usize,
    const C22: usize,
    const C1: usize,
>(
    s: S,
    m: TileColumns<T>,
    x: Rows,
    out: &mut [&mut [Out]],
) {
    let mut done = tier::<S, T, R, C>(s, m, x, out);
    if 2 < R2 && R2 < R {
        done += tier::<S, T, R2, C2>(s, m, x.from(done), &mut out[done..]);
    }
    if R > 2 {
        done += tier::<S, T, 2, C22>(s, m, x.from(done), &mut out[done..]);
    }
    let (x, single) = (x.from(done), &mut out[done..]);
    let g = span::<S, T, 1, C1>(s, m, x, single);
    let g = span::<S, T, 1, 4>(s, m.from(g), x, single);
    let g = span::<S, T, 1, 2>(s, m.from(g), x, single);
    span::<S, T, 1, 1>(s, m.from(g), x, single);
}

/// The first rows of `out`, as many as make whole groups of `R`, against every tile
/// column (`C` at a time, then one by one); returns how many rows that was.
#[inline(always)]
fn tier<S: Simd, T: Tile, const R: usize, const C: usize>(
    s: S,
    m: TileColumns<T>,
    x: Rows,
    out: &mut [&mut [Out]],
) -> usize {
    let together = out.len() / R * R;
    if together > 0 {
        let rows = &mut out[..together];
        let g = span::<S, T, R, C>(s, m, x, rows);
        span::<S, T, R, 1>(s, m.from(g), x, rows);
    }
    together
}

/// The tile columns of `m` (from `m.from` on), `C` at a time while `C` are left, for the
/// rows of `out` (`R` at a time; their count is a multiple of `R`); returns the first tile
/// column not done.
#[inline(always)]
fn span<S: Simd, T: Tile, const R: usize, const C: usize>(
    s: S,
    m: TileColumns<T>,
    x: Rows,
    out: &mut [&mut [Out]],
) -> usize {
    let mut g = m.from;
    while g + C <= m.groups() {
        row_groups::<S, T, _, R, C>(s, &Packed::at(m, g, C), x, out);
        g += C;
    }
    g
}

/// Every row group of `out` (`R` rows each; their count is a multiple of `R`) against
/// the `C` tile columns of `src`, each output's sum stored in its row: the loop over row
/// groups of both sources (the tiles streamed, or unpacked once).
#[inline(always)]
fn row_groups<S: Simd, T: Tile, Src: Source<S, T>, const R: usize, const C: usize>(
    s: S,
    src: &Src,
    x: Rows,
    out: &mut [&mut [Out]],
) {
    let groups = out.len() / R;
    for (i, out) in out.chunks_exact_mut(R).enumerate() {
        let mut rows: [(&[Half], &[f32]); R] = [(&[], &[]); R];
        for (r, row) in rows.iter_mut().enumerate() {
            *row = x.row(i * R + r);
        }
        let who = RowGroup {
            rows: R,
            group: i,
            groups,
        };
        let acc = dot::<S, T, _, R, C>(s, src, &rows, who);
        for (row, acc) in out.iter_mut().zip(&acc) {
            for (c, v) in acc.iter().enumerate() {
                store(s, *v, row, (src.column() + c) * TILE);
            }
        }
    }
}

/// Writes the 16 sums `v` to `row[at..]`, as many as fit (the last tile of a matrix may
/// stand past its last column). Called once per 16 outputs, after their whole dot products,
/// so the copy through `h` costs nothing measurable.
#[inline(always)]
fn store<S: Simd>(s: S, v: S::V, row: &mut [Out], at: usize) {
    let mut h: Half = [0.0; TILE];
    s.store(v, &mut h);
    match row.get_mut(at..).and_then(|r| r.first_chunk_mut::<TILE>()) {
        Some(dst) => {
            for (d, v) in dst.iter_mut().zip(h) {
                d.write(v);
            }
        }
        None => store_part(&h, row.get_mut(at..).unwrap_or_default()),
    }
}

/// The sums of a last tile that fit in `dst`. Apart, so that LLVM does not merge the
/// fixed-size store above with this copy into a `memcpy` call in the hot loop.
#[cold]
#[inline(never)]
fn store_part(sum: &Half, dst: &mut [Out]) {
    for (d, v) in dst.iter_mut().zip(sum) {
        d.write(*v);
    }
}
