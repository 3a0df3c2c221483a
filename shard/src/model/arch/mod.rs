//! Per-architecture spec functions: a file's metadata (GGUF keys, or a Hugging Face
//! `config.json`) → [`ModelSpec`].
//!
//! Each function reads what its architecture defines, in the units llama.cpp (for GGUF)
//! and transformers (for `config.json`) give them meaning, and refuses what it does not
//! implement: an unknown rope scaling type, mixture-of-experts counts, and, for GGUF, any
//! key of the architecture's namespace that no function read (`GgufMeta::finish`).

mod gemma;
mod gguf_meta;
mod hf_config;
mod llama;
mod phi3;

use std::path::Path;

use candle_core::quantized::gguf_file;

use super::spec::{
    Activation, Architecture, HfNaming, LayerSpec, MlpLayout, ModelSpec, QkvLayout, RopeSpec,
};
use crate::error::LoadError;
use gguf_meta::GgufMeta;
use hf_config::HfConfig;

/// The spec of a GGUF file.
pub fn from_gguf(path: &Path, content: &gguf_file::Content) -> Result<ModelSpec, LoadError> {
    let file = path.display().to_string();
    let arch_name = match content.metadata.get("general.architecture") {
        Some(gguf_file::Value::String(s)) => s.as_str(),
        _ => {
            return Err(LoadError::Metadata {
                file,
                key: "general.architecture".into(),
                problem: "is missing or not a string".into(),
            })
        }
    };
    let architecture = Architecture::from_gguf_name(arch_name).ok_or_else(|| {
        LoadError::UnsupportedArchitecture {
            file: file.clone(),
            found: arch_name.to_string(),
        }
    })?;
    if let Some(n) = content.metadata.get("split.count") {
        if n.to_u16().map(|n| n > 1).unwrap_or(true) {
            return Err(LoadError::Metadata {
                file,
                key: "split.count".into(),
                problem: "this is one part of a split GGUF; merge the parts into one file \
                          (llama-gguf-split --merge) and serve that"
                    .into(),
            });
        }
    }
    let meta = GgufMeta::new(&file, arch_name, &content.metadata, &content.tensor_infos);
    let spec = match architecture {
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 | Architecture::Qwen3 => {
            llama::gguf(architecture, &meta)?
        }
        Architecture::Gemma2 | Architecture::Gemma3 => gemma::gguf(architecture, &meta)?,
        Architecture::Phi3 => phi3::gguf(&meta)?,
    };
    meta.finish()?;
    spec.validate()
        .map_err(|problem| LoadError::Spec { file, problem })?;
    Ok(spec)
}

/// What a Hugging Face checkpoint's tensors tell the spec functions.
pub struct HfFacts<'a> {
    /// Whether the checkpoint holds a tensor (fused projections).
    pub has_tensor: &'a dyn Fn(&str) -> bool,
    /// A value rounded to the dtype of the stored embedding (transformers computes
    /// Gemma's embedding scale in it).
    pub round_to_weights: &'a dyn Fn(f32) -> f32,
}

/// The spec of a Hugging Face folder's `config.json`.
pub fn from_hf(config_path: &Path, text: &str, facts: &HfFacts) -> Result<ModelSpec, LoadError> {
    let file = config_path.display().to_string();
    let config = HfConfig::parse(&file, text)?;
    let architecture = Architecture::from_hf_model_type(&config.model_type).ok_or_else(|| {
        LoadError::UnsupportedArchitecture {
            file: file.clone(),
            found: config.model_type.clone(),
        }
    })?;
    let spec = match architecture {
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 | Architecture::Qwen3 => {
            llama::hf(architecture, &config)?
        }
        Architecture::Gemma2 | Architecture::Gemma3 => {
            gemma::hf(architecture, &config, facts.round_to_weights)?
        }
        Architecture::Phi3 => phi3::hf(&config, facts)?,
    };
    spec.validate()
        .map_err(|problem| LoadError::Spec { file, problem })?;
    Ok(spec)
}

/// The sizes every architecture has, from GGUF keys.
struct Dims {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    context: usize,
}

