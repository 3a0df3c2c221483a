//! Elementwise passes on the matmul team: the split into pieces (shared with the gated
//! activation) and the residual add.
//!
//! The residual add is candle's `a + b` computed here for CPU f32 tensors. Candle runs a
//! binary op of at least 64K elements on its own thread pool, whose worker then spins for
//! a while after each op: in a prefill (16 prompts of 52 tokens make 832 × 576 elements)
//! that thread took about 2% of the process's CPU time, on a machine with a core for each
//! of the team's threads. Each element is one f32 addition whoever computes it, so the
//! result has candle's bits, in any batch.

use std::mem::MaybeUninit;
use std::sync::{Mutex, PoisonError};

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::layers::host_f32;
use crate::team::Team;

/// Elements below which a piece of a pass is not worth another thread (a few µs).
const MIN_TASK_ELEMENTS: usize = 4096;
/// Pieces per thread to aim for, so uneven progress evens out.
const TASKS_PER_THREAD: usize = 4;

/// `piece(at, out[at..at + len])` for pieces of `out` that cover it, on the team (on the
/// caller alone when `out` is too short to share).
pub(super) fn on_team(
    out: &mut [MaybeUninit<f32>],
    piece: &(dyn Fn(usize, &mut [MaybeUninit<f32>]) + Sync),
) {
    let team = Team::global();
    let tasks = (out.len() / MIN_TASK_ELEMENTS).clamp(1, team.threads() * TASKS_PER_THREAD);
    if tasks == 1 {
        return piece(0, out);
    }
    let len = out.len().div_ceil(tasks).max(1);
    let pieces: Vec<Mutex<&mut [MaybeUninit<f32>]>> = out.chunks_mut(len).map(Mutex::new).collect();
    team.run(pieces.len(), &|i| {
        // Each piece is locked once, by its own task: never poisoned, never contended.
        let mut out = pieces[i].lock().unwrap_or_else(PoisonError::into_inner);
        piece(i * len, &mut out);
    });
}

/// The two inputs of an elementwise op on CPU storage, as f32 slices of the same shape;
/// an error naming `op` otherwise.
pub(super) fn host_pair<'a>(
    (a, a_layout): (&'a CpuStorage, &Layout),
    (b, b_layout): (&'a CpuStorage, &Layout),
    op: &str,
) -> Result<(&'a [f32], &'a [f32])> {
    if a_layout.shape() != b_layout.shape() {
        candle_core::bail!(
            "{op}: inputs {:?} and {:?} differ in shape",
            a_layout.shape(),
            b_layout.shape()
        );
    }
    let (a, b) = (host_f32(a, a_layout, op)?, host_f32(b, b_layout, op)?);
    if a.len() != b.len() {
        candle_core::bail!("{op}: inputs of {} and {} values", a.len(), b.len());
    }
    Ok((a, b))
}

/// `a + b` (the same shape): on the team for contiguous CPU f32 tensors, candle's op
/// for the others.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let host = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous();
    if host(a) && host(b) {
        return a.apply_op2_no_bwd(b, &Add);
    }
    a + b
}

struct Add;

impl CustomOp2 for Add {
    fn name(&self) -> &'static str {
        "sonde-add"
    }

    fn cpu_fwd(
        &self,
        a: &CpuStorage,
        a_layout: &Layout,
        b: &CpuStorage,
        b_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (a, b) = host_pair((a, a_layout), (b, b_layout), "residual add")?;
        let mut out = Box::new_uninit_slice(a.len());
        on_team(&mut out, &|at, out| {
            for (o, (x, y)) in out.iter_mut().zip(a[at..].iter().zip(&b[at..])) {
                o.write(x + y);
            }
        });
        // SAFETY: `on_team`'s pieces cover `out`, and each writes all of its elements
        // (`host_pair` gave `a` and `b` the length of `out`, so the zip stops at none).
        let out = unsafe { out.assume_init() }.into_vec();
        Ok((CpuStorage::F32(out), a_layout.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// Candle's bits, for lengths around the piece sizes (one piece, several, a short
    /// last one) and for a tensor that is a narrowed view of a bigger one.
    #[test]
    fn gives_candles_bits() -> Result<()> {
        for len in [1, 7, 4095, 4096, 4097, 3 * 4096 + 5, 100_003] {
            let xs: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
            let ys: Vec<f32> = (0..len).map(|i| (i as f32 * 0.11).cos() / 3.0).collect();
            let a = Tensor::from_vec(xs, len, &Device::Cpu)?;
            let b = Tensor::from_vec(ys, len, &Device::Cpu)?;
            let want: Vec<f32> = (&a + &b)?.to_vec1()?;
            let got: Vec<f32> = add(&a, &b)?.to_vec1()?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "len {len}");
        }
        let big = Tensor::arange(0f32, 64.0, &Device::Cpu)?.reshape((8, 8))?;
        let rows = big.narrow(0, 2, 3)?;
        let ones = Tensor::ones((3, 8), DType::F32, &Device::Cpu)?;
        let got: Vec<Vec<f32>> = add(&rows, &ones)?.to_vec2()?;
        assert_eq!(got, (&rows + &ones)?.to_vec2::<f32>()?);
        Ok(())
    }

    #[test]
    fn refuses_mismatched_shapes() -> Result<()> {
        let a = Tensor::zeros((2, 8), DType::F32, &Device::Cpu)?;
        let b = Tensor::zeros((2, 4), DType::F32, &Device::Cpu)?;
        assert!(add(&a, &b).is_err());
        let c = Tensor::zeros((4, 4), DType::F32, &Device::Cpu)?;
        assert!(add(&b, &c).is_err());
        Ok(())
    }
}
