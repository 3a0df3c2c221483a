//! From a spec and a weight source to a [`Model`]: every tensor the spec applies is taken
//! with its expected shape, its kernel is chosen for the device, and afterwards any tensor
//! of the file that nothing took refuses the file.

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device};

use super::attention::{AttnParams, HeadShape};
use super::cpu_matmul::CpuQuantMatrix;
use super::decoder::{AttentionKernel, GateUp, Layer, Model, Qkv};
use super::layers::{candle_matmuls_in_f32, Embedding, Kernel, Linear, RmsNorm};
use super::names::{LayerTensor as L, Naming, Part, TensorName};
use super::rope::Rope;
use super::spec::{FreqFactors, MlpLayout, ModelSpec, QkvLayout};
use super::weights::{ggml_type_name, Weight, WeightSource};
use crate::error::{LoadError, Unapplied};

/// How the model is put on its device.
#[derive(Debug, Clone)]
pub struct Placement {
    pub device: Device,
    /// The attention kernel; `None` picks the host kernel on the CPU and candle's ops
    /// elsewhere (tests run the candle path on the CPU too).
    pub attention: Option<AttentionKernel>,
    /// Bytes the CPU matrices of Q4_0, Q4_1, Q5_0 and Q5_1 may take for a second copy of
    /// their quants, a byte each, which products of several rows read faster
    /// ([`CpuQuantMatrix::add_wide_copy`]); matrices get one in load order while it
    /// lasts. Speed only: the scores are the same bits with or without.
    pub wide_quants_bytes: usize,
}

struct Loader<'a> {
    spec: &'a ModelSpec,
    src: &'a mut WeightSource,
    naming: Naming,
    device: Device,
    /// What is left of [`Placement::wide_quants_bytes`].
    wide_budget: usize,
}

impl Model {
    pub fn load(
        mut spec: ModelSpec,
        src: &mut WeightSource,
        placement: &Placement,
    ) -> Result<Self, LoadError> {
        let naming = match src.gguf_content() {
            Some(_) => Naming::Gguf,
            None => Naming::Hf(spec.hf_naming),
        };
        let attention = placement.attention.unwrap_or(if placement.device.is_cpu() {
            AttentionKernel::Host
        } else {
            AttentionKernel::Candle
        });
        if attention == AttentionKernel::Host && !placement.device.is_cpu() {
            return Err(LoadError::Unsupported {
                file: src.file().to_string(),
                what: "the host attention kernel needs the CPU".into(),
            });
        }
        candle_matmuls_in_f32(&placement.device);
        resolve_rope_factors(&mut spec, src, naming)?;
        let ropes = spec
            .ropes
            .iter()
            .map(Rope::new)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|problem| LoadError::Spec {
                file: src.file().to_string(),
                problem,
            })?;
        let mut l = Loader {
            spec: &spec,
            src,
            naming,
            device: placement.device.clone(),
            wide_budget: placement.wide_quants_bytes,
        };
        let (hidden, vocab) = (spec.hidden_size, spec.vocab_size);
        let mut table = l.kernel(TensorName::TokenEmbd, vocab, hidden)?;
        let (lm_head, greedy) = if spec.tied_output {
            l.check_tied_copy()?;
            let bytes = table.add_greedy_index();
            (Linear::new(table.clone(), None), bytes)
        } else {
            let mut output = l.linear(TensorName::Output, vocab, hidden)?;
            let bytes = output.add_greedy_index();
            (output, bytes)
        };
        if greedy > 0 {
            tracing::info!(
                kib = greedy >> 10,
                "index of the output layer, for the greedy tokens of unscored requests"
            );
        }
        let embedding = Embedding::new(table, hidden, spec.embedding_scale);
        let layers = (0..spec.num_layers())
            .map(|i| l.layer(i))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = l.norm(TensorName::OutputNorm, hidden)?;
        let wide = placement.wide_quants_bytes - l.wide_budget;
        if wide > 0 {
            tracing::info!(
                mib = wide >> 20,
                "wide copies of the Q4/Q5 matrices, for batches and prefills"
            );
        }
        if let Some(tensor) = l.src.first_unused() {
            return Err(LoadError::NotApplied {
                file: l.src.file().to_string(),
                what: Unapplied::Tensor(tensor),
                architecture: spec.architecture.name().to_string(),
            });
        }
        Ok(Model {
            embedding,
            layers,
            norm,
            lm_head,
            ropes,
            attention,
            device: placement.device.clone(),
            spec,
        })
    }
}

