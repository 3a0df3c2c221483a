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
//! 16 f32 lanes start at `0.0`; for `i = 0, 1, …, k-1` in order, lane `i % 16` does
//! `acc = fma(x_i, w_i, acc)`; the lanes then fold by a fixed tree (`v[l] += v[l + 8]`,
//! then `+4`, `+2`, `+1`). Nothing in that sequence depends on the number of rows, on
//! the other rows, on how columns are grouped or split across threads, or on the CPU:
//! every kernel variant does exactly these per-lane fused multiply-adds (AVX-512 and
//! AVX2 with FMA instructions, the portable one with `f32::mul_add`, which is the same
//! single rounding on every target), and the weights are bit-identical to candle's
//! dequantization. Threads split the *columns*; one thread computes each output
//! entirely. So a row's scores are the same alone or in any batch, on any x86 or ARM.
//!
//! # Speed
//!
//! Threads take ranges of columns (rayon; small products stay on the calling thread)
//! and write their sums straight into the output rows. Within a range, a group of `C`
//! weight columns is dequantized once into a small buffer and every activation row is
//! swept over it, `R` rows at a time, so weight reads and dequantization are shared by
//! the whole batch and each weight load feeds `R` FMAs; the `C * R` accumulators are
//! independent FMA chains. Long prompts go in L2-sized pieces of columns and rows. A
//! single row (decode) skips the buffer and dequantizes straight into registers. The
//! kernel is written once (`kernel`), generic over a 16-lane vector type (`simd`), and
//! instantiated inside `#[target_feature]` functions (AVX-512: `C = 4, R = 4`, one row
//! 8 columns; AVX2+FMA: `C = 4, R = 1`; portable) chosen once per process at run time,
//! so the default x86-64 build still gets wide vectors; everything below those
//! functions must inline into them (see `simd`, "Inlining"). (Explicit intrinsics
//! rather than auto-vectorisation: LLVM vectorised the nibble unpacking across blocks
//! instead of within one, several times slower, and did not keep 16 accumulators in
//! registers.)

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Storage, Tensor};
use rayon::prelude::*;

mod blocks;
mod kernel;
mod simd;
#[cfg(test)]
mod tests;

use blocks::{Block, F32x32, Q4_0, Q4_1, Q8_0};
use kernel::{columns, isa, Isa};

/// Weights per ggml block (the same for Q4_0, Q4_1 and Q8_0).
const QK: usize = 32;
/// Accumulator lanes per output: element `i` of the dot product goes to lane `i % LANES`.
const LANES: usize = 16;
/// Below this many multiply-adds a task is not worth handing to another thread. (Not
/// higher: the engine thread waits outside the rayon pool while the pool works, and a
/// decode step's small products ran no faster end to end kept on that thread, next to
/// workers still spinning from the previous parallel op.)
const MIN_TASK_MACS: usize = 1 << 17;
/// Tasks per thread to aim for, so uneven progress evens out.
const TASKS_PER_THREAD: usize = 4;
/// Columns per task are a multiple of this (the widest column group), so groups are
/// only padded at the very end of the matrix. Speed only: padding changes no result.
const COL_ALIGN: usize = 8;

/// Sixteen consecutive weights or activations: one element per accumulator lane.
type Half = [f32; LANES];

#[derive(Clone)]
enum Blocks {
    Q4_0(Vec<Q4_0>),
    Q4_1(Vec<Q4_1>),
    Q8_0(Vec<Q8_0>),
    F32(Vec<F32x32>),
}

