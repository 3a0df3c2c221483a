use super::*;
use crate::sampling::test_util::logits;

fn sampler(params: SamplingParams, prompt: &[u32]) -> Sampler {
    Sampler::new(params, prompt).unwrap()
}

fn sampling(seed: u64) -> SamplingParams {
    SamplingParams {
        do_sample: true,
        seed,
        ..Default::default()
    }
}

/// Tokens of `steps` steps over a fixed sequence of rows, pushing each choice.
fn run(params: SamplingParams, steps: usize) -> Vec<u32> {
    let mut s = sampler(params, &[1, 2, 3]);
    let mut scratch = Scratch::new();
    (0..steps)
        .map(|step| {
            let row = logits(1000 + step as u64, 500, 3.0, 0.0);
            let t = s.next_token(&row, &mut scratch).unwrap().token;
            s.push(t);
            t
        })
        .collect()
}

#[test]
fn greedy_without_processors_is_the_raw_argmax_and_copies_nothing() {
    let mut s = sampler(SamplingParams::default(), &[]);
    let mut scratch = Scratch::new();
    let c = s.next_token(&[0.5, 2.0, -1.0, 2.0], &mut scratch).unwrap();
    assert_eq!(
        c,
        Choice {
            token: 1,
            processed_logprobs: None
        }
    );
    assert!(scratch.values.is_empty());
    let c = s
        .next_token(&[f32::NAN, -3.0, f32::NEG_INFINITY], &mut scratch)
        .unwrap();
    assert_eq!(c.token, 1);
}

#[test]
fn greedy_with_processors_is_the_argmax_of_the_processed_logits() {
    // Typical-p with a small mass drops the most likely token (see the processors' tests).
    let raw: Vec<f32> = [0.5f64, 0.3, 0.15, 0.05]
        .iter()
        .map(|p| p.ln() as f32)
        .collect();
    let params = SamplingParams {
        typical_p: 0.2,
        ..Default::default()
    };
    let mut s = sampler(params, &[]);
    let mut scratch = Scratch::new();
    let c = s.next_token(&raw, &mut scratch).unwrap();
    assert_eq!(c.token, 1);
    let lp = c.processed_logprobs.unwrap();
    assert_eq!(lp[1], 0.0);
    assert!(lp
        .iter()
        .enumerate()
        .all(|(i, &l)| i == 1 || l == f32::NEG_INFINITY));

    // Temperature alone keeps the argmax, ties to the smaller id.
    let params = SamplingParams {
        temperature: 0.5,
        ..Default::default()
    };
    let mut s = sampler(params, &[]);
    let c = s.next_token(&[1.0, 3.0, 3.0], &mut scratch).unwrap();
    assert_eq!(c.token, 1);
    assert!(c.processed_logprobs.is_some());
}

#[test]
fn pushed_tokens_feed_the_penalties() {
    let params = SamplingParams {
        repetition_penalty: 4.0,
        ..Default::default()
    };
    let mut s = sampler(params, &[]);
    let mut scratch = Scratch::new();
    let row = [2.0, 1.0];
    assert_eq!(s.next_token(&row, &mut scratch).unwrap().token, 0);
    s.push(0);
    // 2.0 / 4 = 0.5 < 1.0.
    assert_eq!(s.next_token(&row, &mut scratch).unwrap().token, 1);
    assert_eq!(s.history().count(0), 1);
    // The prompt counts too.
    let mut s = sampler(params, &[0]);
    assert_eq!(s.next_token(&row, &mut scratch).unwrap().token, 1);
}

#[test]
fn same_seed_same_tokens_different_seed_different_tokens() {
    for params in [
        sampling(7),
        SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            repetition_penalty: 1.1,
            ..sampling(7)
        },
    ] {
        let a = run(params, 200);
        assert_eq!(a, run(params, 200));
        let b = run(SamplingParams { seed: 8, ..params }, 200);
        assert_ne!(a, b);
    }
}

