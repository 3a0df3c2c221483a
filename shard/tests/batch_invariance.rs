//! A request's tokens and scores do not depend on its neighbours: alone, inside a batch of
//! 32 with mixed prompt lengths, and joining a running batch mid-decode.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use sonde_proto::WeightQuant;
use sonde_shard::engine::types::{Batch, Request, TokenScore};
use sonde_shard::engine::Engine;
use sonde_shard::loader::LoadOptions;
use sonde_tokenizer::ModelTokenizer;

const TEXTS: [&str; 4] = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nName three rivers in Europe and say which countries they cross.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. Numbers: 3.14159, 2.71828, 1.41421!",
    "Photosynthesis converts light energy into chemical energy stored in glucose; the light-dependent reactions",
];

/// Prompts of varied lengths (5 to ~90 tokens) cut from the texts above.
fn prompts(tok: &ModelTokenizer) -> Vec<Vec<u32>> {
    let ids: Vec<Vec<u32>> = TEXTS.iter().map(|t| tok.encode(t, true).unwrap()).collect();
    let long: Vec<u32> = ids.concat();
    (0..32)
        .map(|i| {
            let len = 5 + (i * 13) % 85;
            long.iter().cycle().skip(i * 7).take(len).copied().collect()
        })
        .collect()
}

/// The request under test: every score option on, sampled with a seed so the RNG path is
/// covered too.
fn target(id: u64, ids: &[u32], sampled: bool) -> Req {
    Req::new(id, ids, 12)
        .ignore_eos()
        .scores(|s| {
            s.prefill_logprobs = true;
            s.top_n_tokens = 4;
            s.return_logits = true;
            s.logprob_token_ids = vec![0, 2, 13, 260, 1000, 49151];
        })
        .sampling(|p| {
            if sampled {
                p.do_sample = true;
                p.temperature = 0.9;
                p.top_p = 0.95;
                p.seed = 1234;
            }
        })
}

/// Neighbours with different lengths, options and budgets.
fn neighbour(id: u64, ids: &[u32]) -> Req {
    let r = Req::new(id, ids, 3 + (id % 9) as u32).ignore_eos();
    if id.is_multiple_of(3) {
        r.scores(|s| s.prefill_logprobs = true)
    } else {
        r
    }
}

fn assert_same(a: &Outcome, b: &Outcome, what: &str) {
    assert_eq!(a.ids(), b.ids(), "{what}: tokens");
    assert_eq!(a.prefill.len(), b.prefill.len(), "{what}: prompt length");
    let pairs = a
        .prefill
        .iter()
        .zip(&b.prefill)
        .chain(a.tokens.iter().zip(&b.tokens));
    let mut worst: f32 = 0.0;
    for (x, y) in pairs {
        assert_eq!(x.id, y.id, "{what}");
        assert_eq!(x.rank, y.rank, "{what}: rank of {}", x.id);
        let ids = |t: &TokenScore| t.top_tokens.iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(ids(x), ids(y), "{what}: top ids");
        let nums = |t: &TokenScore| {
            let mut v: Vec<f32> = t.logprob.into_iter().chain(t.logit).collect();
            v.extend(t.top_tokens.iter().map(|t| t.logprob));
            v.extend(&t.label_logprobs);
            v
        };
        let (nx, ny) = (nums(x), nums(y));
        assert_eq!(nx.len(), ny.len(), "{what}");
        for (p, q) in nx.iter().zip(&ny) {
            worst = worst.max((p - q).abs());
        }
    }
    eprintln!("{what}: max |Δ| over every score {worst:e}");
    assert!(worst <= 1e-5, "{what}: max |Δ| {worst}");
}