fn gguf_dims(m: &GgufMeta) -> Result<Dims, LoadError> {
    let hidden = m.usize("embedding_length")?;
    let heads = m.usize("attention.head_count")?;
    if heads == 0 {
        return Err(m.error("attention.head_count", "is 0"));
    }
    let head_dim = m
        .opt_usize("attention.key_length")?
        .unwrap_or(hidden / heads);
    if let Some(v) = m.opt_usize("attention.value_length")? {
        if v != head_dim {
            return Err(m.error(
                "attention.value_length",
                format!("is {v} but keys have {head_dim}; Sonde needs equal key and value heads"),
            ));
        }
    }
    let vocab = m
        .tensor_rows("token_embd.weight")
        .ok_or_else(|| LoadError::MissingTensor {
            file: m.file().to_string(),
            tensor: "token_embd.weight".into(),
        })?;
    if let Some(v) = m.opt_usize("vocab_size")? {
        if v != vocab {
            return Err(m.error(
                "vocab_size",
                format!("is {v} but token_embd.weight has {vocab} rows"),
            ));
        }
    }
    let moe = "mixture-of-experts models are not implemented";
    m.expect_usize("expert_count", 0, moe)?;
    m.expect_usize("expert_used_count", 0, moe)?;
    if m.opt_bool("attention.causal")? == Some(false) {
        return Err(m.error("attention.causal", "is false; Sonde serves causal decoders"));
    }
    // Informational: the layout of the original checkpoint, and whether rope scaling was
    // fine-tuned; neither changes what the weights compute.
    m.accept(&["tensor_data_layout", "rope.scaling.finetuned"]);
    Ok(Dims {
        hidden,
        intermediate: m.usize("feed_forward_length")?,
        layers: m.usize("block_count")?,
        heads,
        kv_heads: m.opt_usize("attention.head_count_kv")?.unwrap_or(heads),
        head_dim,
        vocab,
        context: m.usize("context_length")?,
    })
}

/// The rope of the file's `rope.*` keys: base, linear scaling and `rope_freqs.weight`.
fn gguf_rope(
    m: &GgufMeta,
    style: super::spec::RopeStyle,
    dims: usize,
) -> Result<RopeSpec, LoadError> {
    let mut rope = RopeSpec::plain(
        style,
        dims,
        m.opt_f64("rope.freq_base")?.unwrap_or(10_000.0),
    );
    let factor = match m.opt_f64("rope.scaling.factor")? {
        Some(f) => Some(f),
        None => m.opt_f64("rope.scale_linear")?,
    };
    match m.opt_str("rope.scaling.type")? {
        None | Some("linear") => {
            if let Some(f) = factor.filter(|&f| f != 0.0) {
                rope.linear_factor = f;
            }
        }
        Some("none") => {}
        Some(other) => {
            return Err(m.error(
                "rope.scaling.type",
                format!(
                    "is {other:?}; Sonde implements none, linear and Llama 3 frequency factors"
                ),
            ))
        }
    }
    if let Some(f) = m.opt_f64("rope.scaling.attn_factor")? {
        if f != 1.0 {
            return Err(m.error(
                "rope.scaling.attn_factor",
                format!("is {f}; scaled rotary magnitudes are not implemented"),
            ));
        }
    }
    // Only YaRN and LongRoPE read the original context; both are refused above.
    m.accept(&["rope.scaling.original_context_length"]);
    if m.has_tensor("rope_freqs.weight") {
        rope.freq_factors = super::spec::FreqFactors::FromFile;
    }
    Ok(rope)
}

/// A spec with the Llama defaults, for the architecture functions to adjust.
fn base_spec(architecture: Architecture, d: &Dims, eps: f64, rope: RopeSpec) -> ModelSpec {
    ModelSpec {
        architecture,
        hidden_size: d.hidden,
        intermediate_size: d.intermediate,
        num_heads: d.heads,
        num_kv_heads: d.kv_heads,
        head_dim: d.head_dim,
        vocab_size: d.vocab,
        context_length: d.context,
        rms_norm_eps: eps,
        norm_weight_offset: 0.0,
        embedding_scale: None,
        qk_norm: false,
        post_norms: false,
        activation: Activation::Silu,
        qkv: QkvLayout::Separate,
        mlp: MlpLayout::Separate,
        attention_scale: 1.0 / (d.head_dim as f64).sqrt(),
        attention_softcap: None,
        final_softcap: None,
        tied_output: false,
        ropes: vec![rope],
        layers: vec![
            LayerSpec {
                rope: 0,
                window: None
            };
            d.layers
        ],
        hf_naming: HfNaming::Llama,
    }
}

/// What the file's tensors say about the layout: a fused q/k/v matrix, and whether the
/// output layer is the token embedding (no `output.weight`).
fn gguf_layout(m: &GgufMeta, spec: &mut ModelSpec) {
    if m.has_tensor("blk.0.attn_qkv.weight") {
        spec.qkv = QkvLayout::Fused;
    }
    spec.tied_output = !m.has_tensor("output.weight");
}
