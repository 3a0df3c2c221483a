//! Blocks shared by every layer: projections, the embedding table and RMS norms (the
//! gated MLP's activation is `activation`'s).
//!
//! Every op here works row by row: a token's result never depends on which other tokens
//! share its batch, which is what makes scores batch-invariant.

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{CpuStorage, DType, Device, Layout, Module, Result, Tensor};

use super::cpu_matmul::CpuQuantMatrix;

/// How a projection multiplies, chosen once at load.
#[derive(Clone)]
pub enum Kernel {
    /// Sonde's exact, batch-invariant CPU kernel (every served block format, dense
    /// f32/f16/bf16). Shared by a tied embedding and output layer.
    Host(Arc<CpuQuantMatrix>),
    /// candle's, on GPUs, with f32 activations (see [`candle_matmuls_in_f32`]).
    Candle(QMatMul),
}

impl Kernel {
    /// Makes the index [`Linear::greedy_tokens`] reads, where the kernel has one (the host
    /// kernel of a Q8_0 matrix, on a CPU with AVX-512 VNNI), before anything shares it;
    /// returns its bytes (0: none).
    pub fn add_greedy_index(&mut self) -> usize {
        match self {
            Kernel::Host(m) => Arc::get_mut(m).map_or(0, CpuQuantMatrix::add_greedy_index),
            Kernel::Candle(_) => 0,
        }
    }
}

/// Makes candle's quantized matmuls on `device` multiply f32 activations, as Sonde's CPU
/// kernels do. By default candle's CUDA kernels (MMVQ/MMQ, llama.cpp's) round the activations
/// to 8 bits (q8_1) before integer dot products, which moves logprobs by up to a nat
/// (docs/shard.md, Accuracy). Its DMMV path keeps them f32: one row goes through a
/// dequantize-mul-mat-vec kernel, more rows through the dequantized f32 matrix and cuBLAS,
/// whose f32 products stay f32 (no TF32). Both switches are process-wide in candle, which
/// suits a shard: it serves one model on one device. Nothing to do elsewhere: on the CPU the
/// projections use [`Kernel::Host`].
pub fn candle_matmuls_in_f32(device: &Device) {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        candle_core::quantized::cuda::set_force_dmmv(true);
        candle_core::cuda::set_gemm_reduced_precision_f32(false);
    }
    #[cfg(not(feature = "cuda"))]
    let _ = device;
}

/// A projection `x @ W^T (+ b)` over rows of activations.
pub struct Linear {
    kernel: Kernel,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(kernel: Kernel, bias: Option<Tensor>) -> Self {
        Linear { kernel, bias }
    }

    /// `xs`: \[rows, in\] → \[rows, out\].
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let ys = match &self.kernel {
            Kernel::Host(m) => m.forward(xs)?,
            Kernel::Candle(w) => w.forward(xs)?,
        };
        self.add_bias(ys)
    }

    /// Each row's argmax of [`Linear::forward`]'s rows, the same token, found without
    /// computing every output (`cpu_matmul::greedy`); `None` where this projection cannot
    /// (a bias, no index) or a row is left to the full product.
    pub fn greedy_tokens(&self, xs: &Tensor) -> Result<Option<Vec<u32>>> {
        match (&self.kernel, &self.bias) {
            (Kernel::Host(m), None) => m.greedy_tensor(xs),
            _ => Ok(None),
        }
    }

    /// Whether [`Linear::greedy_tokens`] can answer.
    pub fn has_greedy_index(&self) -> bool {
        match (&self.kernel, &self.bias) {
            (Kernel::Host(m), None) => m.has_greedy_index(),
            _ => false,
        }
    }

    /// See [`Kernel::add_greedy_index`]; none with a bias.
    pub fn add_greedy_index(&mut self) -> usize {
        match self.bias {
            Some(_) => 0,
            None => self.kernel.add_greedy_index(),
        }
    }

    /// Several projections of the same input (q, k, v; gate, up), each as
    /// [`Linear::forward`] computes it: on the CPU as one job for the threads
    /// ([`CpuQuantMatrix::forward_same`]), elsewhere one after the other.
    pub fn forward_same<const N: usize>(linears: [&Linear; N], xs: &Tensor) -> Result<[Tensor; N]> {
        let hosts: Option<Vec<&CpuQuantMatrix>> = linears
            .iter()
            .map(|l| match &l.kernel {
                Kernel::Host(m) => Some(&**m),
                Kernel::Candle(_) => None,
            })
            .collect();
        let ys: Result<Vec<Tensor>> = match hosts {
            Some(ms) => {
                let ys = CpuQuantMatrix::forward_same(&ms, xs)?;
                linears.iter().zip(ys).map(|(l, y)| l.add_bias(y)).collect()
            }
            None => linears.iter().map(|l| l.forward(xs)).collect(),
        };
        array(ys?)
    }

    fn add_bias(&self, ys: Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(b) => ys.broadcast_add(b),
            None => Ok(ys),
        }
    }
}

/// `N` tensors as an array.
fn array<const N: usize>(ys: Vec<Tensor>) -> Result<[Tensor; N]> {
    let got = ys.len();
    ys.try_into()
        .map_err(|_| candle_core::Error::Msg(format!("{got} products where {N} were asked")))
}

/// The token embedding table, optionally scaled (Gemma).
pub struct Embedding {
    table: Kernel,
    hidden: usize,
    scale: Option<f32>,
}

impl Embedding {
    pub fn new(table: Kernel, hidden: usize, scale: Option<f32>) -> Self {
        Embedding {
            table,
            hidden,
            scale,
        }
    }

    /// Rows of the table as f32: `ids` → \[tokens, hidden\].
    pub fn forward(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        let xs = match &self.table {
            Kernel::Host(m) => {
                // The rows as the output layer's kernel dequantizes them: one copy of the
                // table serves both when they are tied.
                let mut out = vec![0f32; ids.len() * self.hidden];
                for (row, &id) in out.chunks_mut(self.hidden).zip(ids) {
                    m.row_into(id as usize, row)?;
                }
                Tensor::from_vec(out, (ids.len(), self.hidden), device)?
            }
            Kernel::Candle(w) => w
                .embedding(&Tensor::new(ids, device)?)?
                .to_dtype(DType::F32)?,
        };
        match self.scale {
            Some(s) => xs.affine(f64::from(s), 0.0),
            None => Ok(xs),
        }
    }
}

pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// `offset` is added to the stored weight (Hugging Face Gemma's `1 + w`).
    pub fn new(weight: Tensor, eps: f64, offset: f32) -> Result<Self> {
        let weight = if offset == 0.0 {
            weight
        } else {
            weight.affine(1.0, f64::from(offset))?
        };
        Ok(RmsNorm {
            weight,
            eps: eps as f32,
        })
    }

    /// Normalizes the last dimension.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        super::rms_norm::rms_norm(xs, &self.weight, self.eps)
    }
}

/// The f32 values `layout` selects in a CPU tensor's storage, when they are one
/// contiguous run; `op` names the op in the error. Read in place: the callers are on
/// the hot path, where a copy of the activations or the logits would cost a pass.
pub(crate) fn host_f32<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
) -> Result<&'a [f32]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: input is not contiguous")))?;
    storage.as_slice::<f32>()?.get(start..end).ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "{op}: the layout selects {start}..{end} beyond its storage"
        ))
    })
}
