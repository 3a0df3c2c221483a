//! Where the tensors come from: a GGUF file (quantized) or Hugging Face safetensors.
//!
//! Both sources hand the model the same things — a [`QMatMul`] per projection (quantized
//! blocks, or a dense f32 matrix) and f32 vectors for norms and biases — so the forward
//! pass has one code path for both formats.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::error::LoadError;

/// A tensor of the checkpoint, named independently of the file format.
#[derive(Debug, Clone, Copy)]
pub enum Name {
    Embedding,
    OutputNorm,
    Output,
    Layer(usize, LayerTensor),
}

#[derive(Debug, Clone, Copy)]
pub enum LayerTensor {
    AttnNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    O,
    FfnNorm,
    Gate,
    Up,
    Down,
}

impl Name {
    fn gguf(self) -> String {
        use LayerTensor::*;
        match self {
            Name::Embedding => "token_embd.weight".into(),
            Name::OutputNorm => "output_norm.weight".into(),
            Name::Output => "output.weight".into(),
            Name::Layer(i, t) => {
                let suffix = match t {
                    AttnNorm => "attn_norm.weight",
                    Q => "attn_q.weight",
                    K => "attn_k.weight",
                    V => "attn_v.weight",
                    QBias => "attn_q.bias",
                    KBias => "attn_k.bias",
                    VBias => "attn_v.bias",
                    O => "attn_output.weight",
                    FfnNorm => "ffn_norm.weight",
                    Gate => "ffn_gate.weight",
                    Up => "ffn_up.weight",
                    Down => "ffn_down.weight",
                };
                format!("blk.{i}.{suffix}")
            }
        }
    }

    fn hf(self) -> String {
        use LayerTensor::*;
        match self {
            Name::Embedding => "model.embed_tokens.weight".into(),
            Name::OutputNorm => "model.norm.weight".into(),
            Name::Output => "lm_head.weight".into(),
            Name::Layer(i, t) => {
                let suffix = match t {
                    AttnNorm => "input_layernorm.weight",
                    Q => "self_attn.q_proj.weight",
                    K => "self_attn.k_proj.weight",
                    V => "self_attn.v_proj.weight",
                    QBias => "self_attn.q_proj.bias",
                    KBias => "self_attn.k_proj.bias",
                    VBias => "self_attn.v_proj.bias",
                    O => "self_attn.o_proj.weight",
                    FfnNorm => "post_attention_layernorm.weight",
                    Gate => "mlp.gate_proj.weight",
                    Up => "mlp.up_proj.weight",
                    Down => "mlp.down_proj.weight",
                };
                format!("model.layers.{i}.{suffix}")
            }
        }
    }
}

/// What to do at load with GGUF block formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantPolicy {
    /// Serve the blocks exactly as stored: Sonde's CPU kernels multiply Q4_0, Q4_1 and
    /// Q8_0 by f32 activations, so scores are those of the file's weights.
    #[default]
    Keep,
    /// Q4_0/Q4_1/Q5_0/Q5_1 matrices become Q8_0 (for devices whose kernels favour it).
    /// An 8-bit grid per 32 values is finer than a 4-bit one, but the weights change.
    RequantizeQ8_0,
}

/// An open GGUF file and the tensors read from it so far.
pub struct GgufSource {
    path: PathBuf,
    content: gguf_file::Content,
    reader: BufReader<File>,
    policy: QuantPolicy,
    /// The quantized tensors already read, so tied weights share one copy.
    loaded: HashMap<String, Arc<QTensor>>,
    /// Block formats seen, for the `dtype` the shard reports.
    formats: Vec<String>,
}

pub enum WeightSource {
    Gguf(Box<GgufSource>),
    Safetensors {
        tensors: HashMap<String, Tensor>,
        /// Storage dtype in the files (computation is f32).
        stored: DType,
    },
}

impl WeightSource {
    pub fn open_gguf(path: &Path, policy: QuantPolicy) -> Result<Self, LoadError> {
        let io_err = |source| LoadError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut reader = BufReader::new(File::open(path).map_err(io_err)?);
        let content = gguf_file::Content::read(&mut reader)?;
        Ok(WeightSource::Gguf(Box::new(GgufSource {
            path: path.to_path_buf(),
            content,
            reader,
            policy,
            loaded: HashMap::new(),
            formats: Vec::new(),
        })))
    }

