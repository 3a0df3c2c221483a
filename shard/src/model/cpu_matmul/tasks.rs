//! A product as column tasks, and several products over the same input as one job for the
//! threads (`team`). How the columns are split affects speed only: each output is
//! computed whole by one task (see the module docs).

use super::blocks::{Tile, TileColumns, TILE};
use super::formats::Tiles;
use super::input::{run_sums, LaneRows, Lanes, Rows};
use super::kernel::{columns, isa, rows_in_lanes, Isa};
use super::{CpuQuantMatrix, Out, COL_ALIGN, MIN_TASK_MACS, TASKS_PER_THREAD, WIDE_MIN_ROWS};
use crate::team::Team;

impl CpuQuantMatrix {
    /// `x`: rows of `k` → as many rows of `n`, row-major. `cols_per_task` overrides the
    /// split (tests use it to show the split changes nothing).
    #[cfg(test)]
    pub(super) fn matmul(&self, x: &[f32], isa: Isa, cols_per_task: Option<usize>) -> Vec<f32> {
        let split = Split {
            cols: cols_per_task,
            ..Split::default()
        };
        self.matmul_split(x, isa, split)
    }

    /// As [`CpuQuantMatrix::matmul`], the work split as `split` says.
    #[cfg(test)]
    pub(super) fn matmul_split(&self, x: &[f32], isa: Isa, split: Split) -> Vec<f32> {
        products(&[self], x, isa, split).concat()
    }

    /// Outputs `16 g .. 16 g + out.len()` of one row `x` (`out.len() ≤ 16`, within the
    /// matrix), on this thread: the same bits as the product computes them, since a task
    /// of one tile column is as good as any other split (see the module docs).
    pub(super) fn tile_outputs(&self, x: &[f32], g: usize, out: &mut [f32]) {
        let sums = if self.tiles.has_offset() {
            run_sums(x)
        } else {
            Vec::new()
        };
        let rows = Rows {
            x,
            sums: &sums,
            k: self.k,
            lanes: Lanes::NONE,
        };
        let task = Task {
            cols: TILE,
            t: g,
            rows: vec![out_slots(out)],
        };
        self.tiles.run(rows, task, isa());
    }

    /// Splits this product of `m` rows into column tasks over `out` (`m` rows of `n`):
    /// task `t` computes the columns `t*cols ..` of every row and gets those `m` pieces
    /// of `out` to write the sums straight into.
    fn tasks<'a>(&'a self, out: &'a mut [Out], m: usize, cols: Option<usize>) -> Vec<Piece<'a>> {
        // Tasks start on tile boundaries.
        let cols = cols
            .unwrap_or_else(|| self.cols_per_task(m))
            .max(1)
            .next_multiple_of(TILE);
        let mut rows: Vec<Vec<&mut [Out]>> = (0..self.n.div_ceil(cols))
            .map(|_| Vec::with_capacity(m))
            .collect();
        for row in out.chunks_mut(self.n) {
            for (task, piece) in rows.iter_mut().zip(row.chunks_mut(cols)) {
                task.push(piece);
            }
        }
        let tiles = match &self.wide {
            Some(wide) if m >= WIDE_MIN_ROWS => wide,
            _ => &self.tiles,
        };
        rows.into_iter()
            .enumerate()
            .map(|(t, rows)| Piece {
                tiles,
                task: Task { cols, t, rows },
            })
            .collect()
    }

    /// Columns per task: as many tasks as the work is worth (`MIN_TASK_MACS` each), at
    /// most `TASKS_PER_THREAD` per thread, and from one per thread up a multiple of the
    /// thread count, so every thread gets the same share. Affects speed only.
    ///
    /// Columns are rounded up to `COL_ALIGN`, which can leave a count of tasks the threads
    /// do not share evenly (640 columns in 8 tasks: 7 of 96, so one of 2 threads ran 4 and
    /// the product took 4/3.5 of the time); then narrower tasks are taken while that evens
    /// it out (10 of 64). Gemma 3's 2048 → 640 products ran 7% faster at 16 rows, and its
    /// single stream went from 1.13–1.27× llama-server's tokens/s to 1.33–1.48× (its down
    /// projection at one row had been 7 tasks).
    fn cols_per_task(&self, m: usize) -> usize {
        let threads = Team::global().threads();
        let worth = m * self.k * self.n / MIN_TASK_MACS;
        let mut tasks = worth.clamp(1, threads * TASKS_PER_THREAD);
        if tasks > threads {
            tasks -= tasks % threads;
        }
        let cols = |tasks: usize| self.n.div_ceil(tasks).next_multiple_of(COL_ALIGN);
        let even = |tasks: usize| self.n.div_ceil(cols(tasks)) % threads == 0;
        if tasks > 1 && !even(tasks) {
            if let Some(t) = (tasks + 1..=2 * tasks).find(|&t| even(t)) {
                return cols(t);
            }
        }
        cols(tasks)
    }
}

