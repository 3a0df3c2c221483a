//! Where the tensors come from: a GGUF file (quantized blocks) or Hugging Face
//! safetensors, by their key in the file.
//!
//! Every tensor handed out is checked against the shape the forward pass expects and
//! recorded as used, so that after loading, a tensor of the file that nothing applied is
//! a load error (`first_unused`) rather than a silently different model.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use sonde_proto::WeightQuant;

use crate::error::{candle_message, LoadError};

/// A projection matrix as stored: quantized blocks, or a dense tensor of the file's dtype.
pub enum Weight {
    /// Boxed: a CUDA build's `QTensor` holds its device (over 200 bytes), a `Tensor` is a
    /// pointer.
    Quantized(Box<QTensor>),
    Dense(Tensor),
}

enum Kind {
    Gguf {
        content: gguf_file::Content,
        reader: BufReader<File>,
    },
    Safetensors {
        /// On the CPU, in the files' dtypes; moved to the device as they are taken.
        tensors: HashMap<String, Tensor>,
        /// The dtype of the matrices, for `Info`.
        stored: DType,
    },
}

pub struct WeightSource {
    file: String,
    kind: Kind,
    policy: WeightQuant,
    used: HashSet<String>,
    /// Block formats of the matrices served, in load order, for the `dtype` of `Info`.
    formats: Vec<String>,
}

impl WeightSource {
    pub fn open_gguf(path: &Path, policy: WeightQuant) -> Result<Self, LoadError> {
        let file = path.display().to_string();
        let io_err = |source| LoadError::Io {
            path: file.clone(),
            source,
        };
        let handle = File::open(path).map_err(io_err)?;
        let len = handle.metadata().map_err(io_err)?.len();
        let mut reader = BufReader::new(handle);
        let content = gguf_file::Content::read(&mut reader).map_err(|e| LoadError::Corrupt {
            file: file.clone(),
            problem: format!("is not a readable GGUF file ({})", candle_message(&e)),
        })?;
        // A file cut short fails here, in a second, not after minutes of loading.
        for (name, info) in &content.tensor_infos {
            let bytes = info.shape.elem_count() / info.ggml_dtype.block_size()
                * info.ggml_dtype.type_size();
            let end = content.tensor_data_offset + info.offset + bytes as u64;
            if end > len {
                return Err(LoadError::Corrupt {
                    file,
                    problem: format!(
                        "tensor {name} ends at byte {end} but the file has {len}: truncated?"
                    ),
                });
            }
        }
        Ok(WeightSource {
            file,
            kind: Kind::Gguf { content, reader },
            policy,
            used: HashSet::new(),
            formats: Vec::new(),
        })
    }

