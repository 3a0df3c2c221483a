//! Turns a model path (a `.gguf` file or a Hugging Face folder) into a ready [`Model`]
//! and the facts the router asks for.

use std::path::Path;
use std::time::Instant;

use candle_core::Device;
use sonde_tokenizer::ModelTokenizer;

use crate::error::LoadError;
use crate::model::{Model, ModelConfig, QuantPolicy, WeightSource};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    pub quant_policy: QuantPolicy,
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
    let (cfg, mut src, tokenizer) = if is_gguf {
        let src = WeightSource::open_gguf(path, opts.quant_policy)?;
        let cfg = match src.gguf_content() {
            Some(content) => ModelConfig::from_gguf(content)?,
            None => return Err(LoadError::UnknownFormat(path.display().to_string())),
        };
        (cfg, src, ModelTokenizer::from_gguf_file(path)?)
    } else if path.join("config.json").is_file() {
        let config_path = path.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|source| LoadError::Io {
            path: config_path.display().to_string(),
            source,
        })?;
        let cfg = ModelConfig::from_hf_json(&text)?;
        let src = WeightSource::open_safetensors(path, &opts.device)?;
        (cfg, src, ModelTokenizer::from_hf_dir(path)?)
    } else {
        return Err(LoadError::UnknownFormat(path.display().to_string()));
    };
    let model = Model::load(cfg, &mut src, &opts.device)?;
    let cfg = model.config();
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
        max_context: cfg.max_position_embeddings,
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

fn device_name(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => "cuda".into(),
        Device::Metal(_) => "metal".into(),
    }
}
