use std::collections::HashMap;

use super::*;
use crate::sampling::test_util::{log_softmax_f64, logits};

const NEG_INF: f32 = f32::NEG_INFINITY;

/// Logits whose softmax is exactly `probs` (up to f32 rounding of the logs).
fn from_probs(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn kept(logits: &[f32]) -> Vec<u32> {
    (0..logits.len() as u32)
        .filter(|&i| logits[i as usize] > NEG_INF)
        .collect()
}

/// Probabilities in f64, by the test's own softmax.
fn probs_f64(xs: &[f64]) -> Vec<f64> {
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = xs.iter().map(|&x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|&v| v / s).collect()
}

/// Ids sorted by value descending, ties to the smaller id (the test's own sort).
fn sorted_desc(xs: &[f64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..xs.len()).collect();
    idx.sort_by(|&a, &b| xs[b].partial_cmp(&xs[a]).unwrap().then(a.cmp(&b)));
    idx
}

/// The whole pipeline written out longhand in f64 with full sorts, following the HF/TGI
/// definitions literally; returns processed logprobs (-inf outside the support).
fn reference(p: &SamplingParams, history: &[u32], raw: &[f32]) -> Vec<f64> {
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in history {
        *counts.entry(t).or_default() += 1;
    }
    let mut x: Vec<f32> = raw.to_vec();
    for (&t, &n) in &counts {
        let v = &mut x[t as usize];
        if p.repetition_penalty != 1.0 {
            *v = if *v > 0.0 {
                *v / p.repetition_penalty
            } else {
                *v * p.repetition_penalty
            };
        }
        *v -= p.frequency_penalty * n as f32;
    }
    let mut x: Vec<f64> = x
        .iter()
        .map(|&v| f64::from(v) / f64::from(p.temperature))
        .collect();
    let order = sorted_desc(&x);
    if p.top_k != 0 {
        for &i in order.iter().skip(p.top_k as usize) {
            x[i] = f64::NEG_INFINITY;
        }
    }
    if p.top_p < 1.0 {
        let pr = probs_f64(&x);
        let mut cum = 0.0;
        for &i in &order {
            if cum >= f64::from(p.top_p) && cum > 0.0 {
                x[i] = f64::NEG_INFINITY;
            }
            cum += pr[i];
        }
    }
    if p.typical_p < 1.0 {
        let pr = probs_f64(&x);
        let ent: f64 = -pr
            .iter()
            .map(|&q| if q > 0.0 { q * q.ln() } else { 0.0 })
            .sum::<f64>();
        let shifted: Vec<f64> = pr.iter().map(|&q| (-q.ln() - ent).abs()).collect();
        let mut idx: Vec<usize> = (0..x.len()).collect();
        idx.sort_by(|&a, &b| shifted[a].partial_cmp(&shifted[b]).unwrap().then(a.cmp(&b)));
        let mut cum = 0.0;
        let cums: Vec<f64> = idx
            .iter()
            .map(|&i| {
                cum += pr[i];
                cum
            })
            .collect();
        let last = cums
            .iter()
            .filter(|&&c| c < f64::from(p.typical_p))
            .count()
            .min(idx.len() - 1);
        let bound = shifted[idx[last]];
        for (pos, &i) in idx.iter().enumerate() {
            if pos > 0 && shifted[i] > bound {
                x[i] = f64::NEG_INFINITY;
            }
        }
    }
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + x.iter().map(|&v| (v - m).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v - lse).collect()
}

fn process(p: &SamplingParams, history: &[u32], raw: &[f32]) -> Vec<f32> {
    let mut scratch = Scratch::new();
    process_logits_into(p, &TokenCounts::from_ids(history), raw, &mut scratch);
    scratch.values
}

#[test]
fn token_counts() {
    let c = TokenCounts::from_ids(&[3, 1, 3, 3]);
    assert_eq!(c.count(3), 3);
    assert_eq!(c.count(1), 1);
    assert_eq!(c.count(2), 0);
    assert!(TokenCounts::new().is_empty());
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_once_per_token() {
    // Token 0 occurs twice but is penalised once; id 9 is outside the row and ignored.
    let history = [0, 0, 1, 2, 9];
    let raw = [2.0, -2.0, 0.0, 1.0, 3.0];
    let p = SamplingParams {
        repetition_penalty: 2.0,
        ..Default::default()
    };
    assert_eq!(process(&p, &history, &raw), vec![1.0, -4.0, 0.0, 1.0, 3.0]);
    let p = SamplingParams {
        repetition_penalty: 0.5,
        ..Default::default()
    };
    assert_eq!(process(&p, &history, &raw), vec![4.0, -1.0, 0.0, 1.0, 3.0]);
}

#[test]
fn frequency_penalty_subtracts_per_occurrence() {
    let history = [0, 0, 0, 2, 7];
    let raw = [1.0, 1.0, 1.0];
    let p = SamplingParams {
        frequency_penalty: 0.5,
        ..Default::default()
    };
    assert_eq!(process(&p, &history, &raw), vec![-0.5, 1.0, 0.5]);
    let p = SamplingParams {
        frequency_penalty: -1.0,
        ..Default::default()
    };
    assert_eq!(process(&p, &history, &raw), vec![4.0, 1.0, 2.0]);
}

#[test]
fn repetition_penalty_applies_before_frequency_penalty() {
    // 3.0 / 2 - 1 * 2 = -0.5; the other order would give (3 - 2) / 2 = 0.5.
    let p = SamplingParams {
        repetition_penalty: 2.0,
        frequency_penalty: 1.0,
        ..Default::default()
    };
    assert_eq!(process(&p, &[0, 0], &[3.0, 0.0]), vec![-0.5, 0.0]);
}

#[test]
fn temperature_matches_f64_math() {
    let raw = logits(5, 1000, 10.0, 0.0);
    for t in [0.3f32, 0.7, 1.5, 1e-3] {
        let p = SamplingParams {
            temperature: t,
            ..Default::default()
        };
        let mut scratch = Scratch::new();
        let got = processed_logprobs(&p, &TokenCounts::new(), &raw, &mut scratch).unwrap();
        let scaled: Vec<f32> = raw
            .iter()
            .map(|&x| (f64::from(x) / f64::from(t)) as f32)
            .collect();
        let want = log_softmax_f64(&scaled);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if w < -80.0 {
                // Far below f32 resolution of anything observable; only check it is tiny.
                assert!(g < -70.0, "t {t} token {i}: {g} vs {w}");
            } else {
                assert!(
                    (f64::from(g) - w).abs() < 1e-4 * (1.0 + w.abs()),
                    "t {t} token {i}: {g} vs {w}"
                );
            }
        }
    }
    // A tiny temperature on large logits must not overflow into NaN.
    // 80 / 1e-37 is beyond f32::MAX; after the shift only -1 / 1e-37 = -1e37 remains.
    let p = SamplingParams {
        temperature: 1e-37,
        ..Default::default()
    };
    let mut scratch = Scratch::new();
    let got = processed_logprobs(&p, &TokenCounts::new(), &[80.0, 79.0], &mut scratch).unwrap();
    assert_eq!(got[0], 0.0);
    assert!(got[1].is_finite() && got[1] < -1e36, "{}", got[1]);
}

#[test]
fn top_k_keeps_exactly_k_with_ties_to_smaller_ids() {
    let raw = [1.0, 3.0, 2.0, 2.0, 2.0];
    let k = |k: u32| {
        kept(&process(
            &SamplingParams {
                top_k: k,
                ..Default::default()
            },
            &[],
            &raw,
        ))
    };
    assert_eq!(k(1), vec![1]);
    assert_eq!(k(2), vec![1, 2]);
    assert_eq!(k(3), vec![1, 2, 3]);
    assert_eq!(k(4), vec![1, 2, 3, 4]);
    assert_eq!(k(5), vec![0, 1, 2, 3, 4]);
    assert_eq!(k(50), vec![0, 1, 2, 3, 4]);
    // Kept logits are untouched.
    let out = process(
        &SamplingParams {
            top_k: 2,
            ..Default::default()
        },
        &[],
        &raw,
    );
    assert_eq!(out, vec![NEG_INF, 3.0, 2.0, NEG_INF, NEG_INF]);
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_p() {
    // Sorted: id 1 (0.5), id 2 (0.3), then ids 0 and 3 tie at 0.1 (id 0 first).
    let raw = from_probs(&[0.1, 0.5, 0.3, 0.1]);
    let k = |p: f32| {
        kept(&process(
            &SamplingParams {
                top_p: p,
                ..Default::default()
            },
            &[],
            &raw,
        ))
    };
    assert_eq!(k(0.05), vec![1]); // at least one token
    assert_eq!(k(0.45), vec![1]);
    assert_eq!(k(0.55), vec![1, 2]);
    assert_eq!(k(0.75), vec![1, 2]);
    assert_eq!(k(0.85), vec![0, 1, 2]); // the tie goes to the smaller id
    assert_eq!(k(0.95), vec![0, 1, 2, 3]);
    assert_eq!(k(1.0), vec![0, 1, 2, 3]); // off
                                          // Equal probabilities: the prefix is taken in id order.
    let flat = [0.0f32; 4];
    let p = SamplingParams {
        top_p: 0.3,
        ..Default::default()
    };
    assert_eq!(kept(&process(&p, &[], &flat)), vec![0, 1]);
}

#[test]
fn typical_p_matches_a_hand_computed_example() {
    // p = [0.5, 0.3, 0.15, 0.05]; entropy H = -sum p ln p = 1.14212 nats.
    // |-ln p - H| per id: 0 -> 0.44897, 1 -> 0.06185, 2 -> 0.75500, 3 -> 1.85361,
    // so the typical order is 1, 0, 2, 3 with cumulative mass 0.3, 0.8, 0.95, 1.0.
    let raw = from_probs(&[0.5, 0.3, 0.15, 0.05]);
    let k = |m: f32| {
        kept(&process(
            &SamplingParams {
                typical_p: m,
                ..Default::default()
            },
            &[],
            &raw,
        ))
    };
    // The cumulative mass reaches 0.2 at the first token: the most likely token (id 0)
    // is dropped, which is what typical sampling is for.
    assert_eq!(k(0.2), vec![1]);
    assert_eq!(k(0.5), vec![0, 1]);
    assert_eq!(k(0.85), vec![0, 1, 2]);
    assert_eq!(k(0.99), vec![0, 1, 2, 3]);
    assert_eq!(k(1.0), vec![0, 1, 2, 3]);
}

#[test]
fn typical_p_keeps_tokens_tying_with_the_boundary() {
    // Two equally likely tokens have the same distance from the entropy; HF keeps every
    // token at the boundary distance even though the mass is reached by the first.
    let raw = from_probs(&[0.4, 0.4, 0.2]);
    let p = SamplingParams {
        typical_p: 0.1,
        ..Default::default()
    };
    assert_eq!(kept(&process(&p, &[], &raw)), vec![0, 1]);
}

#[test]
fn pipeline_matches_the_longhand_reference() {
    let history = [5, 5, 9, 100, 200, 200, 200, 311];
    let combos = [
        SamplingParams {
            temperature: 0.8,
            ..Default::default()
        },
        SamplingParams {
            top_k: 40,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.9,
            ..Default::default()
        },
        SamplingParams {
            typical_p: 0.7,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 1.3,
            frequency_penalty: 0.4,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 1.2,
            frequency_penalty: -0.3,
            temperature: 0.6,
            top_k: 300,
            top_p: 0.95,
            typical_p: 0.9,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.7,
            top_k: 5,
            top_p: 0.5,
            ..Default::default()
        },
    ];
    // The full vocabulary with a wide spread exercises top-p's candidate pre-filter.
    for (seed, vocab, spread) in [
        (100, 2000, 6.0),
        (101, 2000, 6.0),
        (102, 2000, 6.0),
        (103, 49152, 25.0),
    ] {
        let raw = logits(seed, vocab, spread, 0.0);
        for p in &combos {
            let want = reference(p, &history, &raw);
            let mut scratch = Scratch::new();
            let got = processed_logprobs(p, &TokenCounts::from_ids(&history), &raw, &mut scratch)
                .unwrap();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                if w == f64::NEG_INFINITY {
                    assert_eq!(g, NEG_INF, "{p:?} token {i}");
                } else {
                    assert!(
                        (f64::from(g) - w).abs() < 1e-4,
                        "{p:?} token {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn processed_distribution_sums_to_one_over_its_support() {
    let combos = [
        SamplingParams {
            temperature: 0.5,
            ..Default::default()
        },
        SamplingParams {
            temperature: 3.0,
            top_k: 1000,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.3,
            ..Default::default()
        },
        SamplingParams {
            typical_p: 0.2,
            temperature: 0.9,
            ..Default::default()
        },
        SamplingParams {
            top_k: 1,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 1.5,
            frequency_penalty: 2.0,
            top_p: 0.99,
            ..Default::default()
        },
    ];
    let history: Vec<u32> = (0..500).map(|i| (i * 37) % 49152).collect();
    let raw = logits(42, 49152, 15.0, 0.0);
    for p in &combos {
        let mut scratch = Scratch::new();
        let got =
            processed_logprobs(p, &TokenCounts::from_ids(&history), &raw, &mut scratch).unwrap();
        let support = got.iter().filter(|&&l| l > NEG_INF).count();
        assert!(support >= 1);
        let total: f64 = got.iter().map(|&l| f64::from(l).exp()).sum();
        assert!(
            (total - 1.0).abs() < 1e-4,
            "{p:?}: sum {total} over {support} tokens"
        );
        assert!(got.iter().all(|l| !l.is_nan()));
    }
}

#[test]
fn no_processor_means_no_processed_vector() {
    let mut scratch = Scratch::new();
    let p = SamplingParams {
        do_sample: true,
        seed: 9,
        ..Default::default()
    };
    assert!(
        processed_logprobs(&p, &TokenCounts::from_ids(&[1]), &[1.0, 2.0], &mut scratch).is_none()
    );
}
