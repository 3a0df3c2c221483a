//! What a decoder-only transformer computes, as data.
//!
//! The architectures people serve differ in a handful of switches: where the norms sit,
//! q/k norms, fused projections, the activation, the rotary embedding of each layer, a
//! sliding window per layer, an embedding scale, logit softcaps, a tied output layer. A
//! per-architecture function (`arch`) reads a file's metadata into a [`ModelSpec`]; the
//! forward pass (`decoder`) reads only the spec. Adding an architecture is a new spec
//! function and its reference test, not a copy of the model.

/// The architectures Sonde's forward pass implements (GGUF `general.architecture`, or the
/// `model_type` of a Hugging Face `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
}

impl Architecture {
    pub const ALL: [Architecture; 7] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma2,
        Architecture::Gemma3,
        Architecture::Phi3,
    ];

    /// The GGUF name, which is also how `Info` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
        }
    }

    pub fn from_gguf_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// A `config.json` `model_type`; Gemma 3's text-only checkpoints say `gemma3_text`.
    pub fn from_hf_model_type(name: &str) -> Option<Self> {
        match name {
            "gemma3_text" | "gemma3" => Some(Architecture::Gemma3),
            other => Self::from_gguf_name(other),
        }
    }

    /// The list for error messages.
    pub fn supported() -> String {
        Self::ALL.map(Architecture::name).join(", ")
    }
}

/// How rotary embedding pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (x\[2i\], x\[2i+1\]): llama.cpp's layout for Llama GGUFs, whose converter
    /// permutes the rows of the q/k weights.
    Interleaved,
    /// Pairs (x\[i\], x\[i+d/2\]) over the rotated dimensions: Hugging Face's
    /// `rotate_half`, and the GGUFs llama.cpp runs in "neox" style.
    Half,
}

/// Per-pair divisors of the rotary frequencies.
#[derive(Debug, Clone, PartialEq)]
pub enum FreqFactors {
    None,
    /// Read at load from the file's `rope_freqs.weight` (Llama 3.1/3.2 GGUFs): pair i
    /// turns at `base^(-2i/d) / ff[i]`.
    FromFile,
    /// Llama 3's `rope_scaling` (`rope_type: llama3`) of a Hugging Face config, computed
    /// as transformers' `_compute_llama3_parameters` (and llama.cpp's converter) do.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_context: f64,
    },
    /// Resolved divisors, one per rotated pair.
    Values(Vec<f64>),
}

/// One rotary embedding: pair `i` of the `dims` rotated dimensions turns by
/// `position / linear_factor * base^(-2i/dims) / divisor[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub style: RopeStyle,
    /// Rotated dimensions per head (even, at most the head size); the others pass
    /// through unchanged (partial rotary, Phi-3 style).
    pub dims: usize,
    pub base: f64,
    /// Linear position scaling (`rope.scaling.type = linear`): positions are divided by it.
    pub linear_factor: f64,
    pub freq_factors: FreqFactors,
}

impl RopeSpec {
    pub fn plain(style: RopeStyle, dims: usize, base: f64) -> Self {
        RopeSpec {
            style,
            dims,
            base,
            linear_factor: 1.0,
            freq_factors: FreqFactors::None,
        }
    }

    /// The angle per position of each rotated pair, in f64 (`dims / 2` values).
    /// `FromFile` must have been resolved into `Values` first.
    pub fn inv_freq(&self) -> Result<Vec<f64>, String> {
        let half = self.dims / 2;
        let plain: Vec<f64> = (0..half)
            .map(|i| self.base.powf(-2.0 * i as f64 / self.dims as f64))
            .collect();
        let divisors: Vec<f64> = match &self.freq_factors {
            FreqFactors::None => vec![1.0; half],
            FreqFactors::FromFile => {
                return Err("rope frequency factors were not read from the file".into())
            }
            FreqFactors::Values(v) if v.len() == half => v.clone(),
            FreqFactors::Values(v) => {
                return Err(format!(
                    "{} rope frequency factors for {half} rotated pairs",
                    v.len()
                ))
            }
            FreqFactors::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => plain
                .iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let high_wavelen = original_context / high_freq_factor;
                    let low_wavelen = original_context / low_freq_factor;
                    if wavelen < high_wavelen {
                        1.0
                    } else if wavelen > low_wavelen {
                        *factor
                    } else {
                        let smooth = (original_context / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        1.0 / ((1.0 - smooth) / factor + smooth)
                    }
                })
                .collect(),
        };
        Ok(plain
            .iter()
            .zip(&divisors)
            .map(|(f, d)| f / d / self.linear_factor)
            .collect())
    }
}

/// The gated MLP's non-linearity: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU with the tanh approximation (GeGLU; Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

/// Whether q, k and v come from one matrix (rows \[q | k | v\]) or three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvLayout {
    Separate,
    Fused,
}

/// Whether gate and up come from one matrix (rows \[gate | up\], Phi-3) or two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpLayout {
    Separate,
    Fused,
}

/// What differs between layers: which rotary embedding, and the attention window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    /// Index into [`ModelSpec::ropes`].
    pub rope: usize,
    /// A query at position p sees keys at p - window < j <= p; `None`: all of the past.
    pub window: Option<usize>,
}