    /// Loads every `*.safetensors` of `dir` as f32 on `device`.
    pub fn open_safetensors(dir: &Path, device: &Device) -> Result<Self, LoadError> {
        let io_err = |source| LoadError::Io {
            path: dir.display().to_string(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(LoadError::UnknownFormat(dir.display().to_string()));
        }
        let mut tensors = HashMap::new();
        let mut stored = DType::F32;
        for file in files {
            for (name, t) in candle_core::safetensors::load(&file, device)? {
                stored = t.dtype();
                tensors.insert(name, t.to_dtype(DType::F32)?);
            }
        }
        Ok(WeightSource::Safetensors { tensors, stored })
    }

    pub fn gguf_content(&self) -> Option<&gguf_file::Content> {
        match self {
            WeightSource::Gguf(g) => Some(&g.content),
            WeightSource::Safetensors { .. } => None,
        }
    }

    pub fn contains(&self, name: Name) -> bool {
        match self {
            WeightSource::Gguf(g) => g.content.tensor_infos.contains_key(&name.gguf()),
            WeightSource::Safetensors { tensors, .. } => tensors.contains_key(&name.hf()),
        }
    }

    /// A projection matrix, \[out, in\], ready to multiply activations.
    pub fn matrix(&mut self, name: Name, device: &Device) -> Result<QMatMul, LoadError> {
        match self {
            WeightSource::Gguf(g) => Ok(QMatMul::from_arc(g.qtensor(name, device)?)?),
            WeightSource::Safetensors { tensors, .. } => {
                let t = tensors
                    .get(&name.hf())
                    .ok_or_else(|| LoadError::MissingTensor(name.hf()))?;
                Ok(QMatMul::Tensor(t.clone()))
            }
        }
    }

    /// A norm weight or bias, as f32.
    pub fn vector(&mut self, name: Name, device: &Device) -> Result<Tensor, LoadError> {
        match self {
            WeightSource::Gguf(g) => Ok(g
                .qtensor(name, device)?
                .dequantize(device)?
                .to_dtype(DType::F32)?),
            WeightSource::Safetensors { tensors, .. } => tensors
                .get(&name.hf())
                .cloned()
                .ok_or_else(|| LoadError::MissingTensor(name.hf())),
        }
    }

    /// How the weights are stored as served, e.g. "q8_0 (requantized from q4_1), q8_0".
    pub fn dtype_label(&self) -> String {
        match self {
            WeightSource::Gguf(g) => g.formats.join(", "),
            WeightSource::Safetensors { stored, .. } if *stored == DType::F32 => "f32".into(),
            WeightSource::Safetensors { stored, .. } => {
                format!("f32 (converted from {stored:?})").to_lowercase()
            }
        }
    }

    pub fn format_name(&self) -> &'static str {
        match self {
            WeightSource::Gguf(_) => "gguf",
            WeightSource::Safetensors { .. } => "safetensors",
        }
    }
}

impl GgufSource {
    fn qtensor(&mut self, name: Name, device: &Device) -> Result<Arc<QTensor>, LoadError> {
        let key = name.gguf();
        if let Some(t) = self.loaded.get(&key) {
            return Ok(t.clone());
        }
        if !self.content.tensor_infos.contains_key(&key) {
            return Err(LoadError::MissingTensor(format!(
                "{key} in {}",
                self.path.display()
            )));
        }
        let mut t = self.content.tensor(&mut self.reader, &key, device)?;
        let stored = t.dtype();
        let slow = matches!(
            stored,
            GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1
        );
        let label = if slow && self.policy == QuantPolicy::RequantizeQ8_0 {
            t = QTensor::quantize(&t.dequantize(device)?, GgmlDType::Q8_0)?;
            format!("q8_0 (requantized from {stored:?})").to_lowercase()
        } else {
            format!("{stored:?}").to_lowercase()
        };
        if t.rank() == 2 && !self.formats.contains(&label) {
            self.formats.push(label);
        }
        let t = Arc::new(t);
        self.loaded.insert(key, t.clone());
        Ok(t)
    }
}
