//! Causal attention of a ragged batch as candle ops, for devices other than the CPU
//! (and, in tests, on the CPU against the host kernel): per sequence, the query heads
//! sharing a KV head become rows of one matrix product against that sequence's cache,
//! with an additive mask for causality and the sliding window.

use candle_core::{Result, Tensor};

use super::attention::{AttnParams, AttnStep};
use super::decoder::SeqSpan;

/// The step's rows on the device: `q` is `[tokens, heads, d]`, `k` and `v` are
/// `[tokens, kv_heads, d]` (rotary applied).
pub struct DeviceQkv<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
}

/// The step's attention output of the query rows `[queries, heads * d]` (`q` holds those
/// rows alone, see [`AttnStep`]); appends its keys and values to each sequence's cache of
/// the layer.
pub fn device_attention(params: AttnParams, qkv: &DeviceQkv, step: AttnStep) -> Result<Tensor> {
    let DeviceQkv { q, k, v } = *qkv;
    step.query_rows()?;
    let AttnStep {
        spans,
        queries,
        caches,
        layer,
    } = step;
    let shape = params.shape;
    let n_rep = shape.num_heads / shape.num_kv_heads;
    let mut outs = Vec::with_capacity(spans.len());
    for ((span, query), cache) in spans.iter().zip(queries).zip(caches.iter()) {
        let SeqSpan { start, len } = *span;
        let rows = query.len;
        // Its query rows are the span's last: the first at position past + skip.
        let past = cache.len();
        let skip = len - rows;
        // [rows, heads, d] → [heads, rows, d] → [kv_heads, n_rep * rows, d].
        let q = (q
            .narrow(0, query.start, rows)?
            .transpose(0, 1)?
            .contiguous()?
            * f64::from(params.scale))?
        .reshape((shape.num_kv_heads, n_rep * rows, shape.head_dim))?;
        let k_new = k.narrow(0, start, len)?.transpose(0, 1)?.contiguous()?;
        let v_new = v.narrow(0, start, len)?.transpose(0, 1)?.contiguous()?;
        let (k_all, v_all) = cache.append_device(layer, &k_new, &v_new)?;
        let mut scores = q.matmul(&k_all.t()?)?;
        if let Some(cap) = params.softcap {
            scores = ((scores / f64::from(cap))?.tanh()? * f64::from(cap))?;
        }
        if let Some(mask) = mask(params, rows, past + skip, q.device())? {
            scores = scores.broadcast_add(&mask)?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs
            .matmul(&v_all)?
            .reshape((shape.num_heads, rows, shape.head_dim))?
            .transpose(0, 1)?
            .reshape((rows, shape.num_heads * shape.head_dim))?;
        outs.push(out);
    }
    Tensor::cat(&outs, 0)
}

/// Additive mask `[n_rep * len, past + len]` for `len` queries at positions `past..` and
/// the keys up to the last (rows grouped per KV head: n_rep query heads × len positions):
/// 0 where query `past + r` sees key `j`, -inf elsewhere. `None` when every query sees
/// every key.
fn mask(
    params: AttnParams,
    len: usize,
    past: usize,
    device: &candle_core::Device,
) -> Result<Option<Tensor>> {
    let n_rep = params.shape.num_heads / params.shape.num_kv_heads;
    let total = past + len;
    let window_cuts = params.window.is_some_and(|w| total > w);
    if len <= 1 && !window_cuts {
        return Ok(None);
    }
    let sees = |r: usize, j: usize| {
        let p = past + r;
        j <= p && params.window.is_none_or(|w| p - j < w)
    };
    let mut mask = Vec::with_capacity(n_rep * len * total);
    for _ in 0..n_rep {
        for r in 0..len {
            mask.extend((0..total).map(|j| if sees(r, j) { 0.0 } else { f32::NEG_INFINITY }));
        }
    }
    Ok(Some(Tensor::from_vec(mask, (n_rep * len, total), device)?))
}
