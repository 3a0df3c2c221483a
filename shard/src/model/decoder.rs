//! The decoder: one forward pass for every architecture, over a ragged batch, reading
//! only the [`ModelSpec`].
//!
//! A step's tokens from every sequence are packed into one \[tokens, hidden\] matrix: the
//! projections and the MLP run on all of them at once, attention runs per sequence
//! against that sequence's own cache. Nothing a token computes reads another sequence's
//! rows, so a request's numbers are the same alone or in any batch.
//!
//! One layer, as the spec switches it:
//!
//! ```text
//! h = attn_norm(x)
//! q, k, v = h·Wq, h·Wk, h·Wv  (or one fused h·Wqkv), each + its bias when the file has one
//! q, k = q_norm(q), k_norm(k)  per head          (qk_norm: Qwen3, Gemma 3)
//! q, k = rope_l(q), rope_l(k)                    (the layer's rope: base, factors, dims)
//! a = softmax(cap(q·k * scale) + mask_l) · v     (mask_l: causal, and the layer's window)
//! x = x + post_attn_norm(a·Wo)                   (post_norms: Gemma)
//! h = ffn_norm(x)
//! x = x + post_ffn_norm(down(act(h·Wgate) * h·Wup))
//! ```
//!
//! then `logits = cap(output_norm(x)·Wout)`, with `Wout` the embedding when tied.
//!
//! A step returns the final rows its caller asks for (`StepInput::returned`): a prefill
//! without prompt scores needs each prompt's last row only, so the last layer computes
//! the keys and values of every row (later positions read them) but the queries,
//! attention output, o and MLP of the returned rows alone (most of one layer of 18 on
//! Gemma 3, of 30 on SmolLM2).

use candle_core::{DType, Device, Result, Tensor};

use super::activation::gated;
use super::attention::{host_attention, AttnParams, AttnStep, StepQkv};
use super::attention_device::{device_attention, DeviceQkv};
use super::elementwise;
use super::kv_cache::{KvLayout, SeqCache};
use super::layers::{Embedding, Linear, RmsNorm};
use super::rope::{Rope, RopeTables};
use super::spec::{Activation, ModelSpec};

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
    pub tokens: &'a [u32],
    pub spans: &'a [SeqSpan],
    /// How many of its last rows each sequence needs back (`None`: every row). Past its
    /// keys and values, which later positions read, the last layer computes only those
    /// (llama.cpp's `inp_out_ids`): a prefill without prompt scores needs one row.
    pub returned: Option<&'a [usize]>,
}

/// The rows a step returns when it returns fewer than all: the last layer's queries,
/// attention output, o and MLP are computed for these alone. Every kernel computes a row
/// the same way whatever the other rows, so these rows are the bits of a full pass.
struct Kept {
    /// Each sequence's kept rows, packed: the last `len` rows of its span.
    spans: Vec<SeqSpan>,
    /// Their indices among the step's rows.
    index: Tensor,
    /// Each rope's tables at their positions.
    tables: Vec<RopeTables>,
}

/// The rows a layer's attention works on: every row's rope tables (of the layer's rope),
/// and the rows it computes queries and output for when not all (`Kept`).
struct LayerRows<'a> {
    tables: &'a RopeTables,
    kept: Option<&'a Kept>,
}

/// Which attention kernel runs, chosen once at load with the cache layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// The CPU kernel over host memory (`attention.rs`).
    Host,
    /// candle ops with a mask (`attention_device.rs`): GPUs.
    Candle,
}

pub(super) enum Qkv {
    Separate {
        q: Linear,
        k: Linear,
        v: Linear,
    },
    /// Rows \[q | k | v\].
    Fused(Linear),
}

pub(super) enum GateUp {
    Separate {
        gate: Linear,
        up: Linear,
    },
    /// Rows \[gate | up\].
    Fused(Linear),
}

pub(super) struct Layer {
    pub attn_norm: RmsNorm,
    pub qkv: Qkv,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub o: Linear,
    pub post_attn_norm: Option<RmsNorm>,
    pub ffn_norm: RmsNorm,
    pub gate_up: GateUp,
    pub down: Linear,
    pub post_ffn_norm: Option<RmsNorm>,
    pub attn: AttnParams,
    /// Index into `Model::ropes`.
    pub rope: usize,
}

