//! One sequence's keys and values, owned by the engine and lent to the model per step.

use candle_core::{DType, Device, Result, Tensor};

use super::config::ModelConfig;

struct LayerCache {
    /// \[kv_heads, capacity, head_dim\]
    k: Tensor,
    v: Tensor,
}

/// Preallocated for the sequence's whole reservation (prompt + max_new_tokens), so a step
/// writes in place and never copies the past.
pub struct SeqCache {
    layers: Vec<LayerCache>,
    len: usize,
    capacity: usize,
}

impl SeqCache {
    pub fn new(cfg: &ModelConfig, capacity: usize, device: &Device) -> Result<Self> {
        let shape = (cfg.num_kv_heads, capacity, cfg.head_dim);
        let layers = (0..cfg.num_layers)
            .map(|_| {
                Ok(LayerCache {
                    k: Tensor::zeros(shape, DType::F32, device)?,
                    v: Tensor::zeros(shape, DType::F32, device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SeqCache {
            layers,
            len: 0,
            capacity,
        })
    }

    /// Tokens already cached (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes `k`, `v` (\[kv_heads, new, head_dim\]) after the cached tokens of `layer` and
    /// returns every cached key and value so far, this step's included.
    pub fn append(&self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let new = k.dim(1)?;
        let end = self.len + new;
        if end > self.capacity {
            candle_core::bail!(
                "KV cache overflow: {end} tokens for a reservation of {}",
                self.capacity
            );
        }
        let Some(cache) = self.layers.get(layer) else {
            candle_core::bail!("KV cache has no layer {layer}");
        };
        cache.k.slice_set(k, 1, self.len)?;
        cache.v.slice_set(v, 1, self.len)?;
        Ok((cache.k.narrow(1, 0, end)?, cache.v.narrow(1, 0, end)?))
    }

    /// Called once all layers have appended `new` tokens.
    pub fn advance(&mut self, new: usize) {
        self.len += new;
    }
}