fn check_model(path: &Path, sampled: bool) {
    let tok = ModelTokenizer::from_gguf_file(&gguf_path()).unwrap();
    let prompts = prompts(&tok);
    let subject = &prompts[17];
    let mut engine: Engine = engine(path, 16_384);

    let alone = run_one(&mut engine, target(999, subject, sampled));

    // In a batch of 32: the subject at position 17 among 31 others.
    let mut batch: Vec<Req> = (0..32u64)
        .filter(|&i| i != 17)
        .map(|i| neighbour(i, &prompts[i as usize]))
        .collect();
    batch.insert(17, target(999, subject, sampled));
    let in_batch = run_batch(&mut engine, 1, batch).remove(&999).unwrap();
    assert_same(&alone, &in_batch, "alone vs batch of 32");

    // Joining mid-decode: 8 requests run 4 steps, then the subject is prefilled and the two
    // batches decode together.
    let mut out: HashMap<u64, Outcome> = HashMap::new();
    let first: Vec<Request> = (0..8u64)
        .map(|i| Req::new(i, &prompts[(i * 3) as usize], 20).ignore_eos().0)
        .collect();
    let step = engine
        .prefill(Batch {
            id: 10,
            requests: first,
        })
        .unwrap();
    absorb(&mut out, step.generations);
    for _ in 0..4 {
        let step = engine.decode(&[10]).unwrap();
        absorb(&mut out, step.generations);
    }
    let step = engine
        .prefill(Batch {
            id: 11,
            requests: vec![target(999, subject, sampled).0],
        })
        .unwrap();
    absorb(&mut out, step.generations);
    let mut ids = vec![10, 11];
    loop {
        let step = engine.decode(&ids).unwrap();
        absorb(&mut out, step.generations);
        match step.batch {
            Some(b) => ids = vec![b.id],
            None => break,
        }
    }
    assert_same(&alone, &out[&999], "alone vs joining mid-decode");
    assert_eq!(
        engine.reserved_tokens(),
        0,
        "every finished request freed its cache"
    );
}

#[test]
fn gguf_scores_are_batch_invariant_greedy() {
    check_model(&gguf_path(), false);
}

#[test]
fn gguf_scores_are_batch_invariant_sampled() {
    check_model(&gguf_path(), true);
}

#[test]
fn safetensors_scores_are_batch_invariant() {
    check_model(&hf_f32_path(), true);
}

/// A request's tokens and their scores are the same bits whether it scores its prompt or
/// not, on the quantized and the f32 paths.
#[test]
fn tokens_are_the_same_bits_with_and_without_prompt_scores() {
    let tok = ModelTokenizer::from_gguf_file(&gguf_path()).unwrap();
    let prompts: Vec<Vec<u32>> = prompts(&tok).into_iter().step_by(3).collect();
    for path in [gguf_path(), hf_f32_path()] {
        assert_prompt_scores_change_no_token(&path, &prompts);
    }
}

/// Greedy tokens whose logprobs the answer does not show are the same tokens, found from
/// the output layer's index (the GGUF's Q8_0 embedding) or, on the f32 path, which has
/// none, from the full rows.
#[test]
fn unscored_greedy_tokens_are_the_scored_ones() {
    let tok = ModelTokenizer::from_gguf_file(&gguf_path()).unwrap();
    let prompts: Vec<Vec<u32>> = prompts(&tok).into_iter().step_by(2).collect();
    assert!(common::engine(&gguf_path(), 1024).output_layer_has_greedy_index() || !vnni());
    for path in [gguf_path(), hf_f32_path()] {
        assert_unscored_tokens_are_the_scored_ones(&path, &prompts);
    }
}

/// Whether this CPU runs the greedy index's kernel (AVX-512 VNNI and VBMI).
fn vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vbmi")
}

/// The wide copy of the Q4/Q5 matrices (read by every product of 10 rows or more, see
/// docs/shard.md, "Weights") changes no bit: a batch of 32 with every score on, on an
/// engine with it and on one without.
#[test]
fn gguf_scores_are_the_same_bits_without_the_wide_copy() {
    let tok = ModelTokenizer::from_gguf_file(&gguf_path()).unwrap();
    let prompts = prompts(&tok);
    let run = |engine: &mut Engine| {
        let batch = (0..32u64)
            .map(|i| target(i, &prompts[i as usize], i % 2 == 1))
            .collect();
        run_batch(engine, 1, batch)
    };
    let with = run(&mut engine(&gguf_path(), 16_384));
    let opts = LoadOptions {
        wide_quants_bytes: 0,
        ..LoadOptions::cpu(WeightQuant::default())
    };
    let without = run(&mut engine_opts(&gguf_path(), 16_384, &opts));
    assert_eq!(with.len(), 32);
    for (id, a) in &with {
        let b = &without[id];
        // `{:?}` of an f32 is the shortest text that reads back to its bits.
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "request {id}");
    }
}
