//! The prefix cache changes what is computed, never a bit of what is returned: every
//! request below is run on an engine with the cache and on one without, and its prompt
//! scores, tokens and token scores must be equal as f32 values — warm after an earlier
//! request, fully cached, arriving together with requests that share its prefix, on
//! Gemma 3's sliding-window layers across the cache boundary — while the cache reports
//! the prompt tokens it supplied and gives way to admission under the KV budget.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use sonde_shard::engine::types::Batch;
use sonde_shard::engine::PREFIX_BLOCK_TOKENS as B;
use sonde_tokenizer::ModelTokenizer;

const CONTEXT: &str = "Question: A farmer has 17 sheep. All but 9 run away. How many sheep \
    does the farmer have left? Think about what \"all but\" means before answering, and show \
    the arithmetic. Context: in everyday English, \"all but N\" means every one except N, so \
    the remaining count is N itself rather than the difference. Answer:";

const ENDINGS: [&str; 4] = [
    " 9 sheep.",
    " 8 sheep.",
    " 17 sheep, since none leave.",
    " 26",
];

fn tokens(path: &Path, text: &str) -> Vec<u32> {
    ModelTokenizer::from_gguf_file(path)
        .unwrap()
        .encode(text, true)
        .unwrap()
}

/// Every score option on, sampled with a seed: what a cached prefix must not change.
fn scored(id: u64, ids: &[u32]) -> Req {
    Req::new(id, ids, 6)
        .ignore_eos()
        .scores(|s| {
            s.prefill_logprobs = true;
            s.top_n_tokens = 5;
            s.return_logits = true;
            s.logprob_token_ids = vec![0, 13, 260, 1000];
        })
        .sampling(|p| {
            p.do_sample = true;
            p.temperature = 0.8;
            p.seed = 7;
        })
}

fn assert_equal(warm: &Outcome, cold: &Outcome, what: &str) {
    assert_eq!(
        warm.prefill.len(),
        cold.prefill.len(),
        "{what}: prompt length"
    );
    for (pos, (w, c)) in warm.prefill.iter().zip(&cold.prefill).enumerate() {
        assert_eq!(w, c, "{what}: prompt position {pos}");
    }
    assert_eq!(warm.tokens, cold.tokens, "{what}: generated tokens");
    assert_eq!(warm.finish_reason, cold.finish_reason, "{what}");
}

fn prompt_with(context: &[u32], ending: &[u32]) -> Vec<u32> {
    [context, ending].concat()
}

#[test]
fn a_warm_prompt_scores_as_a_cold_one() {
    let path = gguf_path();
    let (mut warm, mut cold) = warm_and_cold(&path, 16_384);
    let ctx = tokens(&path, CONTEXT);
    assert!(ctx.len() > 4 * B, "the context spans several blocks");
    let ends: Vec<Vec<u32>> = ENDINGS
        .iter()
        .map(|e| tokens(&path, e)[1..].to_vec())
        .collect();

    let first = run_one(&mut warm, scored(1, &prompt_with(&ctx, &ends[0])));
    assert_eq!(first.cached_prompt_tokens, 0, "nothing is cached yet");
    for (i, end) in ends.iter().enumerate() {
        let prompt = prompt_with(&ctx, end);
        let id = 10 + i as u64;
        let w = run_one(&mut warm, scored(id, &prompt));
        let c = run_one(&mut cold, scored(id, &prompt));
        let shared = ctx.len() / B * B;
        assert!(
            w.cached_prompt_tokens as usize >= shared,
            "ending {i}: {} cached tokens, the context has {shared} in whole blocks",
            w.cached_prompt_tokens
        );
        assert_eq!(c.cached_prompt_tokens, 0);
        assert_equal(&w, &c, &format!("ending {i}"));
    }
    let stats = warm.prefix_stats();
    assert!(stats.hit_tokens >= (ENDINGS.len() * (ctx.len() / B * B)) as u64);
    assert_eq!(cold.prefix_stats().hit_tokens, 0);
    assert_eq!(warm.reserved_tokens(), 0);
}

#[test]
fn a_prompt_cached_whole_computes_only_its_last_token() {
    let path = gguf_path();
    let (mut warm, mut cold) = warm_and_cold(&path, 16_384);
    let ctx = tokens(&path, CONTEXT);
    let prompt = &ctx[..3 * B];
    run_one(&mut warm, scored(1, prompt));
    let w = run_one(&mut warm, scored(2, prompt));
    let c = run_one(&mut cold, scored(2, prompt));
    assert_eq!(w.cached_prompt_tokens as usize, 3 * B - 1);
    assert_equal(&w, &c, "fully cached prompt");
    // Without prompt scores too: the first token comes from the one computed row.
    let plain = |id| Req::new(id, prompt, 4).ignore_eos();
    let w = run_one(&mut warm, plain(3));
    let c = run_one(&mut cold, plain(3));
    assert_eq!(w.cached_prompt_tokens as usize, 3 * B - 1);
    assert_equal(&w, &c, "fully cached prompt, no prompt scores");
}

