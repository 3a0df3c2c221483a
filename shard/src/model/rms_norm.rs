//! RMS normalization of f32 rows on the CPU with the sum of squares in 8 lanes, in place of
//! candle's op, which sums a row's squares one after the other: a chain of dependent
//! additions, about 0.6 µs a 576-wide row, on the engine thread while the matmul team's
//! helper waits (at 16 decode streams, 61 norms a step took about 1% of it). Each row is
//! computed alone, the same way in any batch.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::attention::dot;
use super::layers::host_f32;

/// `x / sqrt(mean(x²) + eps) * alpha` over the last dimension: CPU f32 tensors here,
/// candle's op on other devices.
pub fn rms_norm(xs: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
    if xs.device().is_cpu() && xs.dtype() == DType::F32 && alpha.dtype() == DType::F32 {
        return xs.apply_op2_no_bwd(alpha, &HostRmsNorm { eps });
    }
    candle_nn::ops::rms_norm(xs, alpha, eps)
}

struct HostRmsNorm {
    eps: f32,
}

impl CustomOp2 for HostRmsNorm {
    fn name(&self) -> &'static str {
        "sonde-rms-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xs_layout: &Layout,
        alpha: &CpuStorage,
        alpha_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let xs_shape = xs_layout.shape();
        let xs = host_f32(xs, xs_layout, "rms norm")?;
        let alpha = host_f32(alpha, alpha_layout, "rms norm")?;
        let n = alpha.len();
        if xs_shape.dims().last() != Some(&n) {
            candle_core::bail!("rms norm: rows of {xs_shape:?} and weight of {n} differ");
        }
        if n == 0 {
            candle_core::bail!("rms norm: rows of {xs_shape:?} are empty");
        }
        let mut out = vec![0f32; xs.len()];
        for (src, dst) in xs.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            row(src, alpha, self.eps, dst);
        }
        Ok((CpuStorage::F32(out), xs_shape.clone()))
    }
}

/// One row: the squares summed as attention's `dot` sums (8 partial sums folded in a
/// fixed order), then candle's `x / m * alpha`.
fn row(src: &[f32], alpha: &[f32], eps: f32, dst: &mut [f32]) {
    let m = (dot(src, src) / src.len() as f32 + eps).sqrt();
    for ((d, &s), &a) in dst.iter_mut().zip(src).zip(alpha) {
        *d = s / m * a;
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// Against the definition in f64, for widths with and without a tail, and against
    /// candle's op; each row is the same computed alone.
    #[test]
    fn matches_the_definition_and_rows_alone() -> Result<()> {
        let eps = 1e-5f32;
        for n in [576, 64, 67, 3] {
            let rows = 5;
            let xs: Vec<f32> = (0..rows * n)
                .map(|i| ((i * 7919) % 1013) as f32 / 300.0 - 1.7)
                .collect();
            let alpha: Vec<f32> = (0..n).map(|i| 0.5 + (i % 11) as f32 / 10.0).collect();
            let x = Tensor::from_vec(xs.clone(), (rows, n), &Device::Cpu)?;
            let a = Tensor::from_vec(alpha.clone(), n, &Device::Cpu)?;
            let got = rms_norm(&x, &a, eps)?.flatten_all()?.to_vec1::<f32>()?;
            let candle = candle_nn::ops::rms_norm(&x, &a, eps)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            for (r, src) in xs.chunks_exact(n).enumerate() {
                let ms = src.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
                let m = (ms + f64::from(eps)).sqrt();
                let alone = Tensor::from_vec(src.to_vec(), (1, n), &Device::Cpu)?;
                let alone = rms_norm(&alone, &a, eps)?.flatten_all()?.to_vec1::<f32>()?;
                for i in 0..n {
                    let (k, want) = (r * n + i, f64::from(src[i]) / m * f64::from(alpha[i]));
                    let tol = 4e-7 * want.abs().max(1e-3);
                    assert!((f64::from(got[k]) - want).abs() <= tol, "n={n} [{r},{i}]");
                    assert!((got[k] - candle[k]).abs() <= 1e-6 * candle[k].abs().max(1e-3));
                    assert_eq!(got[k].to_bits(), alone[i].to_bits(), "n={n} [{r},{i}]");
                }
            }
        }
        Ok(())
    }
}
