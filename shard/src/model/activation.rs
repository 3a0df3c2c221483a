//! The gated MLP's `act(gate) * up` on the CPU, in one pass over the two rows and with
//! Sonde's own vectorizing activations (`fastmath`), in place of candle's two ops: its GELU
//! called libm's `tanhf` per element, single-threaded, which was 5 to 10% of a Gemma 3
//! decode step at 16 streams. The pass runs on the matmul team, with AVX2 where the CPU
//! has it: on one thread with SSE2 it took 6% of a 16-prompt prefill of SmolLM2 on the
//! engine thread, while the helper waited.
//!
//! Elementwise, so a token's result is the same in any batch, on any thread; the AVX2
//! loop and the baseline one compute the same operations, so the same bits.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use std::mem::MaybeUninit;

use super::elementwise::{self, host_pair};
use super::spec::Activation;
use crate::fastmath::{gelu_tanh, silu};

/// `act(gate) * up`, elementwise: CPU f32 tensors here, candle's ops on other devices.
/// Inputs laid out other than row-major (a column slice of a fused projection) are copied
/// first: the pass reads one run of values, and candle's ops would not give its bits.
pub fn gated(activation: Activation, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.device().is_cpu() && gate.dtype() == candle_core::DType::F32 {
        return gate
            .contiguous()?
            .apply_op2_no_bwd(&up.contiguous()?, &Gated(activation));
    }
    let gate = match activation {
        Activation::Silu => candle_nn::ops::silu(gate)?,
        // candle's `gelu` is the tanh approximation (`gelu_erf` is the exact one).
        Activation::GeluTanh => gate.gelu()?,
    };
    gate * up
}

struct Gated(Activation);

impl CustomOp2 for Gated {
    fn name(&self) -> &'static str {
        "sonde-gated"
    }

    fn cpu_fwd(
        &self,
        gate: &CpuStorage,
        gate_layout: &Layout,
        up: &CpuStorage,
        up_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (gate, up) = host_pair((gate, gate_layout), (up, up_layout), "gated MLP")?;
        let mut out = Box::new_uninit_slice(gate.len());
        on_team(self.0, gate, up, &mut out);
        // SAFETY: `on_team` wrote every element (its pieces cover `out`).
        let out = unsafe { out.assume_init() }.into_vec();
        Ok((CpuStorage::F32(out), gate_layout.shape().clone()))
    }
}

/// `out[i] = act(gate[i]) * up[i]` for every `i`, in pieces on the team.
fn on_team(act: Activation, gate: &[f32], up: &[f32], out: &mut [MaybeUninit<f32>]) {
    elementwise::on_team(out, &|at, out| {
        apply(act, &gate[at..at + out.len()], &up[at..at + out.len()], out)
    });
}

/// `out[i] = act(gate[i]) * up[i]`, with AVX2 where the CPU has it.
fn apply(act: Activation, gate: &[f32], up: &[f32], out: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { apply_avx2(act, gate, up, out) };
    }
    apply_lanes(act, gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn apply_avx2(act: Activation, gate: &[f32], up: &[f32], out: &mut [MaybeUninit<f32>]) {
    apply_lanes(act, gate, up, out)
}

/// The loop itself: plain f32 operations (`fastmath`), which vectorize to whatever the
/// function it inlines into allows, with the same bits.
#[inline(always)]
fn apply_lanes(act: Activation, gate: &[f32], up: &[f32], out: &mut [MaybeUninit<f32>]) {
    let elements = out.iter_mut().zip(gate.iter().zip(up));
    match act {
        Activation::Silu => elements.for_each(|(o, (&g, &u))| {
            o.write(silu(g) * u);
        }),
        Activation::GeluTanh => elements.for_each(|(o, (&g, &u))| {
            o.write(gelu_tanh(g) * u);
        }),
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// The op against the activations' definitions in f64, times `up`: within a few ulp
    /// (`fastmath`'s tests bound each activation over its whole range), so the op picks
    /// the right function and multiplies the right elements. (Not against candle's GELU,
    /// whose `1 + tanh` cancels for negative inputs: 1e-5 relative off at `x = -3`.)
    #[test]
    fn matches_the_definitions() -> Result<()> {
        let xs: Vec<f32> = (0..4096).map(|i| (i as f32 - 2048.0) / 400.0).collect();
        let ups: Vec<f32> = (0..4096).map(|i| 1.0 + (i % 7) as f32 / 8.0).collect();
        let gate = Tensor::from_vec(xs.clone(), (4, 1024), &Device::Cpu)?;
        let up = Tensor::from_vec(ups.clone(), (4, 1024), &Device::Cpu)?;
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let gelu = |x: f64| {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            x / (1.0 + (-2.0 * u).exp())
        };
        for (act, f) in [
            (Activation::Silu, silu as fn(f64) -> f64),
            (Activation::GeluTanh, gelu),
        ] {
            let got: Vec<f32> = gated(act, &gate, &up)?.flatten_all()?.to_vec1()?;
            for ((&x, &u), &got) in xs.iter().zip(&ups).zip(&got) {
                let want = f(f64::from(x)) * f64::from(u);
                let tol = 40.0 * f64::from(f32::EPSILON) * want.abs();
                assert!(
                    (f64::from(got) - want).abs() <= tol,
                    "{act:?}({x}) * {u}: {got} vs {want}"
                );
            }
        }
        Ok(())
    }

    /// The pieces on the team and the AVX2 loop give the baseline loop's bits, for every
    /// length around the piece sizes (a length the pieces do not divide leaves a short
    /// last one).
    #[test]
    fn team_and_avx2_give_the_baseline_bits() {
        for len in [0, 1, 7, 4095, 4096, 4097, 3 * 4096 + 5, 24_576, 100_003] {
            let gate: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
            let up: Vec<f32> = (0..len).map(|i| 1.0 + (i % 13) as f32 / 7.0).collect();
            for act in [Activation::Silu, Activation::GeluTanh] {
                let mut want = vec![MaybeUninit::uninit(); len];
                apply_lanes(act, &gate, &up, &mut want);
                let mut got = vec![MaybeUninit::uninit(); len];
                on_team(act, &gate, &up, &mut got);
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    // SAFETY: both loops write every element.
                    let (w, g) = unsafe { (w.assume_init(), g.assume_init()) };
                    assert_eq!(w.to_bits(), g.to_bits(), "{act:?} len {len} at {i}");
                }
            }
        }
    }

    #[test]
    fn takes_column_slices_as_their_copies() -> Result<()> {
        let values: Vec<f32> = (0..6 * 16).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        let fused = Tensor::from_vec(values, (6, 16), &Device::Cpu)?;
        let (gate, up) = (fused.narrow(1, 0, 8)?, fused.narrow(1, 8, 8)?);
        assert!(!gate.is_contiguous());
        for act in [Activation::Silu, Activation::GeluTanh] {
            let sliced = gated(act, &gate, &up)?.flatten_all()?.to_vec1::<f32>()?;
            let copied = gated(act, &gate.contiguous()?, &up.contiguous()?)?;
            let copied = copied.flatten_all()?.to_vec1::<f32>()?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&sliced), bits(&copied), "{act:?}");
        }
        Ok(())
    }

    #[test]
    fn refuses_mismatched_shapes() -> Result<()> {
        let gate = Tensor::zeros((2, 8), candle_core::DType::F32, &Device::Cpu)?;
        let up = Tensor::zeros((2, 4), candle_core::DType::F32, &Device::Cpu)?;
        assert!(gated(Activation::Silu, &gate, &up).is_err());
        Ok(())
    }
}
