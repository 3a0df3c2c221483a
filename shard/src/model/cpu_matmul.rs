//! Exact, batch-invariant CPU matmul for ggml Q4_0 / Q4_1 / Q8_0 weights.
//!
//! candle's `QMatMul` quantizes the *activations* to 8 bits before its integer dot
//! products. That costs up to ~1 nat of log-probability against a float64 reference,
//! too much for a server that sells exact scores. Here the f32 activations meet the
//! weights exactly as ggml dequantizes them (`w = d*q` for Q4_0/Q8_0, `w = d*q + m` for
//! Q4_1), so each output is the float64 dot product up to f32 rounding.
//!
//! # The arithmetic of one output (the batch-invariance contract)
//!
//! Output `(row, col)` is `Σ_i x[row][i] · w[col][i]` computed as follows, and only so:
//! one f32 accumulator starts at `0.0`; for each block of 32 inputs in order, for
//! `j = 0..16`, it does `acc = fma(x_j, w_j, acc)` then `acc = fma(x_{j+16}, w_{j+16},
//! acc)` (the order in which a ggml block stores its inputs: `j` and `j + 16` share a
//! byte). Nothing in that sequence depends on the number of rows, on the other rows, on
//! how columns are grouped or split across threads, or on the CPU: every kernel variant
//! does exactly these fused multiply-adds (AVX-512 and AVX2 with FMA instructions, the
//! portable one with `f32::mul_add`, which is the same single rounding on every target),
//! and the weights are bit-identical to candle's dequantization. Vector lanes hold
//! *columns*, never parts of one sum, so there is no lane reduction to order; threads
//! split the columns, and one thread computes each output entirely. So a row's scores
//! are the same alone or in any batch, on any x86 or ARM.
//!
//! # Speed
//!
//! At load, the blocks of 16 adjacent columns at the same 32 inputs are interleaved into
//! a tile (`blocks`), so one vector op dequantizes one input of 16 columns and the
//! scales are vectors too. The kernel (`kernel`) takes `R` rows against `C` tiles: each
//! dequantized weight vector feeds `R` FMAs, each activation (broadcast from memory)
//! `C`, and the `R * C` accumulators are independent FMA chains (AVX-512: 8 rows x 2
//! tiles, a single row 8 tiles; AVX2+FMA: 2 x 2, one row 4 tiles). Rows go in L2-sized
//! pieces; threads (rayon; small products stay on the calling thread) take ranges of
//! tile columns and write their sums straight into the output rows. The kernel is
//! written once, generic over a 16-lane vector type (`simd`), and instantiated inside
//! `#[target_feature]` functions chosen once per process at run time, so the default
//! x86-64 build still gets wide vectors; everything below those functions must inline
//! into them (see `simd`, "Inlining"). (Explicit intrinsics rather than
//! auto-vectorisation: LLVM vectorised the nibble unpacking across blocks instead of
//! within one, several times slower, and did not keep the accumulators in registers.)
//!
//! An earlier layout (16 lanes splitting one dot product, folded at the end) needed a
//! horizontal reduction per output and a per-block scalar broadcast of the scales; at a
//! batch of 16 it reached about a third of the FMA peak, this layout about twice that.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Storage, Tensor};
use rayon::prelude::*;

mod blocks;
mod kernel;
mod simd;
#[cfg(test)]
mod tests;

use blocks::{tiles, Tile, F32, Q4_0, Q4_1, Q8_0, TILE};
use kernel::{columns, isa, Isa};

/// Weights per ggml block (the same for Q4_0, Q4_1 and Q8_0).
const QK: usize = 32;
/// f32 lanes of the kernel's vectors: one per column of a tile.
const LANES: usize = 16;
/// Below this many multiply-adds a task is not worth handing to another thread.
const MIN_TASK_MACS: usize = 1 << 17;
/// Tasks per thread to aim for, so uneven progress evens out.
const TASKS_PER_THREAD: usize = 4;
/// Columns per task are a multiple of this (two tiles, the group a batch takes at a
/// time), so tiles are only padded at the very end of the matrix. Speed only.
const COL_ALIGN: usize = 2 * TILE;

