//! One sequence's keys and values, owned by the engine and lent to the model per step.

use candle_core::{DType, Device, Result, Tensor};

use super::spec::ModelSpec;

/// Where a cache lives, chosen once at load with the attention kernel.
#[derive(Debug, Clone)]
pub enum KvLayout {
    /// Host vectors, read and written in place by the CPU attention kernel.
    Host,
    /// Tensors on a device, for candle's ops.
    Device(Device),
}

/// One layer's keys and values, `[kv_heads, capacity, head_dim]` each.
enum LayerStore {
    /// In host memory, for the CPU attention kernel to read and write directly.
    Host { k: Vec<f32>, v: Vec<f32> },
    /// On the model's device, for candle's ops.
    Device { k: Tensor, v: Tensor },
}

/// Preallocated for the sequence's whole reservation (prompt + max_new_tokens), so a step
/// writes in place and never copies the past.
pub struct SeqCache {
    layers: Vec<LayerStore>,
    len: usize,
    capacity: usize,
    head_dim: usize,
}

/// A host layer's cached keys and values, as the CPU attention kernel sees them.
pub struct HostLayer<'a> {
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    /// Tokens cached before this step.
    pub past: usize,
    pub capacity: usize,
}

impl SeqCache {
    pub fn new(spec: &ModelSpec, capacity: usize, layout: &KvLayout) -> Result<Self> {
        let shape = (spec.num_kv_heads, capacity, spec.head_dim);
        let elems = spec.num_kv_heads * capacity * spec.head_dim;
        let layers = (0..spec.num_layers())
            .map(|_| {
                Ok(match layout {
                    KvLayout::Host => LayerStore::Host {
                        k: vec![0.0; elems],
                        v: vec![0.0; elems],
                    },
                    KvLayout::Device(device) => LayerStore::Device {
                        k: Tensor::zeros(shape, DType::F32, device)?,
                        v: Tensor::zeros(shape, DType::F32, device)?,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SeqCache {
            layers,
            len: 0,
            capacity,
            head_dim: spec.head_dim,
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

    /// The layer's host buffers, when the cache lives on the host.
    pub fn host_layer(&mut self, layer: usize) -> Option<HostLayer<'_>> {
        match self.layers.get_mut(layer)? {
            LayerStore::Host { k, v } => Some(HostLayer {
                k,
                v,
                past: self.len,
                capacity: self.capacity,
            }),
            LayerStore::Device { .. } => None,
        }
    }

    /// Writes `k`, `v` (\[kv_heads, new, head_dim\]) after the cached tokens of a device
    /// layer and returns every cached key and value so far, this step's included. The
    /// model checked beforehand that the step fits the reservation.
    pub fn append_device(&self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let end = self.len + k.dim(1)?;
        let Some(LayerStore::Device { k: kc, v: vc }) = self.layers.get(layer) else {
            candle_core::bail!("KV cache has no device layer {layer}");
        };
        kc.slice_set(k, 1, self.len)?;
        vc.slice_set(v, 1, self.len)?;
        Ok((kc.narrow(1, 0, end)?, vc.narrow(1, 0, end)?))
    }

    /// Called once all layers have appended `new` tokens.
    pub fn advance(&mut self, new: usize) {
        self.len += new;
    }

    /// Forgets every position from `len` on (a rejected draft's): the next step writes
    /// over them, and no read goes past the length.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Copies the keys and values of positions `start..start + rows` out; None unless the
    /// cache lives on the host and holds those positions.
    pub fn copy_rows(&self, start: usize, rows: usize) -> Option<KvRows> {
        let d = self.head_dim;
        if start + rows > self.len || self.capacity == 0 {
            return None;
        }
        let mut data = Vec::with_capacity(self.layers.len() * 2 * rows * d);
        for layer in &self.layers {
            let LayerStore::Host { k, v } = layer else {
                return None;
            };
            for store in [k, v] {
                for head in store.chunks_exact(self.capacity * d) {
                    data.extend_from_slice(&head[start * d..(start + rows) * d]);
                }
            }
        }
        Some(KvRows {
            data,
            rows,
            head_dim: d,
        })
    }

    /// Appends the first `take` positions of `rows` (laid out as [`KvRows`]) after the
    /// cached tokens, as if a step had computed them.
    pub fn append_rows(&mut self, rows: &KvRows, take: usize) -> Result<()> {
        let d = rows.head_dim;
        if take > rows.rows || self.len + take > self.capacity || d != self.head_dim {
            candle_core::bail!(
                "KV cache: {take} cached rows do not fit after {} of {} tokens",
                self.len,
                self.capacity
            );
        }
        let per_head = rows.rows * d;
        let mut src = rows.data.chunks_exact(per_head);
        for layer in &mut self.layers {
            let LayerStore::Host { k, v } = layer else {
                candle_core::bail!("KV cache: cached rows can only be loaded into host memory");
            };
            for store in [k, v] {
                for head in store.chunks_exact_mut(self.capacity * d) {
                    let Some(from) = src.next() else {
                        candle_core::bail!("KV cache: cached rows are shorter than the model");
                    };
                    head[self.len * d..][..take * d].copy_from_slice(&from[..take * d]);
                }
            }
        }
        self.len += take;
        Ok(())
    }
}

/// Keys and values of consecutive positions copied out of a cache:
/// `[layer][k, v][kv_head][rows][head_dim]`.
pub struct KvRows {
    pub data: Vec<f32>,
    pub rows: usize,
    pub head_dim: usize,
}
