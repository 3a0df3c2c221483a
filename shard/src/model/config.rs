//! The model's shape, read from GGUF metadata or a Hugging Face `config.json`.

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use crate::error::LoadError;

/// The Llama-family architectures the forward pass implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    /// Llama with biases on the q/k/v projections.
    Qwen2,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Architecture::Llama),
            "mistral" => Some(Architecture::Mistral),
            "qwen2" => Some(Architecture::Qwen2),
            _ => None,
        }
    }
}

/// How rotary embedding pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (x\[2i\], x\[2i+1\]): llama.cpp's layout for Llama GGUFs, whose converter
    /// permutes the rows of the q/k weights.
    Interleaved,
    /// Pairs (x\[i\], x\[i+d/2\]): Hugging Face's `rotate_half`, and GGUFs of models that
    /// llama.cpp runs in "neox" style (Qwen2).
    Half,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_style: RopeStyle,
    pub max_position_embeddings: usize,
    /// The model has biases on q/k/v (Qwen2).
    pub qkv_bias: bool,
}

impl ModelConfig {
    /// Reads `{arch}.*` keys of a GGUF file. `vocab_size` is taken from the token
    /// embedding's rows, which is what the output layer will produce.
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, LoadError> {
        let md = &content.metadata;
        let arch_name = md
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .ok_or_else(|| LoadError::Config("GGUF has no general.architecture".into()))?;
        let architecture = Architecture::from_name(arch_name)
            .ok_or_else(|| LoadError::UnsupportedArchitecture(arch_name.clone()))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let get_u32 = |k: &str| -> Result<usize, LoadError> {
            md.get(&key(k))
                .and_then(|v| v.to_u32().ok())
                .map(|v| v as usize)
                .ok_or_else(|| LoadError::Config(format!("GGUF metadata lacks {}", key(k))))
        };
        let get_f32 = |k: &str| md.get(&key(k)).and_then(|v| v.to_f32().ok());
        let hidden_size = get_u32("embedding_length")?;
        let num_heads = get_u32("attention.head_count")?;
        let num_kv_heads = get_u32("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = get_u32("attention.key_length").unwrap_or(hidden_size / num_heads);
        let vocab_size = content
            .tensor_infos
            .get("token_embd.weight")
            .map(|t| t.shape.dims()[0])
            .ok_or_else(|| LoadError::Config("GGUF has no token_embd.weight".into()))?;
        Ok(ModelConfig {
            architecture,
            hidden_size,
            intermediate_size: get_u32("feed_forward_length")?,
            num_layers: get_u32("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: get_f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f64,
            rope_theta: get_f32("rope.freq_base").unwrap_or(10_000.0) as f64,
            rope_style: match architecture {
                Architecture::Qwen2 => RopeStyle::Half,
                Architecture::Llama | Architecture::Mistral => RopeStyle::Interleaved,
            },
            max_position_embeddings: get_u32("context_length").unwrap_or(4096),
            qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
        })
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self, LoadError> {
        let hf: HfConfig = serde_json::from_str(text)
            .map_err(|e| LoadError::Config(format!("config.json: {e}")))?;
        let architecture = Architecture::from_name(&hf.model_type)
            .ok_or_else(|| LoadError::UnsupportedArchitecture(hf.model_type.clone()))?;
        if let Some(scaling) = hf.rope_scaling.filter(|s| !s.is_empty()) {
            // Llama 3.1-style scaling changes the frequencies; serving such a model with
            // plain rope would give wrong scores, so refuse it plainly.
            return Err(LoadError::Config(format!(
                "config.json: rope_scaling {scaling:?} is not supported"
            )));
        }
        let num_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
        let mut max_position_embeddings = hf.max_position_embeddings;
        if let Some(window) = hf.sliding_window.filter(|_| hf.use_sliding_window) {
            // Attention here is always full; beyond the window the model was not trained.
            max_position_embeddings = max_position_embeddings.min(window);
        }
        Ok(ModelConfig {
            architecture,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads,
            head_dim: hf
                .head_dim
                .unwrap_or(hf.hidden_size / hf.num_attention_heads),
            vocab_size: hf.vocab_size,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta: hf.rope_theta,
            rope_style: RopeStyle::Half,
            max_position_embeddings,
            qkv_bias: architecture == Architecture::Qwen2,
        })
    }
}

/// The fields of `config.json` the forward pass needs.
#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    rope_theta: f64,
    #[serde(default = "default_context")]
    max_position_embeddings: usize,
    rope_scaling: Option<HashMap<String, serde_json::Value>>,
    sliding_window: Option<usize>,
    /// Qwen2 names it; Mistral uses the window whenever it is set.
    #[serde(default = "default_true")]
    use_sliding_window: bool,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_context() -> usize {
    4096
}
fn default_true() -> bool {
    true
}
