//! Gemma 2 and Gemma 3: sliding-window and global layers with their own rope, norms
//! around both sublayers, GeGLU with tanh GELU, embeddings scaled by sqrt(hidden), a
//! tied output; Gemma 3 adds per-head q/k norms, Gemma 2 logit softcaps.
//!
//! From llama.cpp's `src/models/gemma2.cpp`, `gemma3.cpp` (GGUF) and transformers'
//! `Gemma2Config` / `Gemma3TextConfig` (Hugging Face). The GGUF converter stores Gemma's
//! norm weights as `1 + w`; Hugging Face checkpoints store `w` (offset 1 at load).

use super::gguf_meta::{BoolsOrCount, GgufMeta};
use super::hf_config::HfConfig;
use super::llama::hf_dims;
use super::{base_spec, gguf_dims, gguf_layout, gguf_rope, Dims};
use crate::error::LoadError;
use crate::model::spec::{
    Activation, Architecture, HfNaming, LayerSpec, ModelSpec, RopeSpec, RopeStyle,
};

/// Every `pattern`-th layer is global, the others slide (llama.cpp's `set_swa_pattern`,
/// transformers' `sliding_window_pattern`); 0 makes every layer slide.
fn every_nth_global(pattern: usize, layers: usize) -> Vec<bool> {
    (0..layers)
        .map(|i| pattern == 0 || (i + 1) % pattern != 0)
        .collect()
}

fn default_pattern(arch: Architecture) -> usize {
    match arch {
        Architecture::Gemma2 => 2,
        _ => 6,
    }
}

/// Gemma's 27B models scale queries by hidden/heads instead of the head size (llama.cpp
/// recognises them by their layer count, as no GGUF key carries the scalar).
fn gguf_attention_scale(arch: Architecture, d: &Dims) -> f64 {
    let is_27b = matches!(
        (arch, d.layers),
        (Architecture::Gemma2, 46) | (Architecture::Gemma3, 62)
    );
    let scalar = if is_27b {
        d.hidden / d.heads
    } else {
        d.head_dim
    };
    1.0 / (scalar as f64).sqrt()
}

fn positive(v: Option<f64>) -> Option<f64> {
    v.filter(|&c| c != 0.0)
}

/// The parts every Gemma shares, given its sizes, ropes and which layers slide.
fn gemma_spec(
    mut spec: ModelSpec,
    local: RopeSpec,
    sliding: &[bool],
    window: Option<usize>,
) -> ModelSpec {
    spec.ropes.push(local);
    spec.layers = sliding
        .iter()
        .map(|&s| match window {
            Some(w) if s => LayerSpec {
                rope: 1,
                window: Some(w),
            },
            _ => LayerSpec {
                rope: 0,
                window: None,
            },
        })
        .collect();
    spec.embedding_scale = Some((spec.hidden_size as f32).sqrt());
    spec.qk_norm = spec.architecture == Architecture::Gemma3;
    spec.post_norms = true;
    spec.activation = Activation::GeluTanh;
    spec.hf_naming = HfNaming::Gemma;
    spec
}

