//! Blocks shared by the Llama-family layers: projections, RMS norm, rotary embedding.
//!
//! Every op here works row by row: a token's result never depends on which other tokens
//! share its batch, which is what makes scores batch-invariant.

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Module, Result, Tensor};

use super::config::{ModelConfig, RopeStyle};
use super::cpu_matmul::CpuQuantMatrix;

/// How a projection multiplies.
enum Kernel {
    /// Sonde's exact, batch-invariant CPU kernel (Q4_0, Q4_1, Q8_0, dense f32).
    Cpu(CpuQuantMatrix),
    /// candle's: other block formats, and every format on GPUs.
    Candle(QMatMul),
}

/// A projection `x @ W^T (+ b)` over rows of activations.
pub struct Linear {
    kernel: Kernel,
    bias: Option<Tensor>,
}

impl Linear {
    /// Takes Sonde's CPU kernel when it covers the weight's format and device.
    pub fn new(weight: QMatMul, bias: Option<Tensor>) -> Self {
        let cpu = match &weight {
            QMatMul::QTensor(t) if t.device().is_cpu() => CpuQuantMatrix::from_qtensor(t),
            QMatMul::Tensor(t) => CpuQuantMatrix::from_dense(t),
            _ => None,
        };
        let kernel = match cpu {
            Some(m) => Kernel::Cpu(m),
            None => Kernel::Candle(weight),
        };
        Linear { kernel, bias }
    }

    /// `xs`: \[rows, in\] → \[rows, out\].
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let ys = match &self.kernel {
            Kernel::Cpu(m) => m.forward(xs)?,
            Kernel::Candle(w) => w.forward(xs)?,
        };
        match &self.bias {
            Some(b) => ys.broadcast_add(b),
            None => Ok(ys),
        }
    }
}

/// The token embedding table (which may be quantized, and shared with the output layer).
pub struct Embedding {
    table: QMatMul,
}

impl Embedding {
    pub fn new(table: QMatMul) -> Self {
        Embedding { table }
    }

    /// Rows of the table as f32: \[tokens\] → \[tokens, hidden\].
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.table.embedding(ids)?.to_dtype(DType::F32)
    }
}

pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Self {
        RmsNorm {
            weight,
            eps: eps as f32,
        }
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(xs, &self.weight, self.eps)
    }
}

/// Rotary embedding with cos/sin tables for every position of the context.
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
    style: RopeStyle,
}

impl Rotary {
    pub fn new(cfg: &ModelConfig, device: &Device) -> Result<Self> {
        let half = cfg.head_dim / 2;
        let positions = cfg.max_position_embeddings;
        // Frequencies and angles in f64, then rounded once, so long positions keep
        // their precision.
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for i in 0..half {
                let inv_freq = 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / cfg.head_dim as f64);
                let angle = p as f64 * inv_freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok(Rotary {
            cos: Tensor::from_vec(cos, (positions, half), device)?,
            sin: Tensor::from_vec(sin, (positions, half), device)?,
            style: cfg.rope_style,
        })
    }

    /// The tables' rows for the given positions, shaped to rotate one token per batch row.
    pub fn tables(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = positions.dim(0)?;
        let half = self.cos.dim(1)?;
        let cos = self.cos.index_select(positions, 0)?.reshape((n, 1, half))?;
        let sin = self.sin.index_select(positions, 0)?.reshape((n, 1, half))?;
        Ok((cos, sin))
    }

    /// `xs`: \[tokens, heads, head_dim\], each token rotated by its own position's table.
    pub fn apply(&self, xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (n, heads, dim) = xs.dims3()?;
        // Each token is its own "batch" entry of candle's rope kernels, which take
        // per-batch tables: one op rotates a ragged batch at arbitrary positions.
        let xs = xs.reshape((n, heads, 1, dim))?;
        let ys = match self.style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&xs, cos, sin)?,
            RopeStyle::Half => candle_nn::rotary_emb::rope(&xs, cos, sin)?,
        };
        ys.reshape((n, heads, dim))
    }
}
