//! Exact, batch-invariant CPU matmul for weights in their ggml blocks (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) and dense (F32, F16, BF16).
//!
//! candle's `QMatMul` quantizes the *activations* to 8 bits before its integer dot
//! products. That costs up to ~1 nat of log-probability against a float64 reference,
//! too much for a server that sells exact scores. Here the f32 activations meet the
//! weights' exact values (the quants and scales ggml stores, which candle's `to_float`
//! dequantizes), so each output is the float64 dot product up to f32 rounding.
//!
//! # The arithmetic of one output (the batch-invariance contract)
//!
//! Every format's weight is `w = a · q + b`: `q` an integer quant, `a` and `b` shared by
//! a run of 16 or 32 inputs (a *half*; `b = 0` where the format has no offset). Output
//! `(row, col)` is `Σ_i x[row][i] · w[col][i]` computed as follows, and only so:
//!
//! - an f32 accumulator `acc` starts at `0.0`;
//! - block after block, part after part: a sum `s` starts at `0.0` and takes `s =
//!   fma(x_i, q_i, s)` for the part's inputs `i` in the order below (Q6_K: a sum for
//!   each half, each taking its own inputs in that order);
//! - then `acc = fma(a, s, acc)` and, with an offset, `acc = fma(b, X, acc)`, where `X` is
//!   the sum of the part's `x_i` (each run of 16 summed as a fixed tree, the runs added
//!   left to right; `input`). Q6_K: the low half's, then the high half's.
//!
//! | format | part | inputs of a part, in order (`a, b` = `a` then `b`) | `a` | `b` |
//! |---|---|---|---|---|
//! | Q4_0 | 32 | `j = 0..16`: `j, j+16` (`q` = nibble - 8) | `d` | |
//! | Q4_1 | 32 | same (`q` = nibble) | `d` | `m` |
//! | Q5_0 | 32 | same (`q` = q5 - 16) | `d` | |
//! | Q5_1 | 32 | same (`q` = q5) | `d` | `m` |
//! | Q8_0 | 32 | same (`q` = the i8) | `d` | |
//! | F32, F16, BF16 | 32 | same (`q` = the weight, widened exactly) | `1` | |
//! | Q4_K, Q5_K | 32 (a sub-block) | same | `d·sc` | `-(dmin·m)` |
//! | Q6_K | 32 (two sub-blocks of 16) | part `4h + t` (`h < 2`, `t < 4`): `j = 16t..16t+16`: `128h+j, 128h+j+64` (`q` = q6 - 32) | `d·sc` of each half | |
//!
//! (`blocks` says which inputs each part holds and why its weights, `fma(q, a, b)` or
//! `q · a`, are bit for bit candle's: the weight rows served from the tiles, for a tied
//! embedding, are.) Nothing in that sequence depends on the number of rows, on the other
//! rows, on how columns are grouped or split across threads, or on the CPU: every kernel
//! variant does exactly these fused multiply-adds (AVX-512 and AVX2 with FMA
//! instructions, the portable one with `f32::mul_add`, which is the same single rounding
//! on every target). Vector lanes hold *columns*, never parts of one sum, so there is no
//! lane reduction to order; threads split the columns, and one thread computes each
//! output entirely. So a row's scores are the same alone or in any batch, on any x86 or
//! ARM.
//!
//! Why the quants and not the weights: `Σ w x = a · Σ q x + b · Σ x` saves the kernel a
//! multiply-add per weight and per row, its costliest step when one row (one stream)
//! shares nothing; the error stays within f32's bound on `Σ |x| (|a q| + |b|)` (the tests
//! check it against float64 on real and random blocks).
//!
//! # Speed
//!
//! At load, the blocks of 16 adjacent columns at the same inputs are interleaved into a
//! tile (`blocks`), keeping the quants' and scales' bytes (the bytes a decode step
//! streams are its cost), so one vector op unpacks one input of 16 columns and the
//! scales are vectors too. The kernel (`kernel`) takes `R` rows against `C` tiles: each
//! unpacked quant vector feeds `R` FMAs, each activation (broadcast) `C`, and the
//! `R * C` sums are independent FMA chains (AVX-512: 8 rows x 2 tiles, then 4 x 2 and
//! 2 x 4 for the rows left over, a single row 8 tiles; AVX2+FMA: 6 x 1, then 4 x 1 and
//! 2 x 2, one row 4 tiles; Q6_K, whose parts keep two sums, half as many tiles or rows).
//! Rows go in L2-sized pieces; threads (`team`: the caller and helpers that spin briefly
//! between products; small products stay on the calling thread) take ranges of tile
//! columns and write their sums straight into the output rows. A Q4_0 / Q4_1 / Q5_0 /
//! Q5_1 matrix may also hold a wide copy, its quants a byte each (`blocks::wide`), which
//! products of [`WIDE_MIN_ROWS`] rows or more read: the same values, so the same sums.
//! On AVX-512, groups of 16 rows go to a kernel that turns this around (`kernel::lanes`):
//! a vector's lanes hold 16 rows of one column, the product's rows are transposed into
//! such vectors once (`input::Lanes`), each tile column is widened once into a buffer of
//! f32, and each multiply-add takes its quant from there as a broadcast operand, so the
//! loop does nothing else (prefill 1.17x, 16-row products 1.0–1.16x by format).
//! The kernel is written once, generic over a 16-lane vector type (`simd`), and
//! instantiated inside `#[target_feature]` functions chosen once per process at run time,
//! so the default x86-64 build still gets wide vectors; everything below those functions
//! must inline into them (see `simd`, "Inlining").
//! (Explicit intrinsics rather than auto-vectorisation: LLVM vectorised the nibble
//! unpacking across blocks instead of within one, several times slower, and did not keep
//! the accumulators in registers.)

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Storage, Tensor};

