//! The shard's scores against an independent float64 numpy forward pass
//! (`scripts/reference_forward.py`, weights dequantized by the `gguf` package): the default
//! model as GGUF and as an f32 safetensors folder, Gemma 3 (mixed K-quant blocks, sliding and
//! global layers), and the test models of `scripts/make_test_models.py` (Llama 3.1 rope
//! frequencies, linear rope scaling, qwen2 biases, qwen3 q/k norms, phi3 fused projections and
//! partial rotary, Gemma 3 with a 32-token window, Gemma 2's softcaps). `scripts/test` writes every reference.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;
use sonde_proto::WeightQuant;
use sonde_shard::engine::types::TokenScore;

struct RefPrompt {
    ids: Vec<u32>,
    /// logprob\[p\] of ids\[p\]; None at p = 0.
    logprob: Vec<Option<f64>>,
    /// labels\[p\]\[j\]: the distribution after ids\[..=p\] at label_ids\[j\].
    labels: Vec<Vec<f64>>,
    top: Vec<Vec<(u32, f64)>>,
    greedy: Vec<u32>,
    greedy_logprobs: Vec<f64>,
    greedy_margin: Vec<f64>,
}

struct Reference {
    label_ids: Vec<u32>,
    prompts: Vec<RefPrompt>,
}

/// The default model's reference.
fn reference() -> Reference {
    reference_at(&sonde_testdata::path("reference/forward.json"))
}

fn reference_at(path: &Path) -> Reference {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/test)", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    let u32s = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let f64s = |v: &Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let prompts = v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| RefPrompt {
            ids: u32s(&p["ids"]),
            logprob: p["logprob"]
                .as_array()
                .unwrap()
                .iter()
                .map(Value::as_f64)
                .collect(),
            labels: p["labels"].as_array().unwrap().iter().map(f64s).collect(),
            top: p["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    row.as_array()
                        .unwrap()
                        .iter()
                        .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap()))
                        .collect()
                })
                .collect(),
            greedy: u32s(&p["greedy"]),
            greedy_logprobs: f64s(&p["greedy_logprobs"]),
            greedy_margin: f64s(&p["greedy_margin"]),
        })
        .collect();
    Reference {
        label_ids: u32s(&v["label_ids"]),
        prompts,
    }
}

/// |Δ| statistics over every scored number of every prompt.
#[derive(Default)]
struct Deltas {
    max: f64,
    sum: f64,
    n: usize,
}

impl Deltas {
    fn add(&mut self, a: f64, b: f64) {
        let d = (a - b).abs();
        assert!(d.is_finite(), "non-finite difference between {a} and {b}");
        self.max = self.max.max(d);
        self.sum += d;
        self.n += 1;
    }
    fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }
}

/// Scores every prompt position (prompt logprobs and labels) and the first generated
/// token, and compares them with the reference.
fn compare_prompt_scores(path: &Path) -> (Deltas, Deltas, usize) {
    compare_prompt_scores_with(path, &reference(), WeightQuant::default())
}

fn compare_prompt_scores_with(
    path: &Path,
    r: &Reference,
    policy: WeightQuant,
) -> (Deltas, Deltas, usize) {
    let mut engine = engine_with(path, 4096, policy);
    let mut prompt = Deltas::default();
    let mut labels = Deltas::default();
    let mut positions = 0;
    for (i, p) in r.prompts.iter().enumerate() {
        let req = Req::new(i as u64, &p.ids, 1).ignore_eos().scores(|s| {
            s.prefill_logprobs = true;
            s.logprob_token_ids = r.label_ids.clone();
        });
        let out = run_one(&mut engine, req);
        assert_eq!(out.prefill.len(), p.ids.len());
        assert_eq!(out.prefill[0].logprob, None);
        for (pos, got) in out.prefill.iter().enumerate() {
            assert_eq!(got.id, p.ids[pos]);
            if let Some(want) = p.logprob[pos] {
                prompt.add(got.logprob.unwrap() as f64, want);
                positions += 1;
            }
            // Labels at position pos describe the distribution after ids[..pos].
            if pos > 0 {
                for (g, w) in got.label_logprobs.iter().zip(&p.labels[pos - 1]) {
                    labels.add(*g as f64, *w);
                }
            }
        }
        // The first generated token comes from the distribution after the whole prompt.
        let first = &out.tokens[0];
        for (g, w) in first.label_logprobs.iter().zip(p.labels.last().unwrap()) {
            labels.add(*g as f64, *w);
        }
    }
    (prompt, labels, positions)
}

