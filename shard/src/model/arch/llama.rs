//! Llama and its close relatives: Mistral, Qwen2 (q/k/v biases, which the loader applies
//! whenever the file holds them), Qwen3 (per-head q/k RMS norms before rope).
//!
//! llama.cpp's converter permutes the q/k rows of Llama and Mistral GGUFs for its
//! interleaved rotary layout; Qwen GGUFs and every Hugging Face checkpoint keep
//! `rotate_half` pairs.

use super::gguf_meta::GgufMeta;
use super::hf_config::HfConfig;
use super::{base_spec, gguf_dims, gguf_layout, gguf_rope, Dims};
use crate::error::LoadError;
use crate::model::spec::{Architecture, ModelSpec, RopeSpec, RopeStyle};

pub(super) fn gguf(arch: Architecture, m: &GgufMeta) -> Result<ModelSpec, LoadError> {
    let d = gguf_dims(m)?;
    let eps = m.f64("attention.layer_norm_rms_epsilon")?;
    let rot = m.opt_usize("rope.dimension_count")?.unwrap_or(d.head_dim);
    let style = match arch {
        Architecture::Llama | Architecture::Mistral => RopeStyle::Interleaved,
        _ => RopeStyle::Half,
    };
    if style == RopeStyle::Interleaved && rot != d.head_dim {
        // As llama.cpp: Llama rotates whole heads.
        return Err(m.error(
            "rope.dimension_count",
            format!(
                "is {rot}, but Llama rotates the whole head of {}",
                d.head_dim
            ),
        ));
    }
    let rope = gguf_rope(m, style, rot)?;
    let mut spec = base_spec(arch, &d, eps, rope);
    spec.qk_norm = arch == Architecture::Qwen3;
    gguf_layout(m, &mut spec);
    Ok(spec)
}

pub(super) fn hf(arch: Architecture, c: &HfConfig) -> Result<ModelSpec, LoadError> {
    c.check_activation(&["silu"])?;
    let d = hf_dims(c, 4096);
    let r = c.rope("full_attention", 10_000.0)?;
    let rope = RopeSpec {
        linear_factor: r.linear_factor,
        freq_factors: r.freq_factors,
        ..RopeSpec::plain(RopeStyle::Half, d.head_dim, r.theta)
    };
    let mut spec = base_spec(arch, &d, c.rms_norm_eps.unwrap_or(1e-6), rope);
    spec.qk_norm = arch == Architecture::Qwen3;
    spec.tied_output = c.tie_word_embeddings.unwrap_or(false);
    let sliding = match c.layer_types()? {
        Some(types) => types,
        None => match arch {
            // Mistral: every layer, whenever a window is set.
            Architecture::Mistral => vec![c.sliding_window.is_some(); d.layers],
            // Qwen: only with use_sliding_window, and only from max_window_layers on
            // (transformers' Qwen2Config / Qwen3Config).
            Architecture::Qwen2 | Architecture::Qwen3 => {
                let on = c.use_sliding_window.unwrap_or(false) && c.sliding_window.is_some();
                let from = c.max_window_layers.unwrap_or(28);
                (0..d.layers).map(|i| on && i >= from).collect()
            }
            _ => vec![false; d.layers],
        },
    };
    for (layer, sliding) in spec.layers.iter_mut().zip(sliding) {
        if sliding {
            layer.window = Some(
                c.sliding_window
                    .ok_or_else(|| c.error("sliding layers but no sliding_window"))?,
            );
        }
    }
    Ok(spec)
}

/// The sizes of a `config.json`.
pub(super) fn hf_dims(c: &HfConfig, default_context: usize) -> Dims {
    Dims {
        hidden: c.hidden_size,
        intermediate: c.intermediate_size,
        layers: c.num_hidden_layers,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
        head_dim: c.head_dim(),
        vocab: c.vocab_size,
        context: c.max_position_embeddings.unwrap_or(default_context),
    }
}
