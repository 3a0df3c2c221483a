//! Scores agree with the full-vocabulary distribution of the same step.
//!
//! Asking for `top_n_tokens` = the whole vocabulary yields the step's full log-softmax,
//! sorted; every other score of an identical request must be consistent with it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use sonde_proto::LogprobsMode;
use sonde_shard::engine::types::TokenScore;
use sonde_tokenizer::ModelTokenizer;

const VOCAB: u32 = 49_152;
const LABELS: [u32; 5] = [0, 2, 28, 4649, 49_151];

fn prompt() -> Vec<u32> {
    let tok = ModelTokenizer::from_gguf_file(&gguf_path()).unwrap();
    tok.encode(
        "<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n<|im_start|>assistant\n",
        true,
    )
    .unwrap()
}

fn full(t: &TokenScore) -> Vec<(u32, f32)> {
    t.top_tokens.iter().map(|t| (t.id, t.logprob)).collect()
}

fn logprob_of(full: &[(u32, f32)], id: u32) -> f32 {
    full.iter().find(|(i, _)| *i == id).unwrap().1
}

#[test]
fn raw_scores_agree_with_the_full_distribution() {
    let ids = prompt();
    let mut engine = engine(&gguf_path(), 4096);
    let all = |r: Req| {
        r.ignore_eos().scores(|s| {
            s.top_n_tokens = VOCAB;
            s.return_logits = true;
            s.logprob_token_ids = LABELS.to_vec();
            s.prefill_logprobs = true;
        })
    };
    let wide = run_one(&mut engine, all(Req::new(1, &ids, 6)));
    let narrow = run_one(
        &mut engine,
        Req::new(2, &ids, 6)
            .ignore_eos()
            .scores(|s| s.top_n_tokens = 3),
    );
    assert_eq!(wide.ids(), narrow.ids());

    let steps = wide.prefill.iter().skip(1).chain(&wide.tokens);
    for t in steps {
        let full = full(t);
        assert_eq!(full.len(), VOCAB as usize, "exactly N entries");
        // Sorted by logprob, ties by the smaller id, every id once.
        for w in full.windows(2) {
            assert!(
                w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 < w[1].0),
                "{w:?}"
            );
        }
        let mut seen = vec![false; VOCAB as usize];
        full.iter().for_each(|(i, _)| seen[*i as usize] = true);
        assert!(seen.iter().all(|s| *s));
        // A distribution: probabilities sum to 1.
        let total: f64 = full.iter().map(|(_, l)| (*l as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-4, "sum of probabilities {total}");
        // The token's own logprob, rank and labels are the full distribution's.
        assert_eq!(t.logprob, Some(logprob_of(&full, t.id)));
        let rank = full.iter().position(|(i, _)| *i == t.id).unwrap() as u32 + 1;
        assert_eq!(t.rank, Some(rank));
        assert!(t.logit.unwrap().is_finite());
        for (label, lp) in LABELS.iter().zip(&t.label_logprobs) {
            assert_eq!(*lp, logprob_of(&full, *label), "label {label}");
        }
    }
    // Greedy picks the raw top-1; a narrower top-N is the head of the full list.
    for (w, n) in wide.tokens.iter().zip(&narrow.tokens) {
        assert_eq!(w.id, w.top_tokens[0].id);
        assert_eq!(w.rank, Some(1));
        assert_eq!(n.top_tokens, w.top_tokens[..3]);
        assert_eq!(n.logprob, w.logprob);
    }
}

#[test]
fn processed_scores_are_the_sampled_distribution() {
    let ids = prompt();
    let mut engine = engine(&gguf_path(), 4096);
    let req = |id, mode: LogprobsMode| {
        Req::new(id, &ids, 8)
            .ignore_eos()
            .sampling(|p| {
                p.do_sample = true;
                p.temperature = 0.7;
                p.top_k = 40;
                p.top_p = 0.9;
                p.repetition_penalty = 1.2;
                p.seed = 7;
            })
            .scores(|s| {
                s.top_n_tokens = VOCAB;
                s.return_logits = true;
                s.logprobs_mode = mode;
            })
    };
    let processed = run_one(&mut engine, req(1, LogprobsMode::Processed));
    let raw = run_one(&mut engine, req(2, LogprobsMode::Raw));
    // The mode changes what is reported, never what is sampled.
    assert_eq!(processed.ids(), raw.ids());
    for (p, r) in processed.tokens.iter().zip(&raw.tokens) {
        let support: Vec<(u32, f32)> = full(p).into_iter().filter(|(_, l)| l.is_finite()).collect();
        assert!(
            !support.is_empty() && support.len() <= 40,
            "top-k bounds the support"
        );
        let total: f64 = support.iter().map(|(_, l)| (*l as f64).exp()).sum();
        assert!(
            (total - 1.0).abs() < 1e-4,
            "processed probabilities sum to {total}"
        );
        assert!(
            support.iter().any(|(i, _)| *i == p.id),
            "the chosen token is in the support"
        );
        assert_eq!(p.logprob, Some(logprob_of(&support, p.id)));
        // logit and rank stay raw in both modes.
        assert_eq!(p.logit, r.logit);
        assert_eq!(p.rank, r.rank);
        let raw_rank = r.top_tokens.iter().position(|t| t.id == r.id).unwrap() as u32 + 1;
        assert_eq!(r.rank, Some(raw_rank));
    }
}