#[test]
fn f32_safetensors_matches_float64_reference_within_1e_3() {
    let (prompt, labels, positions) = compare_prompt_scores(&hf_f32_path());
    eprintln!(
        "f32 safetensors vs f64 reference over {positions} prompt positions: \
         prompt logprobs max |Δ| {:.2e} mean {:.2e}; label logprobs max {:.2e} mean {:.2e}",
        prompt.max,
        prompt.mean(),
        labels.max,
        labels.mean()
    );
    assert!(positions >= 200, "only {positions} scored positions");
    assert!(prompt.max <= 1e-3, "prompt logprob max |Δ| {}", prompt.max);
    // Labels include very unlikely tokens (logprob ≈ -30), whose f32 error is larger
    // in absolute terms but still tiny relative to their size.
    assert!(labels.max <= 1e-3, "label logprob max |Δ| {}", labels.max);
}

/// The quantized path serves the file's own weights: Sonde's kernels multiply the Q4_1 /
/// Q8_0 blocks by f32 activations, so the only difference from the float64 reference is
/// f32 arithmetic. Measured: max |Δ| 2.3e-5, mean 2.1e-6 on the prompt logprobs (labels:
/// 6.3e-5, 6.2e-6) — the same as the f32 safetensors path; the bounds leave ~40x room.
#[test]
fn gguf_path_matches_float64_reference_within_1e_3() {
    let (prompt, labels, positions) = compare_prompt_scores(&gguf_path());
    eprintln!(
        "GGUF (as stored) vs f64 reference over {positions} prompt positions: \
         prompt logprobs max |Δ| {:.3e} mean {:.3e}; label logprobs max {:.3e} mean {:.3e}",
        prompt.max,
        prompt.mean(),
        labels.max,
        labels.mean()
    );
    assert!(prompt.max <= 1e-3, "max |Δ| {}", prompt.max);
    assert!(prompt.mean() <= 1e-4, "mean |Δ| {}", prompt.mean());
    assert!(labels.max <= 2e-3, "label max |Δ| {}", labels.max);
}

/// 32 greedy tokens after every reference prompt, all prompts in one batch.
fn greedy_runs(path: &Path, r: &Reference) -> HashMap<u64, Outcome> {
    let mut engine = engine(path, 8192);
    let requests = r
        .prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Req::new(i as u64, &p.ids, 32).ignore_eos())
        .collect();
    run_batch(&mut engine, 1, requests)
}

/// Greedy continuations: the f32 path reproduces the reference's tokens at every step
/// (the smallest reference margin is 0.011, far above f32 noise) and its chosen-token
/// logprobs.
#[test]
fn f32_greedy_matches_reference_tokens_and_logprobs() {
    let r = reference();
    let out = greedy_runs(&hf_f32_path(), &r);
    let mut worst: f64 = 0.0;
    for (i, p) in r.prompts.iter().enumerate() {
        let got = &out[&(i as u64)];
        for step in 0..32 {
            assert_eq!(
                got.tokens[step].id, p.greedy[step],
                "prompt {i} step {step} (reference margin {})",
                p.greedy_margin[step]
            );
            let d = (got.tokens[step].logprob.unwrap() as f64 - p.greedy_logprobs[step]).abs();
            worst = worst.max(d);
        }
    }
    eprintln!("f32 greedy: 8 prompts × 32 steps identical; chosen logprob max |Δ| {worst:.2e}");
    assert!(worst <= 1e-3, "{worst}");
}

/// The GGUF and safetensors paths give the same greedy tokens for 32 steps.
#[test]
fn gguf_and_safetensors_paths_agree_on_greedy_tokens() {
    let r = reference();
    let q = greedy_runs(&gguf_path(), &r);
    let f = greedy_runs(&hf_f32_path(), &r);
    for i in 0..r.prompts.len() as u64 {
        assert_eq!(q[&i].ids(), f[&i].ids(), "prompt {i}");
    }
}