#[test]
fn requests_arriving_together_share_their_prefix_and_score_as_alone() {
    let path = gguf_path();
    let (mut warm, mut cold) = warm_and_cold(&path, 16_384);
    let ctx = tokens(&path, CONTEXT);
    let other = tokens(
        &path,
        "Photosynthesis converts light energy into chemical energy",
    );
    let mut requests = Vec::new();
    let mut alone = HashMap::new();
    for (i, e) in ENDINGS.iter().enumerate() {
        let prompt = prompt_with(&ctx, &tokens(&path, e)[1..]);
        let id = i as u64;
        // Even ids with prompt scores, odd ids without: both paths read loaded rows.
        let req = if i % 2 == 0 {
            scored(id, &prompt)
        } else {
            Req::new(id, &prompt, 5).ignore_eos()
        };
        alone.insert(id, run_one(&mut cold, req.clone()));
        requests.push(req);
        if i == 1 {
            requests.push(scored(99, &other));
            alone.insert(99, run_one(&mut cold, scored(99, &other)));
        }
    }
    let together = run_batch(&mut warm, 1, requests);
    for (id, want) in &alone {
        assert_equal(&together[id], want, &format!("request {id} in the batch"));
    }
    // The first request computes the context; the others load it in the second wave.
    assert_eq!(together[&0].cached_prompt_tokens, 0);
    assert_eq!(together[&99].cached_prompt_tokens, 0);
    for id in 1..ENDINGS.len() as u64 {
        assert_eq!(
            together[&id].cached_prompt_tokens as usize,
            ctx.len() / B * B,
            "request {id}"
        );
    }
}

#[test]
fn the_cache_gives_way_to_admission_under_the_budget() {
    let path = gguf_path();
    let budget = 24 * B;
    let (mut warm, _) = warm_and_cold(&path, budget);
    // Cached while it runs, in the room it leaves: 8 whole blocks.
    let long: Vec<u32> = tokens(&path, CONTEXT)
        .into_iter()
        .cycle()
        .take(8 * B + 3)
        .collect();
    run_one(&mut warm, Req::new(1, &long, 4).ignore_eos());
    assert_eq!(warm.prefix_stats().cached_tokens as usize, 8 * B);

    // Two requests reserving all but three blocks of the budget: the cache shrinks to fit
    // beside them, and they are admitted.
    let other = tokens(
        &path,
        "Photosynthesis converts light energy into chemical energy",
    );
    let a: Vec<u32> = other.iter().cycle().take(10 * B).copied().collect();
    let b: Vec<u32> = a.iter().rev().copied().collect();
    let step = warm
        .prefill(Batch {
            id: 7,
            requests: vec![
                Req::new(2, &a, B as u32 / 2).ignore_eos().0,
                Req::new(3, &b, B as u32 / 2).ignore_eos().0,
            ],
        })
        .expect("the cache never holds admission back");
    let held = warm.reserved_tokens();
    assert_eq!(held, 21 * B);
    let stats = step.prefix;
    assert!(stats.cached_tokens as usize + held <= budget, "{stats:?}");
    assert!(stats.evicted_tokens as usize >= 5 * B, "{stats:?}");
    warm.clear(None);
}

#[test]
fn gemma3_sliding_window_layers_score_as_cold_across_the_cache_boundary() {
    let path = gemma3_path();
    let (mut warm, mut cold) = warm_and_cold(&path, 16_384);
    // Past the 512-token window: cached keys leave the window of computed positions.
    let ctx: Vec<u32> = tokens(&path, CONTEXT)
        .into_iter()
        .cycle()
        .take(40 * B + 5)
        .collect();
    let gemma = |id, prompt: &[u32]| {
        Req::new(id, prompt, 4).ignore_eos().scores(|s| {
            s.prefill_logprobs = true;
            s.top_n_tokens = 3;
        })
    };
    run_one(&mut warm, gemma(1, &ctx));
    let mut longer = ctx.clone();
    longer.extend(&ctx[..20]);
    let w = run_one(&mut warm, gemma(2, &longer));
    let c = run_one(&mut cold, gemma(2, &longer));
    assert_eq!(w.cached_prompt_tokens as usize, 40 * B);
    assert_equal(&w, &c, "gemma 3, 660-token prompt");
}
