//! Turns a model path (a `.gguf` file or a Hugging Face folder) into a ready [`Model`]
//! and the facts the router asks for.

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device};
use sonde_tokenizer::ModelTokenizer;

use crate::error::LoadError;
use crate::model::arch::{self, HfFacts};
use sonde_proto::WeightQuant;

use crate::model::{AttentionKernel, Model, Placement, WeightSource};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    pub quant_policy: WeightQuant,
    /// The attention kernel; `None`: the host kernel on the CPU, candle's ops elsewhere.
    pub attention: Option<AttentionKernel>,
    /// Memory the CPU kernel may give to wide copies of Q4/Q5 matrices (see
    /// [`Placement::wide_quants_bytes`]).
    pub wide_quants_bytes: usize,
}

/// The default of `--wide-quants-mib`.
pub const DEFAULT_WIDE_QUANTS_MIB: usize = 1024;

impl LoadOptions {
    pub fn cpu(quant_policy: WeightQuant) -> Self {
        LoadOptions {
            device: Device::Cpu,
            quant_policy,
            attention: None,
            wide_quants_bytes: DEFAULT_WIDE_QUANTS_MIB << 20,
        }
    }
}

/// What `Info` reports about the loaded model.
#[derive(Debug, Clone)]
pub struct ModelFacts {
    pub model_id: String,
    pub architecture: String,
    pub weights_format: String,
    pub dtype: String,
    pub device: String,
    pub vocab_size: usize,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub max_context: usize,
}

pub struct LoadedModel {
    pub model: Model,
    pub facts: ModelFacts,
}

pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    let started = Instant::now();
    let is_gguf = path.is_file() && path.extension().is_some_and(|e| e == "gguf");
    let (spec, mut src, tokenizer) = if is_gguf {
        let src = WeightSource::open_gguf(path, opts.quant_policy)?;
        let spec = match src.gguf_content() {
            Some(content) => arch::from_gguf(path, content)?,
            None => return Err(LoadError::UnknownFormat(path.display().to_string())),
        };
        (spec, src, ModelTokenizer::from_gguf_file(path)?)
    } else if path.join("config.json").is_file() {
        let config_path = path.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|source| LoadError::Io {
            path: config_path.display().to_string(),
            source,
        })?;
        let src = WeightSource::open_safetensors(path)?;
        let embedding_dtype = src.dense_dtype("model.embed_tokens.weight");
        let facts = HfFacts {
            has_tensor: &|name| src.contains(name),
            round_to_weights: &|v| round_to(v, embedding_dtype),
        };
        let spec = arch::from_hf(&config_path, &text, &facts)?;
        (spec, src, ModelTokenizer::from_hf_dir(path)?)
    } else {
        return Err(LoadError::UnknownFormat(path.display().to_string()));
    };
    let placement = Placement {
        device: opts.device.clone(),
        attention: opts.attention,
        wide_quants_bytes: opts.wide_quants_bytes,
    };
    let model = Model::load(spec, &mut src, &placement)?;
    let cfg = model.spec();
    let special = tokenizer.special_tokens();
    let facts = ModelFacts {
        model_id: path.display().to_string(),
        architecture: cfg.architecture.name().to_string(),
        weights_format: src.format_name().to_string(),
        dtype: src.dtype_label(),
        device: device_name(&opts.device),
        vocab_size: cfg.vocab_size,
        eos_token_ids: special.eos.clone(),
        bos_token_id: special.bos,
        max_context: cfg.context_length,
    };
    tracing::info!(
        model = %facts.model_id,
        architecture = %facts.architecture,
        dtype = %facts.dtype,
        seconds = started.elapsed().as_secs_f64(),
        "model loaded"
    );
    Ok(LoadedModel { model, facts })
}

/// `v` as the nearest value of `dtype` (f16, bf16), back in f32.
fn round_to(v: f32, dtype: Option<DType>) -> f32 {
    match dtype {
        Some(DType::BF16) => half::bf16::from_f32(v).to_f32(),
        Some(DType::F16) => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn device_name(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => "cuda".into(),
        Device::Metal(_) => "metal".into(),
    }
}