/// One vector's worth of f32: a lane per column of a tile.
type Half = [f32; LANES];

#[derive(Clone)]
enum Tiles {
    Q4_0(Vec<Q4_0>),
    Q4_1(Vec<Q4_1>),
    Q8_0(Vec<Q8_0>),
    F32(Vec<F32>),
}

/// A quantized weight matrix `[n, k]` (n outputs, k inputs) multiplied on the CPU by
/// f32 activations, exactly and batch-invariantly (see the module docs).
#[derive(Clone)]
pub struct CpuQuantMatrix {
    n: usize,
    k: usize,
    /// Tile column `g` (columns `16 g ..`) has its `k / 32` tiles at `g * k / 32 ..`.
    tiles: Tiles,
}

impl std::fmt::Debug for CpuQuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CpuQuantMatrix[{}; {}x{}]",
            self.dtype_name(),
            self.n,
            self.k
        )
    }
}

impl CpuQuantMatrix {
    /// Takes a 2-D Q4_0, Q4_1 or Q8_0 tensor `[n, k]` with `k` a multiple of 32; `None`
    /// for anything else (the caller keeps candle's `QMatMul` for it). The quants are
    /// kept as stored, only regrouped into tiles and their f16 scales widened to f32.
    pub fn from_qtensor(t: &QTensor) -> Option<Self> {
        let (n, k) = t.shape().dims2().ok()?;
        if k == 0 || !k.is_multiple_of(QK) {
            return None;
        }
        let nb = k / QK;
        let tiles = match t.dtype() {
            GgmlDType::Q4_0 => Tiles::Q4_0(tiles(&t.data().ok()?, n, nb)?),
            GgmlDType::Q4_1 => Tiles::Q4_1(tiles(&t.data().ok()?, n, nb)?),
            GgmlDType::Q8_0 => Tiles::Q8_0(tiles(&t.data().ok()?, n, nb)?),
            _ => return None,
        };
        Some(CpuQuantMatrix { n, k, tiles })
    }

    /// A dense f32 `[n, k]` CPU matrix (k a multiple of 32), multiplied with the same
    /// fixed arithmetic as the quantized formats.
    pub fn from_dense(t: &Tensor) -> Option<Self> {
        let (n, k) = t.dims2().ok()?;
        if k == 0 || !k.is_multiple_of(QK) || t.dtype() != DType::F32 || !t.device().is_cpu() {
            return None;
        }
        let bytes: Vec<u8> = t
            .flatten_all()
            .ok()?
            .to_vec1::<f32>()
            .ok()?
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        Some(CpuQuantMatrix {
            n,
            k,
            tiles: Tiles::F32(tiles(&bytes, n, k / QK)?),
        })
    }

