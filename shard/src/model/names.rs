//! Tensor names: one enum for what the forward pass applies, spelled per file format.
//!
//! GGUF names (llama.cpp's `LLM_TENSOR_*`) are the same for every architecture; Hugging
//! Face names depend on the family (`HfNaming`): Llama's `post_attention_layernorm` is the
//! norm before the MLP, Gemma's the norm after attention.

use super::spec::HfNaming;

/// A tensor of the checkpoint, independent of the file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorName {
    TokenEmbd,
    OutputNorm,
    Output,
    /// Llama 3.1's per-pair rope frequency divisors (GGUF only).
    RopeFreqs,
    Layer(usize, LayerTensor),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerTensor {
    AttnNorm,
    Q,
    K,
    V,
    /// Rows \[q | k | v\].
    Qkv,
    O,
    QNorm,
    KNorm,
    PostAttnNorm,
    FfnNorm,
    Gate,
    Up,
    /// Rows \[gate | up\].
    GateUp,
    Down,
    PostFfnNorm,
}

/// Which part of a tensor: the weight, or its bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Weight,
    Bias,
}

/// How the tensors of one checkpoint are named.
#[derive(Debug, Clone, Copy)]
pub enum Naming {
    Gguf,
    Hf(HfNaming),
}

impl Naming {
    pub fn is_gguf(self) -> bool {
        matches!(self, Naming::Gguf)
    }

    /// The key of `t`'s `part` in the file; `None` for tensors this format never has.
    pub fn key(self, t: TensorName, part: Part) -> Option<String> {
        let suffix = match part {
            Part::Weight => "weight",
            Part::Bias => "bias",
        };
        let stem = match self {
            Naming::Gguf => gguf_stem(t),
            Naming::Hf(family) => hf_stem(t, family)?,
        };
        Some(format!("{stem}.{suffix}"))
    }
}

fn gguf_stem(t: TensorName) -> String {
    use LayerTensor::*;
    match t {
        TensorName::TokenEmbd => "token_embd".into(),
        TensorName::OutputNorm => "output_norm".into(),
        TensorName::Output => "output".into(),
        TensorName::RopeFreqs => "rope_freqs".into(),
        TensorName::Layer(i, t) => {
            let s = match t {
                AttnNorm => "attn_norm",
                Q => "attn_q",
                K => "attn_k",
                V => "attn_v",
                Qkv => "attn_qkv",
                O => "attn_output",
                QNorm => "attn_q_norm",
                KNorm => "attn_k_norm",
                PostAttnNorm => "post_attention_norm",
                FfnNorm => "ffn_norm",
                Gate => "ffn_gate",
                // Phi-3's fused [gate | up] matrix keeps the name of the up projection.
                Up | GateUp => "ffn_up",
                Down => "ffn_down",
                PostFfnNorm => "post_ffw_norm",
            };
            format!("blk.{i}.{s}")
        }
    }
}

fn hf_stem(t: TensorName, family: HfNaming) -> Option<String> {
    use LayerTensor::*;
    Some(match t {
        TensorName::TokenEmbd => "model.embed_tokens".into(),
        TensorName::OutputNorm => "model.norm".into(),
        TensorName::Output => "lm_head".into(),
        TensorName::RopeFreqs => return None,
        TensorName::Layer(i, t) => {
            let s = match (t, family) {
                (AttnNorm, _) => "input_layernorm",
                (Q, _) => "self_attn.q_proj",
                (K, _) => "self_attn.k_proj",
                (V, _) => "self_attn.v_proj",
                (Qkv, _) => "self_attn.qkv_proj",
                (O, _) => "self_attn.o_proj",
                (QNorm, _) => "self_attn.q_norm",
                (KNorm, _) => "self_attn.k_norm",
                (PostAttnNorm, _) => "post_attention_layernorm",
                (FfnNorm, HfNaming::Llama) => "post_attention_layernorm",
                (FfnNorm, HfNaming::Gemma) => "pre_feedforward_layernorm",
                (Gate, _) => "mlp.gate_proj",
                (Up, _) => "mlp.up_proj",
                (GateUp, _) => "mlp.gate_up_proj",
                (Down, _) => "mlp.down_proj",
                (PostFfnNorm, _) => "post_feedforward_layernorm",
            };
            format!("model.layers.{i}.{s}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_each_format() {
        let gguf = Naming::Gguf;
        let ffn = TensorName::Layer(3, LayerTensor::FfnNorm);
        assert_eq!(
            gguf.key(ffn, Part::Weight).unwrap(),
            "blk.3.ffn_norm.weight"
        );
        assert_eq!(
            Naming::Hf(HfNaming::Llama).key(ffn, Part::Weight).unwrap(),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(
            Naming::Hf(HfNaming::Gemma).key(ffn, Part::Weight).unwrap(),
            "model.layers.3.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            gguf.key(TensorName::Layer(0, LayerTensor::Q), Part::Bias)
                .unwrap(),
            "blk.0.attn_q.bias"
        );
        assert_eq!(
            gguf.key(TensorName::Layer(1, LayerTensor::GateUp), Part::Weight)
                .unwrap(),
            "blk.1.ffn_up.weight"
        );
        assert!(Naming::Hf(HfNaming::Llama)
            .key(TensorName::RopeFreqs, Part::Weight)
            .is_none());
    }
}