mod blocks;
mod formats;
mod greedy;
mod input;
mod kernel;
mod simd;
mod tasks;
#[cfg(test)]
mod tests;

use super::layers::host_f32;
use blocks::TILE;
use formats::Tiles;
use kernel::isa;
use tasks::{products, Split};

/// f32 lanes of the kernel's vectors: one per column of a tile.
const LANES: usize = 16;
/// Below this many multiply-adds a task is not worth handing to another thread.
const MIN_TASK_MACS: usize = 1 << 17;
/// Tasks per thread to aim for, so uneven progress evens out.
const TASKS_PER_THREAD: usize = 4;
/// Columns per task are a multiple of this (two tiles, the group a batch takes at a
/// time), so tiles are only padded at the very end of the matrix. Speed only.
const COL_ALIGN: usize = 2 * TILE;
/// Products of at least this many rows read a matrix's wide copy, where it has one: below,
/// the packed tiles' fewer bytes win, since a decode step reads its weights from memory
/// (see `blocks::wide`). Speed only.
const WIDE_MIN_ROWS: usize = 10;

/// One vector's worth of f32: a lane per column of a tile.
type Half = [f32; LANES];

/// A [`Half`] on a cache line of its own, for buffers the kernel reads and writes a vector
/// at a time: a vector that straddles two lines costs two accesses (the kernel that puts
/// rows in lanes ran about 10% faster from aligned buffers).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line(Half);

impl Line {
    const ZERO: Line = Line([0.0; LANES]);
}

/// An output of a product before the kernel writes it. The kernel writes every output
/// exactly once and reads none, so the output buffers start uninitialized: zeroing them
/// first took 4–5% of a prefill's time, on the engine thread while the others waited.
type Out = std::mem::MaybeUninit<f32>;

/// A weight matrix `[n, k]` (n outputs, k inputs) in its ggml blocks, multiplied on the
/// CPU by f32 activations, exactly and batch-invariantly (see the module docs).
#[derive(Clone)]
pub struct CpuQuantMatrix {
    n: usize,
    k: usize,
    /// Tile column `g` (columns `16 g ..`) has its `k / INPUTS` tiles at `g * k / INPUTS ..`.
    tiles: Tiles,
    /// The same quants a byte each, which products of at least [`WIDE_MIN_ROWS`] rows
    /// read (`blocks::wide`), if [`CpuQuantMatrix::add_wide_copy`] made one.
    wide: Option<Tiles>,
    /// What [`CpuQuantMatrix::greedy_tokens`] reads besides the tiles, if
    /// [`CpuQuantMatrix::add_greedy_index`] made it (`greedy`).
    greedy: Option<greedy::GreedyIndex>,
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
    /// The storage formats served, by [`CpuQuantMatrix::dtype_name`], for messages.
    pub const SERVED: &'static str =
        "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k";

    /// Whether [`CpuQuantMatrix::from_qtensor`] takes tensors of `dtype` (given a 2-D
    /// shape whose row length is a multiple of the block size).
    pub fn supports(dtype: GgmlDType) -> bool {
        formats::supports(dtype)
    }

    /// Takes a 2-D tensor `[n, k]` of a supported block format (GGUF F32/F16/BF16 too)
    /// with `k` a multiple of its block size (32, or 256 for the K-quants); `None` for
    /// anything else. The quants and scales are kept as stored, only regrouped into tiles.
    pub fn from_qtensor(t: &QTensor) -> Option<Self> {
        let (n, k) = t.shape().dims2().ok()?;
        let tiles = Tiles::new(t.dtype(), &t.data().ok()?, n, k)?;
        Some(CpuQuantMatrix {
            n,
            k,
            tiles,
            wide: None,
            greedy: None,
        })
    }