/// `rope_freqs.weight` (Llama 3.1 GGUFs) becomes the divisors of the ropes that ask for it.
fn resolve_rope_factors(
    spec: &mut ModelSpec,
    src: &mut WeightSource,
    naming: Naming,
) -> Result<(), LoadError> {
    for i in 0..spec.ropes.len() {
        if spec.ropes[i].freq_factors != FreqFactors::FromFile {
            continue;
        }
        let half = spec.ropes[i].dims / 2;
        let key = key(src, naming, TensorName::RopeFreqs, Part::Weight)?;
        let values = src.vector(&key, half, &Device::Cpu)?.to_vec1::<f32>()?;
        if let Some(bad) = values.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(LoadError::Corrupt {
                file: src.file().to_string(),
                problem: format!(
                    "tensor {key} holds {bad}; rope frequency factors must be positive"
                ),
            });
        }
        spec.ropes[i].freq_factors =
            FreqFactors::Values(values.iter().map(|&v| f64::from(v)).collect());
    }
    Ok(())
}

fn key(src: &WeightSource, naming: Naming, t: TensorName, part: Part) -> Result<String, LoadError> {
    naming.key(t, part).ok_or_else(|| LoadError::Unsupported {
        file: src.file().to_string(),
        what: format!("{t:?} has no name in this format"),
    })
}

