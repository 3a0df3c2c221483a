//! The fields of a Hugging Face `config.json` that the spec functions read, and its rope
//! parameters in both of transformers' spellings: `rope_theta` + `rope_scaling` (and
//! Gemma 3's `rope_local_base_freq`), or `rope_parameters` (one dict, or one per layer
//! type: `full_attention`, `sliding_attention`).

use serde::Deserialize;
use serde_json::Value;

use crate::error::LoadError;
use crate::model::spec::FreqFactors;

#[derive(Debug, Deserialize)]
pub struct HfConfig {
    #[serde(skip)]
    pub file: String,
    pub model_type: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    pub rms_norm_eps: Option<f64>,
    pub max_position_embeddings: Option<usize>,
    pub rope_theta: Option<f64>,
    pub rope_local_base_freq: Option<f64>,
    pub rope_scaling: Option<Value>,
    pub rope_parameters: Option<Value>,
    pub partial_rotary_factor: Option<f64>,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    pub sliding_window_pattern: Option<usize>,
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub hidden_act: Option<String>,
    pub hidden_activation: Option<String>,
    pub tie_word_embeddings: Option<bool>,
    pub num_local_experts: Option<usize>,
    pub num_experts: Option<usize>,
}

/// One rope's parameters as the config gives them.
pub struct HfRope {
    pub theta: f64,
    pub linear_factor: f64,
    pub freq_factors: FreqFactors,
}

impl HfConfig {
    pub fn parse(file: &str, text: &str) -> Result<Self, LoadError> {
        let mut config: HfConfig = serde_json::from_str(text).map_err(|e| LoadError::Config {
            file: file.to_string(),
            problem: format!("is not a config this forward pass can read: {e}"),
        })?;
        config.file = file.to_string();
        if config.num_local_experts.or(config.num_experts).unwrap_or(0) > 0 {
            return Err(config.error("mixture-of-experts models are not implemented"));
        }
        Ok(config)
    }

    pub fn error(&self, problem: impl Into<String>) -> LoadError {
        LoadError::Config {
            file: self.file.clone(),
            problem: problem.into(),
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// `hidden_act` (or Gemma's `hidden_activation`), which must be `expected`.
    pub fn check_activation(&self, expected: &[&str]) -> Result<(), LoadError> {
        let act = self.hidden_activation.as_ref().or(self.hidden_act.as_ref());
        match act {
            Some(a) if !expected.contains(&a.as_str()) => Err(self.error(format!(
                "hidden_act {a:?} is not what this architecture's forward pass computes \
                 ({})",
                expected.join(" or ")
            ))),
            _ => Ok(()),
        }
    }

    /// The rope of layers of `layer_type` (`full_attention` / `sliding_attention`), with
    /// `default_theta` when the config names none.
    pub fn rope(&self, layer_type: &str, default_theta: f64) -> Result<HfRope, LoadError> {
        let params = match &self.rope_parameters {
            Some(Value::Object(map)) => match map.get(layer_type) {
                Some(Value::Object(per_type)) => Some(per_type.clone()),
                _ if map.contains_key("full_attention")
                    || map.contains_key("sliding_attention") =>
                {
                    return Err(self.error(format!("rope_parameters has no {layer_type:?} entry")))
                }
                _ => Some(map.clone()),
            },
            Some(Value::Null) | None => None,
            Some(other) => return Err(self.error(format!("rope_parameters is {other}"))),
        };
        let (theta, scaling) = match params {
            Some(p) => (
                p.get("rope_theta").and_then(Value::as_f64),
                Some(Value::Object(p)),
            ),
            None => {
                let theta = match layer_type {
                    "sliding_attention" => self.rope_local_base_freq.or(self.rope_theta),
                    _ => self.rope_theta,
                };
                // Gemma 3's `rope_scaling` applies to its global layers only.
                let scaling = match layer_type {
                    "sliding_attention" if self.rope_local_base_freq.is_some() => None,
                    _ => self.rope_scaling.clone(),
                };
                (theta, scaling)
            }
        };
        let mut rope = HfRope {
            theta: theta.unwrap_or(default_theta),
            linear_factor: 1.0,
            freq_factors: FreqFactors::None,
        };
        let Some(Value::Object(s)) = scaling else {
            return Ok(rope);
        };
        let kind = s
            .get("rope_type")
            .or_else(|| s.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let num = |key: &str| -> Result<f64, LoadError> {
            s.get(key)
                .and_then(Value::as_f64)
                .ok_or_else(|| self.error(format!("rope scaling {kind:?} lacks a numeric {key:?}")))
        };
        match kind {
            "default" => {}
            "linear" => rope.linear_factor = num("factor")?,
            "llama3" => {
                rope.freq_factors = FreqFactors::Llama3 {
                    factor: num("factor")?,
                    low_freq_factor: num("low_freq_factor")?,
                    high_freq_factor: num("high_freq_factor")?,
                    original_context: num("original_max_position_embeddings")?,
                }
            }
            other => {
                return Err(self.error(format!(
                    "rope scaling type {other:?} is not implemented (Sonde implements \
                     default, linear and llama3)"
                )))
            }
        }
        Ok(rope)
    }

    /// `partial_rotary_factor`, at the top level or inside `rope_parameters`.
    pub fn partial_rotary_factor(&self) -> Option<f64> {
        self.partial_rotary_factor.or_else(|| {
            self.rope_parameters
                .as_ref()
                .and_then(|p| p.get("partial_rotary_factor"))
                .and_then(Value::as_f64)
        })
    }

    /// `layer_types` when given, checked to name every layer and only known kinds.
    pub fn layer_types(&self) -> Result<Option<Vec<bool>>, LoadError> {
        let Some(types) = &self.layer_types else {
            return Ok(None);
        };
        if types.len() != self.num_hidden_layers {
            return Err(self.error(format!(
                "layer_types names {} layers of {}",
                types.len(),
                self.num_hidden_layers
            )));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(self.error(format!("layer type {other:?} is not implemented"))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}