/// How a product's work is split, where the tests pin it (to show that it changes no
/// output); by default, as fast as it goes.
#[derive(Clone, Copy, Default)]
pub(super) struct Split {
    /// Columns per task.
    pub cols: Option<usize>,
    /// Rows for the kernel that puts rows in lanes (`kernel::rows_in_lanes`), from the
    /// first; more than the product has means all.
    pub in_lanes: Option<usize>,
}

/// `x @ W^T` for each matrix of `ms` (all with the same `k`), their column tasks run as
/// one job.
pub(super) fn products(ms: &[&CpuQuantMatrix], x: &[f32], isa: Isa, split: Split) -> Vec<Vec<f32>> {
    let k = ms.first().map_or(1, |mat| mat.k.max(1));
    let m = x.len() / k;
    if m == 0 {
        return vec![Vec::new(); ms.len()];
    }
    let mut outs: Vec<Box<[Out]>> = ms
        .iter()
        .map(|mat| Box::new_uninit_slice(m * mat.n))
        .collect();
    // Formats with an offset need the rows' run sums (see `input`): once for all tasks.
    let sums = if ms.iter().any(|mat| mat.tiles.has_offset()) {
        run_sums(x)
    } else {
        Vec::new()
    };
    let in_lanes = split
        .in_lanes
        .unwrap_or_else(|| rows_in_lanes(isa, m))
        .min(m);
    let lanes = LaneRows::new(x, &sums, k, in_lanes);
    let rows = Rows {
        x,
        sums: &sums,
        k,
        lanes: lanes.lanes(),
    };
    let pieces: Vec<Piece> = ms
        .iter()
        .zip(outs.iter_mut())
        .filter(|(mat, _)| mat.n > 0)
        .flat_map(|(mat, out)| mat.tasks(out, m, split.cols))
        .collect();
    run_pieces(rows, pieces, isa);
    outs.into_iter()
        // SAFETY: every output is written: each matrix's tasks split every row of its
        // output into column ranges that cover it (`tasks`), and each task writes all of
        // its range in every row (`kernel::columns`: every tile column, every row).
        // `run_pieces` returns only when every task has finished (a panic in one
        // reaches here as a panic, and the buffers are dropped uninitialized).
        .map(|out| unsafe { out.assume_init() }.into_vec())
        .collect()
}

/// `out` as outputs to write: the kernel writes every one (and reads none).
fn out_slots(out: &mut [f32]) -> &mut [Out] {
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and writing initialized values
    // through it keeps `out` initialized.
    unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<Out>(), out.len()) }
}

/// One column task of a product: the columns `t*cols ..` (a multiple of 16) of every row
/// of the input, into `rows`, its pieces of the output rows.
pub(super) struct Task<'a> {
    cols: usize,
    t: usize,
    rows: Vec<&'a mut [Out]>,
}

/// A task and the tiles it multiplies.
struct Piece<'a> {
    tiles: &'a Tiles,
    task: Task<'a>,
}

/// Runs the pieces, in parallel on the team when there is more than one.
fn run_pieces(x: Rows, pieces: Vec<Piece>, isa: Isa) {
    if pieces.len() <= 1 {
        for p in pieces {
            p.tiles.run(x, p.task, isa);
        }
        return;
    }
    let n = pieces.len();
    let pieces: Vec<std::sync::Mutex<Option<Piece>>> = pieces
        .into_iter()
        .map(|p| std::sync::Mutex::new(Some(p)))
        .collect();
    let one = |i: usize| {
        let piece = pieces[i].lock().ok().and_then(|mut p| p.take());
        if let Some(p) = piece {
            p.tiles.run(x, p.task, isa);
        }
    };
    Team::global().run(n, &one);
}

/// Runs one task against the tile columns of `m`.
pub(super) fn run_task<T: Tile>(m: TileColumns<T>, x: Rows, task: Task, isa: Isa) {
    let Task { cols, t, mut rows } = task;
    let (g0, gs) = (t * cols / TILE, rows[0].len().div_ceil(TILE));
    columns(TileColumns::all(m.group(g0, gs), m.nb), x, &mut rows, isa);
}