    /// Reads every `*.safetensors` of `dir`.
    pub fn open_safetensors(dir: &Path) -> Result<Self, LoadError> {
        let file = dir.display().to_string();
        let io_err = |source| LoadError::Io {
            path: file.clone(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(LoadError::UnknownFormat(file));
        }
        let mut tensors = HashMap::new();
        let mut stored = DType::F32;
        for f in files {
            let loaded = candle_core::safetensors::load(&f, &Device::Cpu).map_err(|e| {
                LoadError::Corrupt {
                    file: f.display().to_string(),
                    problem: format!(
                        "is not a readable safetensors file ({})",
                        candle_message(&e)
                    ),
                }
            })?;
            for (name, t) in loaded {
                if t.rank() == 2 {
                    stored = t.dtype();
                }
                tensors.insert(name, t);
            }
        }
        Ok(WeightSource {
            file,
            kind: Kind::Safetensors { tensors, stored },
            policy: WeightQuant::Keep,
            used: HashSet::new(),
            formats: Vec::new(),
        })
    }

    pub fn file(&self) -> &str {
        &self.file
    }

    pub fn gguf_content(&self) -> Option<&gguf_file::Content> {
        match &self.kind {
            Kind::Gguf { content, .. } => Some(content),
            Kind::Safetensors { .. } => None,
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        match &self.kind {
            Kind::Gguf { content, .. } => content.tensor_infos.contains_key(key),
            Kind::Safetensors { tensors, .. } => tensors.contains_key(key),
        }
    }

    /// The stored dtype of a safetensors tensor (None for GGUF or a missing key).
    pub fn dense_dtype(&self, key: &str) -> Option<DType> {
        match &self.kind {
            Kind::Safetensors { tensors, .. } => tensors.get(key).map(Tensor::dtype),
            Kind::Gguf { .. } => None,
        }
    }

    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        match &self.kind {
            Kind::Gguf { content, .. } => content
                .tensor_infos
                .get(key)
                .map(|t| t.shape.dims().to_vec()),
            Kind::Safetensors { tensors, .. } => tensors.get(key).map(|t| t.dims().to_vec()),
        }
    }

    /// Checks that `key` exists with shape `expected` and records it as used.
    fn take(&mut self, key: &str, expected: &[usize]) -> Result<(), LoadError> {
        let found = self.shape(key).ok_or_else(|| LoadError::MissingTensor {
            file: self.file.clone(),
            tensor: key.to_string(),
        })?;
        if found != expected {
            return Err(LoadError::TensorShape {
                file: self.file.clone(),
                tensor: key.to_string(),
                expected: expected.to_vec(),
                found,
            });
        }
        self.used.insert(key.to_string());
        Ok(())
    }

    /// A projection matrix `[rows (outputs), cols (inputs)]` as stored: GGUF blocks read
    /// onto `device`, dense tensors on the CPU (the caller picks the kernel).
    pub fn matrix(
        &mut self,
        key: &str,
        [rows, cols]: [usize; 2],
        device: &Device,
    ) -> Result<Weight, LoadError> {
        self.take(key, &[rows, cols])?;
        let weight = match &mut self.kind {
            Kind::Gguf { content, reader } => {
                let mut t = read_gguf(&self.file, (content, reader), key, device)?;
                let stored = t.dtype();
                let requantize = self.policy == WeightQuant::Q8_0
                    && matches!(
                        stored,
                        GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1
                    );
                let label = if requantize {
                    t = QTensor::quantize(&t.dequantize(device)?, GgmlDType::Q8_0)?;
                    format!("q8_0 (requantized from {})", ggml_type_name(stored))
                } else {
                    ggml_type_name(stored)
                };
                if !self.formats.contains(&label) {
                    self.formats.push(label);
                }
                Weight::Quantized(Box::new(t))
            }
            Kind::Safetensors { tensors, .. } => match tensors.get(key) {
                Some(t) => Weight::Dense(t.clone()),
                None => unreachable_missing(&self.file, key)?,
            },
        };
        Ok(weight)
    }

    /// A norm weight or bias of `len` values, as f32 on `device`.
    pub fn vector(&mut self, key: &str, len: usize, device: &Device) -> Result<Tensor, LoadError> {
        self.take(key, &[len])?;
        let t = match &mut self.kind {
            Kind::Gguf { content, reader } => {
                read_gguf(&self.file, (content, reader), key, &Device::Cpu)?
                    .dequantize(&Device::Cpu)?
            }
            Kind::Safetensors { tensors, .. } => match tensors.get(key) {
                Some(t) => t.clone(),
                None => unreachable_missing(&self.file, key)?,
            },
        };
        Ok(t.to_dtype(DType::F32)?.to_device(device)?)
    }

    /// Like [`WeightSource::vector`], or `None` when the file has no such tensor.
    pub fn opt_vector(
        &mut self,
        key: &str,
        len: usize,
        device: &Device,
    ) -> Result<Option<Tensor>, LoadError> {
        if self.contains(key) {
            self.vector(key, len, device).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Records a tensor as applied without reading it (a tied copy checked elsewhere).
    pub fn mark_used(&mut self, key: &str) {
        self.used.insert(key.to_string());
    }

    /// The first tensor of the file (in name order) that nothing took.
    pub fn first_unused(&self) -> Option<String> {
        let mut names: Vec<&String> = match &self.kind {
            Kind::Gguf { content, .. } => content.tensor_infos.keys().collect(),
            Kind::Safetensors { tensors, .. } => tensors.keys().collect(),
        };
        names.sort();
        names.into_iter().find(|n| !self.used.contains(*n)).cloned()
    }

    /// How the weights are stored as served, e.g. "q5_0, q8_0, q4k, q6k".
    pub fn dtype_label(&self) -> String {
        match &self.kind {
            Kind::Gguf { .. } => self.formats.join(", "),
            Kind::Safetensors { stored, .. } => format!("{stored:?}").to_lowercase(),
        }
    }

    pub fn format_name(&self) -> &'static str {
        match self.kind {
            Kind::Gguf { .. } => "gguf",
            Kind::Safetensors { .. } => "safetensors",
        }
    }
}

/// A GGUF block format as llama.cpp and the GGUF spec spell it (`q4_k`, not candle's
/// `Q4K`), for `/info` and load errors.
pub fn ggml_type_name(dtype: GgmlDType) -> String {
    let name = format!("{dtype:?}").to_lowercase();
    match name.strip_suffix('k') {
        Some(stem) if stem.starts_with('q') => format!("{stem}_k"),
        _ => name,
    }
}

/// Tensor `key` of the GGUF file `file` (its parsed header and an open reader).
fn read_gguf(
    file: &str,
    (content, reader): (&gguf_file::Content, &mut BufReader<File>),
    key: &str,
    device: &Device,
) -> Result<QTensor, LoadError> {
    content
        .tensor(reader, key, device)
        .map_err(|e| LoadError::Corrupt {
            file: file.to_string(),
            problem: format!("tensor {key} cannot be read ({})", candle_message(&e)),
        })
}

/// `take` checked the key; this keeps the lookup total without a panic.
fn unreachable_missing<T>(file: &str, key: &str) -> Result<T, LoadError> {
    Err(LoadError::MissingTensor {
        file: file.to_string(),
        tensor: key.to_string(),
    })
}
