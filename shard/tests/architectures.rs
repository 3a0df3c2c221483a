//! Hugging Face checkpoints of the Llama family through the spec-driven pass: Mistral and
//! Qwen2 relabellings of the default model's weights (Qwen2 with zero q/k/v biases, which
//! add exactly nothing) give bit-identical scores; Llama 3 rope scaling is applied;
//! configurations and tensors the pass does not apply are refused, naming them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use common::*;
use serde_json::Value;
use sonde_proto::WeightQuant;
use sonde_shard::error::{LoadError, Unapplied};
use sonde_shard::loader::{self, LoadOptions};

/// A copy of the f32 Hugging Face folder with `config.json` edited by `edit` and
/// `extra` tensors added.
fn variant(name: &str, edit: impl FnOnce(&mut Value), extra: HashMap<String, Tensor>) -> PathBuf {
    let src = hf_f32_path();
    let dir = std::env::temp_dir().join(format!("sonde-arch-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    tensors.extend(extra);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    dir
}

fn scores(path: &Path) -> Outcome {
    let ids: Vec<u32> = (0..24).map(|i| 300 + i * 97).collect();
    let mut engine = engine(path, 1024);
    run_one(
        &mut engine,
        Req::new(1, &ids, 6).ignore_eos().scores(|s| {
            s.prefill_logprobs = true;
            s.top_n_tokens = 3;
        }),
    )
}

fn assert_identical(a: &Outcome, b: &Outcome) {
    assert_eq!(a.ids(), b.ids());
    for (x, y) in a
        .prefill
        .iter()
        .chain(&a.tokens)
        .zip(b.prefill.iter().chain(&b.tokens))
    {
        assert_eq!(x, y);
    }
}

#[test]
fn mistral_and_qwen2_configs_run_the_same_pass() {
    let llama = scores(&hf_f32_path());

    let mistral = variant(
        "mistral",
        |c| {
            c["model_type"] = "mistral".into();
            c["architectures"] = serde_json::json!(["MistralForCausalLM"]);
            c["sliding_window"] = Value::Null;
        },
        HashMap::new(),
    );
    assert_identical(&llama, &scores(&mistral));

    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(hf_f32_path().join("config.json")).unwrap())
            .unwrap();
    let layers = cfg["num_hidden_layers"].as_u64().unwrap() as usize;
    let hidden = cfg["hidden_size"].as_u64().unwrap() as usize;
    let kv = cfg["num_key_value_heads"].as_u64().unwrap() as usize
        * (hidden / cfg["num_attention_heads"].as_u64().unwrap() as usize);
    let mut biases = HashMap::new();
    for i in 0..layers {
        for (p, n) in [("q", hidden), ("k", kv), ("v", kv)] {
            biases.insert(
                format!("model.layers.{i}.self_attn.{p}_proj.bias"),
                Tensor::zeros(n, candle_core::DType::F32, &Device::Cpu).unwrap(),
            );
        }
    }
    let qwen2 = variant(
        "qwen2",
        |c| {
            c["model_type"] = "qwen2".into();
            c["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
            c["use_sliding_window"] = false.into();
        },
        biases,
    );
    assert_identical(&llama, &scores(&qwen2));
    for dir in [mistral, qwen2] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn unservable_configs_are_refused_with_the_reason() {
    let load = |path: &Path| loader::load(path, &LoadOptions::cpu(WeightQuant::default()));
    let cases = [
        (
            "yarn",
            serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
            "rope scaling type \"yarn\" is not implemented",
        ),
        (
            "llama3-incomplete",
            serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            "lacks a numeric \"low_freq_factor\"",
        ),
    ];
    for (name, scaling, want) in cases {
        let dir = variant(name, |c| c["rope_scaling"] = scaling, HashMap::new());
        let err = load(&dir).err().unwrap();
        assert!(matches!(err, LoadError::Config { .. }), "{err}");
        assert!(err.to_string().contains(want), "{err}");
        assert!(err.to_string().contains("config.json"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    let other = variant("gpt2", |c| c["model_type"] = "gpt2".into(), HashMap::new());
    let err = load(&other).err().unwrap();
    assert!(
        err.to_string()
            .contains("architecture \"gpt2\" is not supported"),
        "{err}"
    );
    let act = variant("gelu", |c| c["hidden_act"] = "gelu".into(), HashMap::new());
    let err = load(&act).err().unwrap();
    assert!(err.to_string().contains("hidden_act \"gelu\""), "{err}");
    let extra = variant(
        "extra",
        |_| {},
        HashMap::from([(
            "model.layers.0.self_attn.sinks".to_string(),
            Tensor::zeros(9, candle_core::DType::F32, &Device::Cpu).unwrap(),
        )]),
    );
    let err = load(&extra).err().unwrap();
    assert!(
        matches!(&err, LoadError::NotApplied { what: Unapplied::Tensor(tensor), .. } if tensor == "model.layers.0.self_attn.sinks"),
        "{err}"
    );
    for dir in [other, act, extra] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// Llama 3's `rope_scaling` in a config.json turns the rotary frequencies as the formula
/// says: the scores move away from the unscaled model's (every position > 0 changes).
#[test]
fn llama3_rope_scaling_changes_the_scores() {
    let plain = scores(&hf_f32_path());
    let scaled = variant(
        "llama3",
        |c| {
            c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64});
        },
        HashMap::new(),
    );
    let got = scores(&scaled);
    std::fs::remove_dir_all(&scaled).unwrap();
    // Position 0 has no rotation (and no logprob); every later one differs.
    for (a, b) in plain.prefill.iter().zip(&got.prefill).skip(2) {
        assert_ne!(a.logprob, b.logprob);
    }
}

/// Gemma 3's GGUF metadata read into the spec the forward pass runs (the facts of
/// ../shared/ARCHITECTURES.md, checked against llama.cpp's gemma3.cpp).
#[test]
fn gemma3_gguf_spec() {
    use candle_core::quantized::gguf_file;
    use sonde_shard::model::spec::{Activation, Architecture, RopeStyle};

    let path = gemma3_path();
    let mut f = std::fs::File::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-data)", path.display()));
    let content = gguf_file::Content::read(&mut f).unwrap();
    let spec = sonde_shard::model::arch::from_gguf(&path, &content).unwrap();
    assert_eq!(spec.architecture, Architecture::Gemma3);
    assert_eq!(
        (spec.hidden_size, spec.intermediate_size, spec.num_layers()),
        (640, 2048, 18)
    );
    assert_eq!(
        (spec.num_heads, spec.num_kv_heads, spec.head_dim),
        (4, 1, 256)
    );
    assert_eq!(spec.vocab_size, 262_144);
    assert_eq!(spec.attention_scale, 1.0 / 16.0);
    assert_eq!(spec.embedding_scale, Some(640f32.sqrt()));
    assert!(spec.qk_norm && spec.post_norms && spec.tied_output);
    assert_eq!(spec.activation, Activation::GeluTanh);
    assert_eq!((spec.attention_softcap, spec.final_softcap), (None, None));
    assert_eq!(spec.norm_weight_offset, 0.0);
    for (i, layer) in spec.layers.iter().enumerate() {
        let global = (i + 1) % 6 == 0;
        assert_eq!(
            layer.window,
            if global { None } else { Some(512) },
            "layer {i}"
        );
        let rope = &spec.ropes[layer.rope];
        assert_eq!(rope.base, if global { 1e6 } else { 1e4 }, "layer {i}");
        assert_eq!(
            (rope.style, rope.dims, rope.linear_factor),
            (RopeStyle::Half, 256, 1.0)
        );
    }
}