/// The reference's top-10 after each prompt position, as the f32 path ranks it.
#[test]
fn f32_top_tokens_match_reference_order() {
    let r = reference();
    let mut engine = engine(&hf_f32_path(), 4096);
    let p = &r.prompts[7];
    let out = run_one(
        &mut engine,
        Req::new(1, &p.ids, 1).ignore_eos().scores(|s| {
            s.prefill_logprobs = true;
            s.top_n_tokens = 5;
        }),
    );
    let mut checked = 0;
    for pos in 1..p.ids.len() {
        let want = &p.top[pos - 1];
        let got: &TokenScore = &out.prefill[pos];
        for k in 0..5 {
            // Neighbours closer than f32 noise may legitimately swap.
            let gap_ok =
                want[k].1 - want[k + 1].1 > 1e-3 && (k == 0 || want[k - 1].1 - want[k].1 > 1e-3);
            if gap_ok {
                assert_eq!(got.top_tokens[k].id, want[k].0, "position {pos} rank {k}");
                assert!((got.top_tokens[k].logprob as f64 - want[k].1).abs() <= 1e-3);
                checked += 1;
            }
        }
    }
    assert!(checked > 400, "{checked}");
}

#[test]
#[ignore = "measurement for the notes: the --gguf-quant q8_0 option"]
fn gguf_requantized_q8_0_noise() {
    let (prompt, labels, positions) =
        compare_prompt_scores_with(&gguf_path(), &reference(), WeightQuant::Q8_0);
    eprintln!(
        "GGUF (requantized to q8_0) vs f64 reference over {positions} prompt positions: \
         prompt logprobs max |Δ| {:.3e} mean {:.3e}; label logprobs max {:.3e} mean {:.3e}",
        prompt.max,
        prompt.mean(),
        labels.max,
        labels.mean()
    );
}

/// Greedy tokens against the reference's: identical at every step until one where the
/// reference's top-1/top-2 margin is within f32 noise (there either token is right, and
/// the continuations part). Returns how many steps were compared.
fn check_greedy(label: &str, out: &HashMap<u64, Outcome>, r: &Reference) -> usize {
    let mut compared = 0;
    for (i, p) in r.prompts.iter().enumerate() {
        let got = &out[&(i as u64)];
        for (step, want) in p.greedy.iter().enumerate() {
            let token = &got.tokens[step];
            if token.id != *want {
                assert!(
                    p.greedy_margin[step] < 1e-4,
                    "{label}: prompt {i} step {step}: token {} where the reference has {want} \
                     (its margin {:.2e})",
                    token.id,
                    p.greedy_margin[step]
                );
                break;
            }
            let d = (token.logprob.unwrap() as f64 - p.greedy_logprobs[step]).abs();
            assert!(
                d <= 1e-3,
                "{label}: prompt {i} step {step}: logprob |Δ| {d}"
            );
            compared += 1;
        }
    }
    compared
}

/// Scores and greedy tokens of one model against its reference, with the bounds of the
/// default model: prompt logprobs max 1e-3 and mean 1e-4, labels max 2e-3.
fn check_model(label: &str, model: &Path, reference: &Path) {
    let r = reference_at(reference);
    let (prompt, labels, positions) = compare_prompt_scores_with(model, &r, WeightQuant::default());
    eprintln!(
        "{label} vs f64 reference over {positions} prompt positions: prompt logprobs max |Δ| \
         {:.3e} mean {:.3e}; label logprobs max {:.3e} mean {:.3e}",
        prompt.max,
        prompt.mean(),
        labels.max,
        labels.mean()
    );
    let steps = check_greedy(label, &greedy_runs(model, &r), &r);
    eprintln!("{label}: {steps} greedy steps equal");
    let ids: Vec<Vec<u32>> = r.prompts.iter().map(|p| p.ids.clone()).collect();
    assert_prompt_scores_change_no_token(model, &ids);
    assert_unscored_tokens_are_the_scored_ones(model, &ids);
    assert!(
        positions >= 200,
        "{label}: only {positions} scored positions"
    );
    assert!(prompt.max <= 1e-3, "{label}: max |Δ| {}", prompt.max);
    assert!(prompt.mean() <= 1e-4, "{label}: mean |Δ| {}", prompt.mean());
    assert!(labels.max <= 2e-3, "{label}: label max |Δ| {}", labels.max);
    assert!(
        steps >= r.prompts.len() * 16,
        "{label}: only {steps} greedy steps compared"
    );
}