pub(super) fn gguf(arch: Architecture, m: &GgufMeta) -> Result<ModelSpec, LoadError> {
    let d = gguf_dims(m)?;
    let eps = m.f64("attention.layer_norm_rms_epsilon")?;
    let rot = m.opt_usize("rope.dimension_count")?.unwrap_or(d.head_dim);
    for key in [
        "rope.dimension_count_swa",
        "attention.key_length_swa",
        "attention.value_length_swa",
    ] {
        let want = if key.starts_with("rope") {
            rot
        } else {
            d.head_dim
        };
        if let Some(v) = m.opt_usize(key)? {
            if v != want {
                return Err(m.error(
                    key,
                    format!(
                        "is {v}, not {want}; sliding layers of another shape are not implemented"
                    ),
                ));
            }
        }
    }
    let global = gguf_rope(m, RopeStyle::Half, rot)?;
    let swa_base = m.opt_f64("rope.freq_base_swa")?;
    let (window, local) = match arch {
        // Gemma 2 slides every other layer over 4096 tokens unless told otherwise, with
        // the global layers' rope.
        Architecture::Gemma2 => (
            Some(m.opt_usize("attention.sliding_window")?.unwrap_or(4096)),
            RopeSpec {
                base: swa_base.unwrap_or(global.base),
                ..global.clone()
            },
        ),
        // Gemma 3's sliding layers turn at base 10000, unscaled.
        _ => (
            m.opt_usize("attention.sliding_window")?,
            RopeSpec::plain(RopeStyle::Half, rot, swa_base.unwrap_or(10_000.0)),
        ),
    };
    let window = window.filter(|&w| w > 0);
    let sliding = match m.opt_bools_or_usize("attention.sliding_window_pattern")? {
        Some(BoolsOrCount::Bools(v)) if v.len() == d.layers => v,
        Some(BoolsOrCount::Bools(v)) => {
            return Err(m.error(
                "attention.sliding_window_pattern",
                format!("names {} layers of {}", v.len(), d.layers),
            ))
        }
        Some(BoolsOrCount::Count(n)) => every_nth_global(n, d.layers),
        None => every_nth_global(default_pattern(arch), d.layers),
    };
    let mut spec = base_spec(arch, &d, eps, global);
    spec.attention_scale = gguf_attention_scale(arch, &d);
    let final_cap = m.opt_f64("final_logit_softcapping")?;
    match arch {
        Architecture::Gemma2 => {
            spec.attention_softcap =
                positive(Some(m.opt_f64("attn_logit_softcapping")?.unwrap_or(50.0)));
            spec.final_softcap = positive(Some(final_cap.unwrap_or(30.0)));
        }
        _ => spec.final_softcap = positive(final_cap),
    }
    gguf_layout(m, &mut spec);
    Ok(gemma_spec(spec, local, &sliding, window))
}

/// `embedding_dtype_bits`: transformers multiplies the embeddings by sqrt(hidden) cast to
/// the weights' dtype (25.25 in bf16, 25.298 in f32): the scale is rounded to it.
pub(super) fn hf(
    arch: Architecture,
    c: &HfConfig,
    round_to_weights: &dyn Fn(f32) -> f32,
) -> Result<ModelSpec, LoadError> {
    c.check_activation(&["gelu_pytorch_tanh"])?;
    let d = hf_dims(c, 8192);
    let (global_default, local_default) = match arch {
        Architecture::Gemma2 => (10_000.0, 10_000.0),
        _ => (1_000_000.0, 10_000.0),
    };
    let hf_rope = |layer_type: &str, default: f64| -> Result<RopeSpec, LoadError> {
        let r = c.rope(layer_type, default)?;
        Ok(RopeSpec {
            linear_factor: r.linear_factor,
            freq_factors: r.freq_factors,
            ..RopeSpec::plain(RopeStyle::Half, d.head_dim, r.theta)
        })
    };
    let global = hf_rope("full_attention", global_default)?;
    let local = match arch {
        // Gemma 2 has one rope for all layers.
        Architecture::Gemma2 => global.clone(),
        _ => hf_rope("sliding_attention", local_default)?,
    };
    let sliding = match c.layer_types()? {
        Some(types) => types,
        None => every_nth_global(
            c.sliding_window_pattern.unwrap_or(default_pattern(arch)),
            d.layers,
        ),
    };
    let mut spec = base_spec(arch, &d, c.rms_norm_eps.unwrap_or(1e-6), global);
    spec.norm_weight_offset = 1.0;
    spec.tied_output = c.tie_word_embeddings.unwrap_or(true);
    spec.attention_scale = 1.0 / c.query_pre_attn_scalar.unwrap_or(d.head_dim as f64).sqrt();
    spec.attention_softcap = positive(c.attn_logit_softcapping);
    spec.final_softcap = positive(c.final_logit_softcapping);
    let window = c.sliding_window.filter(|&w| w > 0);
    if window.is_none() && sliding.iter().any(|&s| s) {
        return Err(c.error("sliding layers but no sliding_window"));
    }
    let mut spec = gemma_spec(spec, local, &sliding, window);
    spec.embedding_scale = spec.embedding_scale.map(round_to_weights);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::every_nth_global;

    #[test]
    fn every_sixth_layer_is_global() {
        let sliding = every_nth_global(6, 18);
        let global: Vec<usize> = (0..18).filter(|&i| !sliding[i]).collect();
        assert_eq!(global, vec![5, 11, 17]);
        assert!(every_nth_global(0, 4).iter().all(|&s| s));
        assert_eq!(every_nth_global(2, 4), vec![true, false, true, false]);
    }
}
