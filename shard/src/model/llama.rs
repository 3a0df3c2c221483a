//! The Llama-family transformer (Llama, SmolLM, Mistral, Qwen2) over a ragged batch.
//!
//! A step's tokens from every sequence are packed into one \[tokens, hidden\] matrix: the
//! projections and the MLP run on all of them at once, attention runs per sequence
//! against that sequence's own cache. Nothing a token computes reads another sequence's
//! rows, so a request's numbers are the same alone or in any batch.

use candle_core::{DType, Device, Result, Tensor};

use super::attention::{host_attention, HeadShape, StepQkv};
use super::config::ModelConfig;
use super::kv_cache::SeqCache;
use super::layers::{Embedding, Linear, RmsNorm, Rotary};
use super::weights::{LayerTensor as L, Name, WeightSource};
use crate::error::LoadError;

/// One sequence's slice of a packed step.
#[derive(Debug, Clone, Copy)]
pub struct SeqSpan {
    /// First row of the sequence in the packed tokens.
    pub start: usize,
    /// Rows of this step (the whole prompt on prefill, 1 on decode).
    pub len: usize,
}

/// The packed input of one forward step.
pub struct StepInput<'a> {
    /// \[tokens\] u32
    pub tokens: Tensor,
    pub spans: &'a [SeqSpan],
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

struct DecoderLayer {
    attn_norm: RmsNorm,
    attn: Attention,
    ffn_norm: RmsNorm,
    mlp: Mlp,
}

pub struct Model {
    cfg: ModelConfig,
    embedding: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    rotary: Rotary,
    device: Device,
}

/// Per-sequence tensors shared by all layers of a step.
struct SeqStep {
    span: SeqSpan,
    /// Additive causal mask \[n_rep * len, past + len\]; none for a single new token.
    mask: Option<Tensor>,
}

/// What every layer of one step shares: rotary tables of the packed tokens' positions
/// and the sequences' spans and masks.
struct StepContext<'a> {
    rotary: &'a Rotary,
    cos: Tensor,
    sin: Tensor,
    seqs: Vec<SeqStep>,
}