/// Gemma 3 270M Q4_K_M as stored: Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors multiplied by f32
/// activations, five sliding-window layers to each global one, each with its rope base.
#[test]
fn gemma3_gguf_matches_float64_reference() {
    check_model(
        "Gemma 3 GGUF",
        &gemma3_path(),
        &sonde_testdata::path("reference/gemma3/forward.json"),
    );
}

/// The same model dequantized into an f32 Hugging Face folder (`scripts/gguf_to_hf.py`:
/// HF names, HF's `1 + w` norms, `config.json` with `layer_types` and both rope bases):
/// the safetensors path reads the same architecture from the other kind of source.
#[test]
fn gemma3_f32_safetensors_matches_float64_reference() {
    check_model(
        "Gemma 3 f32 safetensors",
        &sonde_testdata::path("models/gemma3-hf-f32"),
        &sonde_testdata::path("reference/gemma3/forward.json"),
    );
}

/// Prompt logprobs of every reference prompt, position by position (None at 0).
fn prompt_logprobs(path: &Path, r: &Reference) -> Vec<Vec<Option<f32>>> {
    let mut engine = engine(path, 4096);
    r.prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let req = Req::new(i as u64, &p.ids, 1)
                .ignore_eos()
                .scores(|s| s.prefill_logprobs = true);
            let out = run_one(&mut engine, req);
            out.prefill.iter().map(|t| t.logprob).collect()
        })
        .collect()
}

/// The GGUF and its HF folder side by side: the same greedy tokens, prompt logprobs within
/// 1e-4 (both are f32 passes over the same values, in different kernels and layouts).
#[test]
fn gemma3_gguf_and_safetensors_paths_agree() {
    let r = reference_at(&sonde_testdata::path("reference/gemma3/forward.json"));
    let hf = sonde_testdata::path("models/gemma3-hf-f32");
    let mut deltas = Deltas::default();
    for (q, f) in prompt_logprobs(&gemma3_path(), &r)
        .iter()
        .zip(&prompt_logprobs(&hf, &r))
    {
        assert_eq!(q.len(), f.len());
        for (a, b) in q.iter().zip(f).skip(1) {
            deltas.add(a.unwrap() as f64, b.unwrap() as f64);
        }
    }
    eprintln!(
        "Gemma 3 GGUF vs f32 safetensors over {} positions: max |Δ| {:.2e} mean {:.2e}",
        deltas.n,
        deltas.max,
        deltas.mean()
    );
    assert!(deltas.max <= 1e-4, "max |Δ| {}", deltas.max);
    let (q, f) = (greedy_runs(&gemma3_path(), &r), greedy_runs(&hf, &r));
    for i in 0..r.prompts.len() as u64 {
        assert_eq!(q[&i].ids(), f[&i].ids(), "prompt {i}");
    }
}

fn test_model(name: &str) -> (PathBuf, PathBuf) {
    (
        sonde_testdata::path(&format!("models/test/{name}.gguf")),
        sonde_testdata::path(&format!("reference/test-models/{name}.json")),
    )
}

macro_rules! test_models {
    ($($test:ident => $name:literal,)*) => {$(
        #[test]
        fn $test() {
            let (model, reference) = test_model($name);
            check_model($name, &model, &reference);
        }
    )*};
}

test_models! {
    llama31_rope_freqs_match_float64_reference => "llama31-rope",
    llama_linear_rope_scaling_matches_float64_reference => "llama-linear",
    qwen2_biases_match_float64_reference => "qwen2",
    qwen3_qk_norms_match_float64_reference => "qwen3",
    phi3_fused_projections_and_partial_rotary_match_float64_reference => "phi3",
    gemma3_short_window_and_linear_scaling_match_float64_reference => "gemma3-swa",
    gemma2_softcaps_and_alternating_windows_match_float64_reference => "gemma2",
}