#[test]
fn seed_stream_is_pinned() {
    // Guards the contract that a seed replays the same tokens across releases: a change
    // here (rand_chacha, seeding, the uniform conversion or the walk) breaks replays.
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let u: Vec<f64> = (0..3).map(|_| uniform(&mut rng)).collect();
    assert_eq!(u, PINNED_UNIFORMS);
    assert_eq!(run(sampling(42), 12), PINNED_TOKENS);
}

const PINNED_UNIFORMS: [f64; 3] = [0.6818961923066714, 0.950275407672484, 0.4275164028565197];
const PINNED_TOKENS: [u32; 12] = [348, 479, 230, 314, 152, 81, 153, 402, 362, 146, 252, 456];

#[test]
fn draw_frequencies_match_probabilities() {
    let probs = [0.5f64, 0.3, 0.15, 0.05, 0.0];
    let row: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let mut s = sampler(sampling(12345), &[]);
    let mut scratch = Scratch::new();
    let n = 20_000;
    let mut counts = [0usize; 5];
    for _ in 0..n {
        counts[s.next_token(&row, &mut scratch).unwrap().token as usize] += 1;
    }
    for (i, (&c, &p)) in counts.iter().zip(&probs).enumerate() {
        let f = c as f64 / n as f64;
        // Five standard deviations of a binomial proportion at most 0.0177.
        assert!((f - p).abs() < 0.018, "token {i}: {f} vs {p}");
    }
    assert_eq!(counts[4], 0);
}

#[test]
fn processed_draws_respect_the_support() {
    let params = SamplingParams {
        top_k: 2,
        ..sampling(3)
    };
    let mut s = sampler(params, &[]);
    let mut scratch = Scratch::new();
    let row = [1.0, 0.9, 5.0, 4.5, 0.0];
    let mut seen = [0usize; 5];
    for _ in 0..2000 {
        seen[s.next_token(&row, &mut scratch).unwrap().token as usize] += 1;
    }
    assert_eq!(seen[0] + seen[1] + seen[4], 0);
    assert!(seen[2] > seen[3] && seen[3] > 0);
}

#[test]
fn draw_walks_ids_in_order_and_skips_zero_weights() {
    let row = [f32::NEG_INFINITY, 0.0, f32::NAN, 0.0, f32::NEG_INFINITY];
    let w = &mut Vec::new();
    assert_eq!(draw(&row, 0.0, w), Some(1));
    assert_eq!(draw(&row, 0.4999, w), Some(1));
    assert_eq!(draw(&row, 0.5, w), Some(3));
    assert_eq!(draw(&row, 1.0 - f64::EPSILON, w), Some(3));
    assert_eq!(draw(&[f32::NEG_INFINITY; 3], 0.3, w), None);
    assert_eq!(draw(&[], 0.3, w), None);
}

#[test]
fn uniform_is_in_the_unit_interval() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for _ in 0..10_000 {
        let u = uniform(&mut rng);
        assert!((0.0..1.0).contains(&u));
    }
}

#[test]
fn broken_rows_are_errors_not_tokens() {
    let mut scratch = Scratch::new();
    for params in [
        SamplingParams::default(),
        sampling(1),
        SamplingParams {
            top_k: 2,
            ..sampling(1)
        },
    ] {
        let mut s = sampler(params, &[]);
        assert_eq!(s.next_token(&[], &mut scratch), Err(SampleError::EmptyRow));
        assert_eq!(
            s.next_token(&[f32::NEG_INFINITY, f32::NAN], &mut scratch),
            Err(SampleError::NoSupport)
        );
        assert_eq!(
            s.next_token(&[1.0, f32::INFINITY], &mut scratch),
            Err(SampleError::NoSupport)
        );
    }
}

#[test]
fn invalid_params_are_rejected() {
    let params = SamplingParams {
        top_p: 0.0,
        ..Default::default()
    };
    assert_eq!(
        Sampler::new(params, &[]).unwrap_err(),
        ParamsError::TopP(0.0)
    );
}