impl Model {
    pub fn load(
        cfg: ModelConfig,
        src: &mut WeightSource,
        device: &Device,
    ) -> std::result::Result<Self, LoadError> {
        let mut matrix = |name| src.matrix(name, device);
        let embedding = Embedding::new(matrix(Name::Embedding)?);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let n = |t| Name::Layer(i, t);
            let bias = |src: &mut WeightSource, t| -> std::result::Result<_, LoadError> {
                Ok(if cfg.qkv_bias {
                    Some(src.vector(n(t), device)?)
                } else {
                    None
                })
            };
            let attn = Attention {
                q: Linear::new(src.matrix(n(L::Q), device)?, bias(src, L::QBias)?),
                k: Linear::new(src.matrix(n(L::K), device)?, bias(src, L::KBias)?),
                v: Linear::new(src.matrix(n(L::V), device)?, bias(src, L::VBias)?),
                o: Linear::new(src.matrix(n(L::O), device)?, None),
                num_heads: cfg.num_heads,
                num_kv_heads: cfg.num_kv_heads,
                head_dim: cfg.head_dim,
            };
            let mlp = Mlp {
                gate: Linear::new(src.matrix(n(L::Gate), device)?, None),
                up: Linear::new(src.matrix(n(L::Up), device)?, None),
                down: Linear::new(src.matrix(n(L::Down), device)?, None),
            };
            layers.push(DecoderLayer {
                attn_norm: RmsNorm::new(src.vector(n(L::AttnNorm), device)?, cfg.rms_norm_eps),
                attn,
                ffn_norm: RmsNorm::new(src.vector(n(L::FfnNorm), device)?, cfg.rms_norm_eps),
                mlp,
            });
        }
        let norm = RmsNorm::new(src.vector(Name::OutputNorm, device)?, cfg.rms_norm_eps);
        // Tied embeddings (SmolLM2) have no output matrix: the embedding is the output layer.
        let lm_head = if src.contains(Name::Output) {
            src.matrix(Name::Output, device)?
        } else {
            src.matrix(Name::Embedding, device)?
        };
        Ok(Model {
            rotary: Rotary::new(&cfg, device)?,
            cfg,
            embedding,
            layers,
            norm,
            lm_head: Linear::new(lm_head, None),
            device: device.clone(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Runs one step and returns the final-normed hidden states \[tokens, hidden\].
    /// `caches[i]` belongs to `input.spans[i]` and receives that span's keys and values.
    pub fn forward(&self, input: &StepInput, caches: &mut [&mut SeqCache]) -> Result<Tensor> {
        if caches.len() != input.spans.len() {
            candle_core::bail!(
                "{} caches for {} sequences",
                caches.len(),
                input.spans.len()
            );
        }
        // One check for the whole step, so no layer writes past a reservation.
        for (span, cache) in input.spans.iter().zip(caches.iter()) {
            if cache.len() + span.len > cache.capacity() {
                candle_core::bail!(
                    "KV cache overflow: {} tokens for a reservation of {}",
                    cache.len() + span.len,
                    cache.capacity()
                );
            }
        }
        let positions: Vec<u32> = input
            .spans
            .iter()
            .zip(caches.iter())
            .flat_map(|(span, cache)| {
                let past = cache.len();
                (past..past + span.len).map(|p| p as u32)
            })
            .collect();
        let positions = Tensor::new(positions, &self.device)?;
        let (cos, sin) = self.rotary.tables(&positions)?;
        let seqs = input
            .spans
            .iter()
            .zip(caches.iter())
            .map(|(span, cache)| {
                Ok(SeqStep {
                    span: *span,
                    // The host kernel applies causality itself.
                    mask: if self.device.is_cpu() {
                        None
                    } else {
                        self.causal_mask(span.len, cache.len())?
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ctx = StepContext {
            rotary: &self.rotary,
            cos,
            sin,
            seqs,
        };

        let mut xs = self.embedding.forward(&input.tokens)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let h = layer.attn_norm.forward(&xs)?;
            let h = layer.attn.forward(i, &h, &ctx, caches)?;
            xs = (xs + h)?;
            let h = layer.ffn_norm.forward(&xs)?;
            xs = (&xs + layer.mlp.forward(&h)?)?;
        }
        for (span, cache) in input.spans.iter().zip(caches.iter_mut()) {
            cache.advance(span.len);
        }
        self.norm.forward(&xs)
    }

    /// Output logits for rows of final hidden states: \[rows, hidden\] → \[rows, vocab\].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(hidden)?.to_dtype(DType::F32)
    }

    fn causal_mask(&self, len: usize, past: usize) -> Result<Option<Tensor>> {
        if len <= 1 {
            return Ok(None);
        }
        // Rows are grouped per KV head: n_rep query heads × len positions each.
        let n_rep = self.cfg.num_heads / self.cfg.num_kv_heads;
        let total = past + len;
        let mut mask = Vec::with_capacity(n_rep * len * total);
        for _ in 0..n_rep {
            for q in 0..len {
                mask.extend((0..total).map(|k| if k > past + q { f32::NEG_INFINITY } else { 0.0 }));
            }
        }
        Ok(Some(Tensor::from_vec(
            mask,
            (n_rep * len, total),
            &self.device,
        )?))
    }
}

impl Attention {
    fn forward(
        &self,
        layer: usize,
        xs: &Tensor,
        ctx: &StepContext,
        caches: &mut [&mut SeqCache],
    ) -> Result<Tensor> {
        let n = xs.dim(0)?;
        let q = self
            .q
            .forward(xs)?
            .reshape((n, self.num_heads, self.head_dim))?;
        let k = self
            .k
            .forward(xs)?
            .reshape((n, self.num_kv_heads, self.head_dim))?;
        let v = self
            .v
            .forward(xs)?
            .reshape((n, self.num_kv_heads, self.head_dim))?;
        let q = ctx.rotary.apply(&q, &ctx.cos, &ctx.sin)?;
        let k = ctx.rotary.apply(&k, &ctx.cos, &ctx.sin)?;
        if xs.device().is_cpu() {
            let host = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
            let (q, k, v) = (host(&q)?, host(&k)?, host(&v)?);
            let spans: Vec<SeqSpan> = ctx.seqs.iter().map(|s| s.span).collect();
            let shape = HeadShape {
                num_heads: self.num_heads,
                num_kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
            };
            let qkv = StepQkv {
                q: &q,
                k: &k,
                v: &v,
            };
            let out = host_attention(shape, &spans, &qkv, caches, layer)?;
            let out = Tensor::from_vec(out, (n, self.num_heads * self.head_dim), xs.device())?;
            return self.o.forward(&out);
        }
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let n_rep = self.num_heads / self.num_kv_heads;

        let mut outs = Vec::with_capacity(ctx.seqs.len());
        for (step, cache) in ctx.seqs.iter().zip(caches.iter()) {
            let SeqSpan { start, len } = step.span;
            // [len, heads, d] → [heads, len, d] → [kv_heads, n_rep * len, d]: the query
            // heads sharing a KV head become rows of one matrix product.
            let q = (q.narrow(0, start, len)?.transpose(0, 1)?.contiguous()? * scale)?
                .reshape((self.num_kv_heads, n_rep * len, self.head_dim))?;
            let k_new = k.narrow(0, start, len)?.transpose(0, 1)?.contiguous()?;
            let v_new = v.narrow(0, start, len)?.transpose(0, 1)?.contiguous()?;
            let (k_all, v_all) = cache.append_device(layer, &k_new, &v_new)?;
            let scores = q.matmul(&k_all.t()?)?;
            let scores = match &step.mask {
                Some(mask) => scores.broadcast_add(mask)?,
                None => scores,
            };
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let out = probs
                .matmul(&v_all)?
                .reshape((self.num_heads, len, self.head_dim))?
                .transpose(0, 1)?
                .reshape((len, self.num_heads * self.head_dim))?;
            outs.push(out);
        }
        let out = Tensor::cat(&outs, 0)?;
        self.o.forward(&out)
    }
}

impl Mlp {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate.forward(xs)?)?;
        self.down.forward(&(gate * self.up.forward(xs)?)?)
    }
}