/// How the tensor names of a Hugging Face checkpoint read (GGUF names are the same for
/// every architecture).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfNaming {
    /// `post_attention_layernorm` is the norm before the MLP.
    Llama,
    /// Gemma 2/3: `post_attention_layernorm` follows attention, `pre_feedforward_layernorm`
    /// and `post_feedforward_layernorm` wrap the MLP.
    Gemma,
}

/// Everything the forward pass does, decided at load.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// The longest sequence the model was trained for (positions 0..context_length).
    pub context_length: usize,
    pub rms_norm_eps: f64,
    /// Added to every norm weight at load: Hugging Face's Gemma stores `w` and applies
    /// `1 + w`; its GGUFs store `1 + w` already (offset 0).
    pub norm_weight_offset: f32,
    /// Embeddings are multiplied by this (Gemma: sqrt(hidden_size)).
    pub embedding_scale: Option<f32>,
    /// Per-head RMS norms of q and k after projection, before rope (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMS norms of the attention and MLP outputs before each residual add (Gemma 2/3).
    pub post_norms: bool,
    pub activation: Activation,
    pub qkv: QkvLayout,
    pub mlp: MlpLayout,
    /// Scores are `q·k * attention_scale` (usually 1/sqrt(head_dim)).
    pub attention_scale: f64,
    /// Attention scores become `cap * tanh(score / cap)` (Gemma 2).
    pub attention_softcap: Option<f64>,
    /// Output logits become `cap * tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f64>,
    /// The output layer is the token embedding.
    pub tied_output: bool,
    pub ropes: Vec<RopeSpec>,
    pub layers: Vec<LayerSpec>,
    pub hf_naming: HfNaming,
}

impl ModelSpec {
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Checks the relations the forward pass relies on; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("hidden size", self.hidden_size),
            ("feed-forward size", self.intermediate_size),
            ("head count", self.num_heads),
            ("KV head count", self.num_kv_heads),
            ("head size", self.head_dim),
            ("vocabulary size", self.vocab_size),
            ("context length", self.context_length),
            ("layer count", self.layers.len()),
        ];
        for (what, v) in positive {
            if v == 0 {
                return Err(format!("the {what} is 0"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "{} attention heads are not a multiple of {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        for rope in &self.ropes {
            if rope.dims == 0 || !rope.dims.is_multiple_of(2) || rope.dims > self.head_dim {
                return Err(format!(
                    "{} rotary dimensions for heads of {}",
                    rope.dims, self.head_dim
                ));
            }
            if !(rope.base > 0.0 && rope.base.is_finite()) {
                return Err(format!("rope base {} is not a positive number", rope.base));
            }
            if !(rope.linear_factor > 0.0 && rope.linear_factor.is_finite()) {
                return Err(format!(
                    "rope scaling factor {} is not a positive number",
                    rope.linear_factor
                ));
            }
        }
        for (i, layer) in self.layers.iter().enumerate() {
            if layer.rope >= self.ropes.len() {
                return Err(format!(
                    "layer {i} names rope {} of {}",
                    layer.rope,
                    self.ropes.len()
                ));
            }
            if layer.window == Some(0) {
                return Err(format!("layer {i} has a sliding window of 0"));
            }
        }
        if !(self.rms_norm_eps >= 0.0 && self.rms_norm_eps.is_finite()) {
            return Err(format!(
                "RMS norm epsilon {} is not valid",
                self.rms_norm_eps
            ));
        }
        for (what, cap) in [
            ("attention", self.attention_softcap),
            ("final", self.final_softcap),
        ] {
            if cap.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
                return Err(format!(
                    "{what} logit softcap {cap:?} is not a positive number"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_factors_follow_the_published_formula() {
        // Llama 3.1 8B: base 500000, head 128, factor 8, low 1, high 4, original 8192.
        let rope = RopeSpec {
            freq_factors: FreqFactors::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_context: 8192.0,
            },
            ..RopeSpec::plain(RopeStyle::Half, 128, 500_000.0)
        };
        let plain = RopeSpec::plain(RopeStyle::Half, 128, 500_000.0)
            .inv_freq()
            .unwrap();
        let scaled = rope.inv_freq().unwrap();
        // High frequencies (short wavelengths) unchanged, the lowest divided by 8.
        assert_eq!(scaled[0], plain[0]);
        assert!((scaled[63] - plain[63] / 8.0).abs() <= 1e-18);
        // In between, strictly between the two.
        let mid = (0..64)
            .find(|&i| scaled[i] != plain[i] && scaled[i] != plain[i] / 8.0)
            .unwrap();
        assert!(scaled[mid] < plain[mid] && scaled[mid] > plain[mid] / 8.0);
    }

    #[test]
    fn linear_scaling_divides_positions() {
        let rope = RopeSpec {
            linear_factor: 4.0,
            ..RopeSpec::plain(RopeStyle::Interleaved, 8, 10_000.0)
        };
        let plain = RopeSpec::plain(RopeStyle::Interleaved, 8, 10_000.0)
            .inv_freq()
            .unwrap();
        for (a, b) in rope.inv_freq().unwrap().iter().zip(&plain) {
            assert_eq!(*a, b / 4.0);
        }
    }

    #[test]
    fn unresolved_file_factors_are_an_error() {
        let rope = RopeSpec {
            freq_factors: FreqFactors::FromFile,
            ..RopeSpec::plain(RopeStyle::Interleaved, 8, 10_000.0)
        };
        assert!(rope.inv_freq().is_err());
    }
}