impl Loader<'_> {
    fn key(&self, t: TensorName, part: Part) -> Result<String, LoadError> {
        key(self.src, self.naming, t, part)
    }

    /// The kernel for a matrix `[rows, cols]`: Sonde's exact one on the CPU (or a load
    /// error naming a block format it lacks), candle's elsewhere.
    fn kernel(&mut self, t: TensorName, rows: usize, cols: usize) -> Result<Kernel, LoadError> {
        let key = self.key(t, Part::Weight)?;
        let weight = self.src.matrix(&key, [rows, cols], &self.device)?;
        if !self.device.is_cpu() {
            return Ok(Kernel::Candle(match weight {
                Weight::Quantized(q) => QMatMul::from_qtensor(*q)?,
                Weight::Dense(t) => {
                    QMatMul::Tensor(t.to_dtype(DType::F32)?.to_device(&self.device)?)
                }
            }));
        }
        let (matrix, format) = match &weight {
            Weight::Quantized(q) => (CpuQuantMatrix::from_qtensor(q), ggml_type_name(q.dtype())),
            Weight::Dense(t) => (
                CpuQuantMatrix::from_dense(t),
                format!("{:?}", t.dtype()).to_lowercase(),
            ),
        };
        matrix
            .map(|mut m| {
                let cost = m.wide_copy_bytes();
                if cost > 0 && cost <= self.wide_budget {
                    m.add_wide_copy();
                    self.wide_budget -= cost;
                }
                Kernel::Host(Arc::new(m))
            })
            .ok_or_else(|| LoadError::UnsupportedFormat {
                file: self.src.file().to_string(),
                tensor: key,
                format,
                served: CpuQuantMatrix::SERVED.to_string(),
            })
    }

    /// A projection with the bias the file holds, if any.
    fn linear(&mut self, t: TensorName, rows: usize, cols: usize) -> Result<Linear, LoadError> {
        let kernel = self.kernel(t, rows, cols)?;
        let bias_key = self.key(t, Part::Bias)?;
        let bias = self.src.opt_vector(&bias_key, rows, &self.device)?;
        Ok(Linear::new(kernel, bias))
    }

    fn norm(&mut self, t: TensorName, len: usize) -> Result<RmsNorm, LoadError> {
        let key = self.key(t, Part::Weight)?;
        let weight = self.src.vector(&key, len, &self.device)?;
        Ok(RmsNorm::new(
            weight,
            self.spec.rms_norm_eps,
            self.spec.norm_weight_offset,
        )?)
    }

    /// A Hugging Face checkpoint may store `lm_head.weight` beside a tied embedding; it
    /// is accepted when it is the same matrix (transformers ignores it then).
    fn check_tied_copy(&mut self) -> Result<(), LoadError> {
        let out = self.key(TensorName::Output, Part::Weight)?;
        if self.naming.is_gguf() || !self.src.contains(&out) {
            return Ok(());
        }
        let emb = self.key(TensorName::TokenEmbd, Part::Weight)?;
        let (vocab, hidden) = (self.spec.vocab_size, self.spec.hidden_size);
        let (Weight::Dense(a), Weight::Dense(b)) = (
            self.src.matrix(&emb, [vocab, hidden], &Device::Cpu)?,
            self.src.matrix(&out, [vocab, hidden], &Device::Cpu)?,
        ) else {
            return Ok(());
        };
        let same = a
            .to_dtype(DType::F32)?
            .eq(&b.to_dtype(DType::F32)?)?
            .to_dtype(DType::F32)?
            .min_all()?
            .to_scalar::<f32>()?
            == 1.0;
        if !same {
            return Err(LoadError::Config {
                file: self.src.file().to_string(),
                problem: format!(
                    "tie_word_embeddings is set, but {out} differs from {emb}; \
                     it is unclear which output layer the model means"
                ),
            });
        }
        Ok(())
    }

    fn layer(&mut self, i: usize) -> Result<Layer, LoadError> {
        let s = self.spec;
        let n = |t| TensorName::Layer(i, t);
        let (hidden, ff, d) = (s.hidden_size, s.intermediate_size, s.head_dim);
        let (qw, kw) = (s.q_width(), s.kv_width());
        let qkv = match s.qkv {
            QkvLayout::Separate => Qkv::Separate {
                q: self.linear(n(L::Q), qw, hidden)?,
                k: self.linear(n(L::K), kw, hidden)?,
                v: self.linear(n(L::V), kw, hidden)?,
            },
            QkvLayout::Fused => Qkv::Fused(self.linear(n(L::Qkv), qw + 2 * kw, hidden)?),
        };
        let (q_norm, k_norm) = if s.qk_norm {
            (
                Some(self.norm(n(L::QNorm), d)?),
                Some(self.norm(n(L::KNorm), d)?),
            )
        } else {
            (None, None)
        };
        let gate_up = match s.mlp {
            MlpLayout::Separate => GateUp::Separate {
                gate: self.linear(n(L::Gate), ff, hidden)?,
                up: self.linear(n(L::Up), ff, hidden)?,
            },
            MlpLayout::Fused => GateUp::Fused(self.linear(n(L::GateUp), 2 * ff, hidden)?),
        };
        let post = |l: &mut Self, t| -> Result<Option<RmsNorm>, LoadError> {
            if s.post_norms {
                l.norm(n(t), hidden).map(Some)
            } else {
                Ok(None)
            }
        };
        let spec = s.layers[i];
        Ok(Layer {
            attn_norm: self.norm(n(L::AttnNorm), hidden)?,
            qkv,
            q_norm,
            k_norm,
            o: self.linear(n(L::O), hidden, qw)?,
            post_attn_norm: post(self, L::PostAttnNorm)?,
            ffn_norm: self.norm(n(L::FfnNorm), hidden)?,
            gate_up,
            down: self.linear(n(L::Down), hidden, ff)?,
            post_ffn_norm: post(self, L::PostFfnNorm)?,
            attn: AttnParams {
                shape: HeadShape {
                    num_heads: s.num_heads,
                    num_kv_heads: s.num_kv_heads,
                    head_dim: d,
                },
                scale: s.attention_scale as f32,
                softcap: s.attention_softcap.map(|c| c as f32),
                window: spec.window,
            },
            rope: spec.rope,
        })
    }
}