    /// A dense `[n, k]` CPU matrix of f32, f16 or bf16 (k a multiple of 32), multiplied
    /// with the same fixed arithmetic as the block formats; f16 and bf16 stay 2 bytes a
    /// weight.
    pub fn from_dense(t: &Tensor) -> Option<Self> {
        let (n, k) = t.dims2().ok()?;
        if !t.device().is_cpu() {
            return None;
        }
        let t = t.flatten_all().ok()?;
        let (dtype, bytes): (_, Vec<u8>) = match t.dtype() {
            DType::F32 => (
                GgmlDType::F32,
                le_bytes(t.to_vec1::<f32>().ok()?, f32::to_le_bytes),
            ),
            DType::F16 => (
                GgmlDType::F16,
                le_bytes(t.to_vec1::<half::f16>().ok()?, half::f16::to_le_bytes),
            ),
            DType::BF16 => (
                GgmlDType::BF16,
                le_bytes(t.to_vec1::<half::bf16>().ok()?, half::bf16::to_le_bytes),
            ),
            _ => return None,
        };
        let tiles = Tiles::new(dtype, &bytes, n, k)?;
        Some(CpuQuantMatrix {
            n,
            k,
            tiles,
            wide: None,
            greedy: None,
        })
    }

    /// Bytes [`CpuQuantMatrix::add_wide_copy`] would take: 0 for the formats without a
    /// wide copy (all but Q4_0, Q4_1, Q5_0 and Q5_1) or a matrix that has one already.
    pub fn wide_copy_bytes(&self) -> usize {
        match self.wide {
            Some(_) => 0,
            None => self.tiles.widened_bytes(),
        }
    }

    /// Adds a copy of the quants at a byte each (about 1.1 bytes a weight), which products
    /// of several rows (a batch, a prefill, a verified draft) read faster. Results are
    /// the same bits with or without it.
    pub fn add_wide_copy(&mut self) {
        if self.wide.is_none() {
            self.wide = self.tiles.widened();
        }
    }

    /// `(n, k)`: outputs, inputs.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The storage name: one of [`CpuQuantMatrix::SERVED`].
    pub fn dtype_name(&self) -> &'static str {
        self.tiles.name()
    }

    /// Writes weight row `i` (output `i`'s `k` weights; for a tied embedding table, token
    /// `i`'s embedding) into `out`, bit for bit as candle's `to_float` dequantizes it.
    pub fn row_into(&self, i: usize, out: &mut [f32]) -> Result<()> {
        if i >= self.n || out.len() != self.k {
            candle_core::bail!(
                "CpuQuantMatrix::row_into: row {i} into {} values, the matrix is {}x{}",
                out.len(),
                self.n,
                self.k
            );
        }
        self.tiles.row(i, out, isa());
        Ok(())
    }

    /// `xs`: f32 CPU tensor `[.., k]` (usually `[m, k]`) → `[.., n]`, i.e. `xs @ W^T`.
    /// Row `r` of the result depends on row `r` of `xs` only, bit for bit.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let mut ys = Self::forward_same(&[self], xs)?;
        ys.pop()
            .ok_or_else(|| candle_core::Error::Msg("CpuQuantMatrix::forward: no product".into()))
    }

    /// [`CpuQuantMatrix::greedy_tokens`] of the rows of `xs` (f32 CPU, `[.., k]`).
    pub fn greedy_tensor(&self, xs: &Tensor) -> Result<Option<Vec<u32>>> {
        if !self.has_greedy_index() || !xs.device().is_cpu() || xs.dtype() != DType::F32 {
            return Ok(None);
        }
        if xs.dims().last() != Some(&self.k) {
            candle_core::bail!(
                "CpuQuantMatrix::greedy_tensor: input {:?}, the matrix wants {} features",
                xs.dims(),
                self.k
            );
        }
        let xs = xs.contiguous()?;
        let (storage, layout) = xs.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            return Ok(None);
        };
        Ok(self.greedy_tokens(host_f32(cpu, layout, "CpuQuantMatrix::greedy_tensor")?))
    }

    /// The products of several matrices with the same input (q, k and v; gate and up),
    /// each exactly as [`CpuQuantMatrix::forward`] computes it, run as one job for the
    /// threads: at one row the small products (k and v) are a single task each, which
    /// alone would leave the other threads idle. One result per matrix, in order.
    pub fn forward_same(ms: &[&Self], xs: &Tensor) -> Result<Vec<Tensor>> {
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
        if let Some(m) = ms.iter().find(|m| m.k != k) {
            candle_core::bail!(
                "CpuQuantMatrix::forward: input has {k} features, the {}x{} matrix wants {}",
                m.n,
                m.k,
                m.k
            );
        }
        let xs = xs.contiguous()?;
        let (storage, layout) = xs.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            candle_core::bail!("CpuQuantMatrix::forward: input is not in CPU memory");
        };
        let x = host_f32(cpu, layout, "CpuQuantMatrix::forward")?;
        let outs = products(ms, x, isa(), Split::default());
        drop(storage);
        ms.iter()
            .zip(outs)
            .map(|(m, out)| {
                let mut shape = lead.to_vec();
                shape.push(m.n);
                Tensor::from_vec(out, shape, &Device::Cpu)
            })
            .collect()
    }
}

/// The little-endian bytes of `values`.
fn le_bytes<T, const N: usize>(values: Vec<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.into_iter().flat_map(f).collect()
}