/// A quantized weight matrix `[n, k]` (n outputs, k inputs) multiplied on the CPU by
/// f32 activations, exactly and batch-invariantly (see the module docs).
#[derive(Clone)]
pub struct CpuQuantMatrix {
    n: usize,
    k: usize,
    /// Row-major: column `j`'s `k / 32` blocks are `blocks[j*nb .. (j+1)*nb]`.
    blocks: Blocks,
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

fn parse_blocks<B: Block>(data: &[u8], count: usize) -> Option<Vec<B>> {
    if data.len() != count * B::RAW_BYTES {
        return None;
    }
    Some(data.chunks_exact(B::RAW_BYTES).map(B::parse).collect())
}

impl CpuQuantMatrix {
    /// Takes a 2-D Q4_0, Q4_1 or Q8_0 tensor `[n, k]` with `k` a multiple of 32; `None`
    /// for anything else (the caller keeps candle's `QMatMul` for it). The blocks are
    /// copied as they are, only their f16 scales widened to f32.
    pub fn from_qtensor(t: &QTensor) -> Option<Self> {
        let (n, k) = t.shape().dims2().ok()?;
        if k == 0 || !k.is_multiple_of(QK) {
            return None;
        }
        let count = n * (k / QK);
        let blocks = match t.dtype() {
            GgmlDType::Q4_0 => Blocks::Q4_0(parse_blocks(&t.data().ok()?, count)?),
            GgmlDType::Q4_1 => Blocks::Q4_1(parse_blocks(&t.data().ok()?, count)?),
            GgmlDType::Q8_0 => Blocks::Q8_0(parse_blocks(&t.data().ok()?, count)?),
            _ => return None,
        };
        Some(CpuQuantMatrix { n, k, blocks })
    }

    /// A dense f32 `[n, k]` CPU matrix (k a multiple of 32), multiplied with the same
    /// fixed arithmetic as the quantized formats.
    pub fn from_dense(t: &Tensor) -> Option<Self> {
        let (n, k) = t.dims2().ok()?;
        if k == 0 || !k.is_multiple_of(QK) || t.dtype() != DType::F32 || !t.device().is_cpu() {
            return None;
        }
        let rows = t.to_vec2::<f32>().ok()?;
        let blocks = rows
            .iter()
            .flat_map(|row| row.chunks_exact(QK).map(F32x32::from_row_chunk))
            .collect();
        Some(CpuQuantMatrix {
            n,
            k,
            blocks: Blocks::F32(blocks),
        })
    }

    /// `(n, k)`: outputs, inputs.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The storage name: "q4_0", "q4_1", "q8_0" or "f32".
    pub fn dtype_name(&self) -> &'static str {
        match self.blocks {
            Blocks::Q4_0(_) => "q4_0",
            Blocks::Q4_1(_) => "q4_1",
            Blocks::Q8_0(_) => "q8_0",
            Blocks::F32(_) => "f32",
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
        let (x, _) = x.as_chunks::<LANES>();
        let (n, nb) = (self.n, self.k / QK);
        debug_assert_eq!(x.len(), m * 2 * nb);
        let mut out = vec![0f32; m * n];
        if m == 0 || n == 0 {
            return out;
        }
        let cols = cols_per_task
            .unwrap_or_else(|| self.cols_per_task(m))
            .max(1);
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
        match &self.blocks {
            Blocks::Q4_0(b) => run_tasks(b, nb, x, cols, tasks, isa),
            Blocks::Q4_1(b) => run_tasks(b, nb, x, cols, tasks, isa),
            Blocks::Q8_0(b) => run_tasks(b, nb, x, cols, tasks, isa),
            Blocks::F32(b) => run_tasks(b, nb, x, cols, tasks, isa),
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
/// columns `t*cols ..` (`blocks.len() / nb` columns in all) into its row pieces.
fn run_tasks<B: Block>(
    blocks: &[B],
    nb: usize,
    x: &[Half],
    cols: usize,
    tasks: Vec<Vec<&mut [f32]>>,
    isa: Isa,
) {
    let task = |(t, mut rows): (usize, Vec<&mut [f32]>)| {
        let (j0, ct) = (t * cols, rows[0].len());
        columns(&blocks[j0 * nb..(j0 + ct) * nb], nb, x, &mut rows, isa);
    };
    if tasks.len() == 1 {
        tasks.into_iter().enumerate().for_each(task);
    } else {
        tasks.into_par_iter().enumerate().for_each(task);
    }
}