pub struct Model {
    pub(super) spec: ModelSpec,
    pub(super) embedding: Embedding,
    pub(super) layers: Vec<Layer>,
    pub(super) norm: RmsNorm,
    pub(super) lm_head: Linear,
    pub(super) ropes: Vec<Rope>,
    pub(super) attention: AttentionKernel,
    pub(super) device: Device,
}

impl Model {
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether sequence caches live in host memory (the CPU attention kernel's layout).
    pub fn caches_on_host(&self) -> bool {
        self.attention == AttentionKernel::Host
    }

    /// A cache for one sequence of up to `capacity` tokens, laid out for this model's
    /// attention kernel.
    pub fn new_cache(&self, capacity: usize) -> Result<SeqCache> {
        let layout = match self.attention {
            AttentionKernel::Host => KvLayout::Host,
            AttentionKernel::Candle => KvLayout::Device(self.device.clone()),
        };
        SeqCache::new(&self.spec, capacity, &layout)
    }

    /// Runs one step and returns the final-normed hidden states \[tokens, hidden\] of the
    /// rows it returns (`input.returned`), in order. `caches[i]` belongs to
    /// `input.spans[i]` and receives that span's keys and values.
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
        let positions: Vec<usize> = input
            .spans
            .iter()
            .zip(caches.iter())
            .flat_map(|(span, cache)| cache.len()..cache.len() + span.len)
            .collect();
        if positions.len() != input.tokens.len() {
            candle_core::bail!(
                "{} tokens for spans of {} positions",
                input.tokens.len(),
                positions.len()
            );
        }
        let tables = self
            .ropes
            .iter()
            .map(|r| r.tables(&positions, &self.device))
            .collect::<Result<Vec<_>>>()?;
        let kept = self.kept(input, &positions)?;

        let mut xs = self.embedding.forward(input.tokens, &self.device)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let rows = LayerRows {
                tables: &tables[layer.rope],
                kept: kept.as_ref().filter(|_| i + 1 == self.layers.len()),
            };
            let h = layer.attn_norm.forward(&xs)?;
            let step = AttnStep {
                spans: input.spans,
                queries: rows.kept.map_or(input.spans, |r| &r.spans),
                caches: &mut *caches,
                layer: i,
            };
            let kept_index = rows.kept.map(|r| &r.index);
            let a = self.attend(&h, step, rows)?;
            if let Some(index) = kept_index {
                // The residual stream goes on with the kept rows alone.
                xs = xs.index_select(index, 0)?;
            }
            let a = apply_norm(layer.post_attn_norm.as_ref(), a)?;
            xs = elementwise::add(&xs, &a)?;
            let h = layer.ffn_norm.forward(&xs)?;
            let m = mlp(layer, self.spec.activation, &h)?;
            xs = elementwise::add(&xs, &apply_norm(layer.post_ffn_norm.as_ref(), m)?)?;
        }
        for (span, cache) in input.spans.iter().zip(caches.iter_mut()) {
            cache.advance(span.len);
        }
        self.norm.forward(&xs)
    }

    /// The rows `input.returned` keeps, or None when it keeps every row.
    fn kept(&self, input: &StepInput, positions: &[usize]) -> Result<Option<Kept>> {
        let Some(returned) = input.returned else {
            return Ok(None);
        };
        if returned.len() != input.spans.len() {
            candle_core::bail!(
                "{} returned counts for {} sequences",
                returned.len(),
                input.spans.len()
            );
        }
        if returned.iter().zip(input.spans).all(|(&n, s)| n == s.len) {
            return Ok(None);
        }
        let mut spans = Vec::with_capacity(returned.len());
        let mut rows = Vec::new();
        for (&n, span) in returned.iter().zip(input.spans) {
            if n == 0 || n > span.len {
                candle_core::bail!("a sequence returns {n} of its {} rows", span.len);
            }
            spans.push(SeqSpan {
                start: rows.len(),
                len: n,
            });
            rows.extend(span.start + span.len - n..span.start + span.len);
        }
        let at: Vec<usize> = rows.iter().map(|&r| positions[r]).collect();
        let tables = self
            .ropes
            .iter()
            .map(|r| r.tables(&at, &self.device))
            .collect::<Result<Vec<_>>>()?;
        let index: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        Ok(Some(Kept {
            spans,
            index: Tensor::new(index, &self.device)?,
            tables,
        }))
    }

    /// The argmax of each row of [`Model::logits`], the same token (ties to the smaller
    /// id), without computing every logit; `None` where it cannot tell (no index for the
    /// output layer, a final soft cap, which can tie logits that differ, or a row the full
    /// product must decide).
    pub fn greedy_tokens(&self, hidden: &Tensor) -> Result<Option<Vec<u32>>> {
        if self.spec.final_softcap.is_some() {
            return Ok(None);
        }
        self.lm_head.greedy_tokens(hidden)
    }

    /// Whether [`Model::greedy_tokens`] can answer.
    pub fn has_greedy_index(&self) -> bool {
        self.spec.final_softcap.is_none() && self.lm_head.has_greedy_index()
    }

    /// Output logits for rows of final hidden states: \[rows, hidden\] → \[rows, vocab\].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let logits = self.lm_head.forward(hidden)?.to_dtype(DType::F32)?;
        match self.spec.final_softcap {
            Some(cap) => (logits / cap)?.tanh()? * cap,
            None => Ok(logits),
        }
    }

    /// The attention sublayer of layer `step.layer`: projections, q/k norms, rope,
    /// attention, o. Keys and values come from every row of `h`; queries and the output
    /// from the `kept` rows alone when given (`tables` are every row's).
    fn attend(&self, h: &Tensor, step: AttnStep, rows: LayerRows) -> Result<Tensor> {
        let LayerRows { tables, kept } = rows;
        let layer = &self.layers[step.layer];
        let n = h.dim(0)?;
        let shape = layer.attn.shape;
        let (q, k, v) = match (&layer.qkv, kept) {
            (Qkv::Separate { q, k, v }, None) => {
                let [q, k, v] = Linear::forward_same([q, k, v], h)?;
                (q, k, v)
            }
            (Qkv::Separate { q, k, v }, Some(rows)) => {
                let [k, v] = Linear::forward_same([k, v], h)?;
                (q.forward(&h.index_select(&rows.index, 0)?)?, k, v)
            }
            (Qkv::Fused(qkv), _) => {
                let y = qkv.forward(h)?;
                let (qw, kw) = (self.spec.q_width(), self.spec.kv_width());
                let q = y.narrow(1, 0, qw)?.contiguous()?;
                (
                    match kept {
                        Some(rows) => q.index_select(&rows.index, 0)?,
                        None => q,
                    },
                    y.narrow(1, qw, kw)?.contiguous()?,
                    y.narrow(1, qw + kw, kw)?.contiguous()?,
                )
            }
        };
        let queries = q.dim(0)?;
        let q = q.reshape((queries, shape.num_heads, shape.head_dim))?;
        let k = k.reshape((n, shape.num_kv_heads, shape.head_dim))?;
        let v = v.reshape((n, shape.num_kv_heads, shape.head_dim))?;
        let q = apply_norm(layer.q_norm.as_ref(), q)?;
        let k = apply_norm(layer.k_norm.as_ref(), k)?;
        let rope = &self.ropes[layer.rope];
        let q = rope.apply(&q, kept.map_or(tables, |r| &r.tables[layer.rope]))?;
        let k = rope.apply(&k, tables)?;
        let out = match self.attention {
            AttentionKernel::Host => {
                let host = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
                let (q, k, v) = (host(&q)?, host(&k)?, host(&v)?);
                let qkv = StepQkv {
                    q: &q,
                    k: &k,
                    v: &v,
                };
                let out = host_attention(layer.attn, &qkv, step)?;
                let width = shape.num_heads * shape.head_dim;
                Tensor::from_vec(out, (queries, width), &self.device)?
            }
            AttentionKernel::Candle => {
                let qkv = DeviceQkv {
                    q: &q,
                    k: &k,
                    v: &v,
                };
                device_attention(layer.attn, &qkv, step)?
            }
        };
        layer.o.forward(&out)
    }
}

fn apply_norm(norm: Option<&RmsNorm>, xs: Tensor) -> Result<Tensor> {
    match norm {
        Some(n) => n.forward(&xs),
        None => Ok(xs),
    }
}

fn mlp(layer: &Layer, activation: Activation, h: &Tensor) -> Result<Tensor> {
    let hidden = match &layer.gate_up {
        GateUp::Separate { gate, up } => {
            let [gate, up] = Linear::forward_same([gate, up], h)?;
            gated(activation, &gate, &up)?
        }
        GateUp::Fused(gate_up) => {
            let y = gate_up.forward(h)?;
            let n = y.dim(1)? / 2;
            gated(activation, &y.narrow(1, 0, n)?, &y.narrow(1, n, n)?)?
        }
    };
    layer.down.forward(&hidden)
}
