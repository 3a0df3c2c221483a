//! Phi-3 / 3.5 / 4 (dense): fused q/k/v (`attn_qkv`, rows \[q | k | v\]) and gate/up
//! (`ffn_up`, rows \[gate | up\]) projections, `rotate_half` rope over the first
//! `rope.dimension_count` dimensions of each head (partial rotary), and a sliding window
//! on every layer when the config sets one.
//!
//! The window follows transformers' Phi-3, which applies it; llama.cpp currently ignores
//! Phi's window, so the two differ only for sequences longer than the window. LongRoPE
//! checkpoints (`rope_factors_long/short`, a rotary attention factor) are refused.

use super::gguf_meta::GgufMeta;
use super::hf_config::HfConfig;
use super::llama::hf_dims;
use super::{base_spec, gguf_dims, gguf_layout, gguf_rope, HfFacts};
use crate::error::LoadError;
use crate::model::spec::{Architecture, MlpLayout, ModelSpec, QkvLayout, RopeSpec, RopeStyle};

fn windowed(mut spec: ModelSpec, window: Option<usize>) -> ModelSpec {
    if let Some(w) = window.filter(|&w| w > 0) {
        for layer in &mut spec.layers {
            layer.window = Some(w);
        }
    }
    spec.mlp = MlpLayout::Fused;
    spec
}

pub(super) fn gguf(m: &GgufMeta) -> Result<ModelSpec, LoadError> {
    for tensor in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if m.has_tensor(tensor) {
            return Err(LoadError::Unsupported {
                file: m.file().to_string(),
                what: format!("{tensor} (LongRoPE frequency factors) is not implemented"),
            });
        }
    }
    let d = gguf_dims(m)?;
    let eps = m.f64("attention.layer_norm_rms_epsilon")?;
    let rot = m.opt_usize("rope.dimension_count")?.unwrap_or(d.head_dim);
    let rope = gguf_rope(m, RopeStyle::Half, rot)?;
    let mut spec = base_spec(Architecture::Phi3, &d, eps, rope);
    gguf_layout(m, &mut spec);
    Ok(windowed(spec, m.opt_usize("attention.sliding_window")?))
}

pub(super) fn hf(c: &HfConfig, facts: &HfFacts) -> Result<ModelSpec, LoadError> {
    c.check_activation(&["silu"])?;
    let d = hf_dims(c, 4096);
    let r = c.rope("full_attention", 10_000.0)?;
    // transformers: int(head_dim * partial_rotary_factor).
    let rot = (d.head_dim as f64 * c.partial_rotary_factor().unwrap_or(1.0)) as usize;
    let rope = RopeSpec {
        linear_factor: r.linear_factor,
        freq_factors: r.freq_factors,
        ..RopeSpec::plain(RopeStyle::Half, rot, r.theta)
    };
    let mut spec = base_spec(Architecture::Phi3, &d, c.rms_norm_eps.unwrap_or(1e-5), rope);
    spec.tied_output = c.tie_word_embeddings.unwrap_or(false);
    if (facts.has_tensor)("model.layers.0.self_attn.qkv_proj.weight") {
        spec.qkv = QkvLayout::Fused;
    }
    Ok(windowed(spec, c.sliding_window))
}
