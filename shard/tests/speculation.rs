//! Speculative decoding changes how many decode steps a request takes, never a bit of what
//! it returns: every request below runs on an engine that drafts and on one that does not,
//! alone and in a batch, and its tokens, token scores (top-N, logits, ranks, labels) and
//! finish reason must be equal as f32 values — greedy and sampled with a seed, with
//! penalties, finishing in the middle of a draft by length, stop token or end of text —
//! while the drafting engine takes fewer steps and reports the drafts it accepted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use sonde_proto::WeightQuant;
use sonde_shard::engine::{Engine, Speculation};
use sonde_shard::loader::LoadOptions;
use sonde_tokenizer::ModelTokenizer;

/// Text that repeats itself, so drafts copied from the prompt are often right: the model
/// goes on with the verse (after five of them, even a 135M model does).
fn repeating() -> String {
    let verse = "Roses are red, violets are blue, sugar is sweet, and so are you.\n";
    verse.repeat(5) + "Roses are red, violets"
}
/// Text that does not, so drafts are mostly wrong.
const PLAIN: &str = "Photosynthesis converts light energy into chemical energy stored in \
    glucose; the light-dependent reactions take place in the thylakoid membranes, where";

fn engines(path: &Path) -> (Engine, Engine) {
    let opts = LoadOptions::cpu(WeightQuant::default());
    let drafting = engine_config(path, &opts, config(16_384));
    let mut plain_cfg = config(16_384);
    plain_cfg.speculation = Speculation::OFF;
    let plain = engine_config(path, &opts, plain_cfg);
    (drafting, plain)
}

fn tokens(path: &Path, text: &str) -> Vec<u32> {
    ModelTokenizer::from_gguf_file(path)
        .unwrap()
        .encode(text, true)
        .unwrap()
}

/// Every score option on.
fn scored(id: u64, ids: &[u32], new_tokens: u32) -> Req {
    Req::new(id, ids, new_tokens).ignore_eos().scores(|s| {
        s.top_n_tokens = 5;
        s.return_logits = true;
        s.logprob_token_ids = vec![0, 13, 260, 1000];
    })
}

fn sampled(r: Req, seed: u64) -> Req {
    r.sampling(|p| {
        p.do_sample = true;
        p.temperature = 0.7;
        p.top_k = 40;
        p.seed = seed;
    })
}

/// The requests under test, on prompts `rep` (repeating) and `plain`.
fn requests(rep: &[u32], plain: &[u32]) -> Vec<Req> {
    // A token of the repeating line, which the continuation reaches again within a line.
    let stop_token = rep[rep.len() - 11];
    vec![
        scored(1, rep, 40),
        sampled(scored(2, rep, 40), 11),
        scored(3, plain, 24),
        sampled(scored(4, plain, 24), 5),
        // Penalties see each taken token before the next row is sampled.
        scored(5, rep, 30).sampling(|p| {
            p.repetition_penalty = 1.3;
            p.frequency_penalty = 0.2;
        }),
        // Ends inside what would be a draft: by length after 3 tokens...
        scored(6, rep, 3),
        // ...and at a stop token.
        {
            let mut r = scored(7, rep, 40);
            r.0.stopping.stop_token_ids = vec![stop_token];
            r
        },
        // End of text counts (eos not ignored).
        Req::new(8, rep, 40),
    ]
}

fn assert_same(a: &Outcome, b: &Outcome, what: &str) {
    assert_eq!(a.ids(), b.ids(), "{what}: tokens");
    for (i, (x, y)) in a.tokens.iter().zip(&b.tokens).enumerate() {
        assert_eq!(x, y, "{what}: scores of token {i}");
    }
    assert_eq!(a.finish_reason, b.finish_reason, "{what}: finish reason");
}

#[test]
fn drafted_decoding_returns_the_plain_decodings_tokens_and_scores() {
    let path = gguf_path();
    let (mut drafting, mut plain) = engines(&path);
    let rep = tokens(&path, &repeating());
    let text = tokens(&path, PLAIN);

    let mut steps = (0, 0);
    for req in requests(&rep, &text) {
        let id = req.0.id;
        let (d, sd) = run_batch_counting(&mut drafting, 100 + id, vec![req.clone()]);
        let (p, sp) = run_batch_counting(&mut plain, 100 + id, vec![req]);
        assert_same(&d[&id], &p[&id], &format!("request {id} alone"));
        assert!(sd <= sp, "request {id}: {sd} drafting steps, {sp} plain");
        steps.0 += sd;
        steps.1 += sp;
    }
    let stats = drafting.speculation_stats();
    assert!(
        stats.accepted_tokens > 20 && stats.drafted_tokens > stats.accepted_tokens,
        "the repeating prompt's drafts are mostly taken, the plain one's mostly not: {stats:?}"
    );
    assert!(
        steps.0 < steps.1,
        "drafting took {} decode steps, plain decoding {}",
        steps.0,
        steps.1
    );
    assert_eq!(plain.speculation_stats().drafted_tokens, 0);
    assert_eq!(
        drafting.reserved_tokens(),
        0,
        "every reservation is released"
    );
}

#[test]
fn a_drafting_batch_returns_what_each_request_returns_alone() {
    let path = gguf_path();
    let (mut drafting, mut plain) = engines(&path);
    let rep = tokens(&path, &repeating());
    let text = tokens(&path, PLAIN);
    let reqs = requests(&rep, &text);

    // Eight requests fill a step past the row budget: no drafts at first, then more as
    // requests finish.
    let (batch, _) = run_batch_counting(&mut drafting, 7, reqs.clone());
    for req in reqs {
        let id = req.0.id;
        let (alone, _) = run_batch_counting(&mut plain, 200 + id, vec![req]);
        assert_same(
            &batch[&id],
            &alone[&id],
            &format!("request {id} in a batch"),
        );
    }
    assert!(drafting.speculation_stats().accepted_tokens > 0);
}

#[test]
fn gemma3_drafts_across_its_sliding_window_return_the_plain_tokens() {
    let path = gemma3_path();
    let (mut drafting, mut plain) = engines(&path);
    // Longer than the 512-token window of Gemma 3's local layers, so verified rows
    // attend across the window's edge.
    let mut rep = tokens(&path, &repeating().repeat(5));
    rep.truncate(560);
    for req in [scored(1, &rep, 24), sampled(scored(2, &rep, 24), 3)] {
        let id = req.0.id;
        let (d, _) = run_batch_counting(&mut drafting, 300 + id, vec![req.clone()]);
        let (p, _) = run_batch_counting(&mut plain, 300 + id, vec![req]);
        assert_same(&d[&id], &p[&id], &format!("gemma 3, request {id}"));
    }
    assert!(drafting.speculation_stats().accepted_tokens > 0);
}
