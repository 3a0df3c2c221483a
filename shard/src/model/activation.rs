//! The gated MLP's `act(gate) * up` on the CPU, in one pass over the two rows and with
//! Sonde's own vectorizing activations (`fastmath`), in place of candle's two ops: its GELU
//! called libm's `tanhf` per element, single-threaded, which was 5 to 10% of a Gemma 3
//! decode step at 16 streams.
//!
//! Elementwise, so a token's result is the same in any batch.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::spec::Activation;
use crate::fastmath::{gelu_tanh, silu};

/// `act(gate) * up`, elementwise: CPU f32 tensors here, candle's ops on other devices.
pub fn gated(activation: Activation, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.device().is_cpu() && gate.dtype() == candle_core::DType::F32 {
        return gate.apply_op2_no_bwd(up, &Gated(activation));
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
        if gate_layout.shape() != up_layout.shape() {
            candle_core::bail!(
                "gated MLP: gate {:?} and up {:?} differ in shape",
                gate_layout.shape(),
                up_layout.shape()
            );
        }
        let gate = contiguous(gate, gate_layout)?;
        let up = contiguous(up, up_layout)?;
        let out: Vec<f32> = match self.0 {
            Activation::Silu => gate.iter().zip(up).map(|(&g, &u)| silu(g) * u).collect(),
            Activation::GeluTanh => gate
                .iter()
                .zip(up)
                .map(|(&g, &u)| gelu_tanh(g) * u)
                .collect(),
        };
        Ok((CpuStorage::F32(out), gate_layout.shape().clone()))
    }
}

/// The f32 values `layout` selects, when they are one contiguous run.
fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("gated MLP: input is not contiguous".into()))?;
    Ok(&storage.as_slice::<f32>()?[start..end])
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

    #[test]
    fn refuses_mismatched_shapes() -> Result<()> {
        let gate = Tensor::zeros((2, 8), candle_core::DType::F32, &Device::Cpu)?;
        let up = Tensor::zeros((2, 4), candle_core::DType::F32, &Device::Cpu)?;
        assert!(gated(Activation::Silu, &gate, &up).is_err());
        Ok(())
    }
}
