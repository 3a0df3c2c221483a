//! Mistral and Qwen2 checkpoints go through the same forward pass as Llama: the default
//! model's weights, relabelled (and, for Qwen2, given zero q/k/v biases, which add exactly
//! nothing), must give bit-identical scores; configurations the pass cannot serve exactly
//! are refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use common::*;
use serde_json::Value;
use sonde_shard::error::LoadError;
use sonde_shard::loader::{self, LoadOptions};
use sonde_shard::model::QuantPolicy;

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
    let load = |path: &Path| {
        loader::load(
            path,
            &LoadOptions {
                device: Device::Cpu,
                quant_policy: QuantPolicy::default(),
            },
        )
    };
    let scaled = variant(
        "scaled",
        |c| c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
        HashMap::new(),
    );
    let err = load(&scaled).err().unwrap();
    assert!(matches!(err, LoadError::Config(_)), "{err}");
    assert!(err.to_string().contains("rope_scaling"), "{err}");

    let other = variant("gpt2", |c| c["model_type"] = "gpt2".into(), HashMap::new());
    let err = load(&other).err().unwrap();
    assert!(
        err.to_string().contains("\"gpt2\" is not supported"),
        "{err}"
    );
    for dir in [scaled, other] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}