    /// `(n, k)`: outputs, inputs.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The storage name: "q4_0", "q4_1", "q8_0" or "f32".
    pub fn dtype_name(&self) -> &'static str {
        match self.tiles {
            Tiles::Q4_0(_) => "q4_0",
            Tiles::Q4_1(_) => "q4_1",
            Tiles::Q8_0(_) => "q8_0",
            Tiles::F32(_) => "f32",
        }
    }

    /// `xs`: f32 CPU tensor `[.., k]` (usually `[m, k]`) → `[.., n]`, i.e. `xs @ W^T`.
    /// Row `r` of the result depends on row `r` of `xs` only, bit for bit.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        if !xs.device().is_cpu() {
            candle_core::bail!("CpuQuantMatrix::forward: input is on {:?}", xs.device());
        }
        if xs.dtype() != DType::F32 {
            candle_core::bail!(
                "CpuQuantMatrix::forward: input is {:?}, not f32",
                xs.dtype()
            );
        }
        let Some((&k, lead)) = xs.dims().split_last() else {
            candle_core::bail!("CpuQuantMatrix::forward: scalar input");
        };
        if k != self.k {
            candle_core::bail!(
                "CpuQuantMatrix::forward: input has {k} features, the {}x{} matrix wants {}",
                self.n,
                self.k,
                self.k
            );
        }
        let m: usize = lead.iter().product();
        let mut out_shape = lead.to_vec();
        out_shape.push(self.n);

        let xs = xs.contiguous()?;
        let (storage, layout) = xs.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            candle_core::bail!("CpuQuantMatrix::forward: input is not in CPU memory");
        };
        let Some(x) = layout
            .contiguous_offsets()
            .and_then(|(start, end)| cpu.as_slice::<f32>().ok()?.get(start..end))
        else {
            candle_core::bail!("CpuQuantMatrix::forward: cannot read the input as f32");
        };
        let out = self.matmul(x, m, isa(), None);
        drop(storage);
        Tensor::from_vec(out, out_shape, &Device::Cpu)
    }

    /// `x`: `m` rows of `k` → `m` rows of `n`, row-major. `cols_per_task` overrides the
    /// split (tests use it to show the split changes nothing).
    fn matmul(&self, x: &[f32], m: usize, isa: Isa, cols_per_task: Option<usize>) -> Vec<f32> {
        let (n, nb) = (self.n, self.k / QK);
        debug_assert_eq!(x.len(), m * self.k);
        let mut out = vec![0f32; m * n];
        if m == 0 || n == 0 {
            return out;
        }
        // Tasks start on tile boundaries.
        let cols = cols_per_task
            .unwrap_or_else(|| self.cols_per_task(m))
            .max(1)
            .next_multiple_of(TILE);
        // Task `t` computes the columns `t*cols ..` of every row: it gets those `m`
        // pieces of `out` and writes the sums straight into them.
        let mut tasks: Vec<Vec<&mut [f32]>> = (0..n.div_ceil(cols))
            .map(|_| Vec::with_capacity(m))
            .collect();
        for row in out.chunks_mut(n) {
            for (task, piece) in tasks.iter_mut().zip(row.chunks_mut(cols)) {
                task.push(piece);
            }
        }
        match &self.tiles {
            Tiles::Q4_0(t) => run_tasks(t, nb, x, cols, tasks, isa),
            Tiles::Q4_1(t) => run_tasks(t, nb, x, cols, tasks, isa),
            Tiles::Q8_0(t) => run_tasks(t, nb, x, cols, tasks, isa),
            Tiles::F32(t) => run_tasks(t, nb, x, cols, tasks, isa),
        }
        out
    }

    /// Columns per task: as many tasks as the work is worth (`MIN_TASK_MACS` each), at
    /// most `TASKS_PER_THREAD` per thread, and from one per thread up a multiple of the
    /// thread count, so every thread gets the same share. Affects speed only.
    fn cols_per_task(&self, m: usize) -> usize {
        let threads = rayon::current_num_threads();
        let worth = m * self.k * self.n / MIN_TASK_MACS;
        let mut tasks = worth.clamp(1, threads * TASKS_PER_THREAD);
        if tasks > threads {
            tasks -= tasks % threads;
        }
        self.n.div_ceil(tasks).next_multiple_of(COL_ALIGN)
    }
}

/// Runs the tasks, in parallel when there is more than one: task `t` computes the
/// columns `t*cols ..` (a multiple of 16; `tiles.len() / nb` tile columns in all) into
/// its row pieces.
fn run_tasks<T: Tile>(
    tiles: &[T],
    nb: usize,
    x: &[f32],
    cols: usize,
    tasks: Vec<Vec<&mut [f32]>>,
    isa: Isa,
) {
    let task = |(t, mut rows): (usize, Vec<&mut [f32]>)| {
        let (g0, gs) = (t * cols / TILE, rows[0].len().div_ceil(TILE));
        columns(&tiles[g0 * nb..(g0 + gs) * nb], nb, x, &mut rows, isa);
    };
    if tasks.len() == 1 {
        tasks.into_iter().enumerate().for_each(task);
    } else {
        tasks.into_par_iter().enumerate().for_each(task);
    }
}
