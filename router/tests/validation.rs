//! The rules of validation at their boundaries, reached as `/generate` reaches them (TGI
//! parameters through `to_spec`, worded with TGI's names), with the real SmolLM2 tokenizer
//! behind the validator (its vocabulary size bounds label ids).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::tokenizer;
use sonde_proto::LogprobsMode;
use sonde_router::error::ApiError;
use sonde_router::infer::Sampling;
use sonde_router::openai::{ChatNames, CompletionNames};
use sonde_router::request::{Field, GenerationSpec, Prompt, SamplingSpec, SpecError, Violation};
use sonde_router::tgi::convert::TgiNames;
use sonde_router::tgi::types::GenerateParameters;
use sonde_router::validation::*;

const MAX_INPUT: u32 = 100;
const MAX_TOTAL: u32 = 128;
// Larger than the room a 100-token prompt leaves (28), so the cap is observable.
const DEFAULT_NEW: u32 = 64;

/// The HTTP tests' limits, with a short context so its edges are cheap to reach.
fn limits() -> ValidationLimits {
    ValidationLimits {
        max_input_tokens: MAX_INPUT,
        max_total_tokens: MAX_TOTAL,
        default_max_new_tokens: DEFAULT_NEW,
        ..common::limits()
    }
}

fn validator_with(limits: ValidationLimits) -> Validator {
    Validator::new(tokenizer(), limits)
}

/// Ids need not be real tokens: validation only counts and slices them.
fn ids(n: u32) -> Vec<u32> {
    (1..=n).collect()
}

fn params() -> GenerateParameters {
    GenerateParameters {
        max_new_tokens: Some(4),
        ..Default::default()
    }
}

/// `params()` with some fields changed, one case per line.
macro_rules! with {
    ($($field:ident: $value:expr),* $(,)?) => {
        GenerateParameters { $($field: $value,)* ..params() }
    };
}

/// `p` for an already tokenized prompt, as `/generate` would validate it. The prompt path
/// for ids never awaits, so `block_on` is enough.
fn validate_ids(
    v: &Validator,
    ids: Vec<u32>,
    p: &GenerateParameters,
) -> Result<ValidGenerate, ApiError> {
    let spec = p.to_spec(Prompt::Ids(ids.into_iter().map(i64::from).collect()), false)?;
    futures::executor::block_on(v.validate(spec)).map_err(|e| e.in_words(&TgiNames))
}

fn ok_with(p: GenerateParameters) -> ValidGenerate {
    validate_ids(&validator_with(limits()), ids(10), &p).unwrap()
}

/// The 422 sentence, so each test can check it names the field and the limit.
fn rejected(result: Result<ValidGenerate, ApiError>) -> String {
    match result {
        Err(ApiError::Validation(message)) => message,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

fn err_with(p: GenerateParameters) -> String {
    rejected(validate_ids(&validator_with(limits()), ids(10), &p))
}

#[test]
fn max_new_tokens_zero_is_only_for_pure_scoring() {
    assert!(err_with(with!(max_new_tokens: Some(0))).contains("`max_new_tokens` is 0"));
    let scoring = ok_with(with!(max_new_tokens: Some(0), decoder_input_details: true));
    assert_eq!(scoring.request.max_new_tokens, 0);
    assert!(scoring.request.scores.prefill_logprobs);
}

#[test]
fn max_new_tokens_range() {
    for bad in [-1, MAX_TOTAL as i64 + 1] {
        let e = err_with(with!(max_new_tokens: Some(bad)));
        assert!(
            e.contains("`max_new_tokens`") && e.contains(&bad.to_string()),
            "{e}"
        );
    }
}

#[test]
fn prompt_plus_new_tokens_within_total_names_both_numbers() {
    let v = validator_with(limits());
    let fits = validate_ids(&v, ids(10), &with!(max_new_tokens: Some(118)));
    assert_eq!(fits.unwrap().request.max_new_tokens, 118);
    let e = rejected(validate_ids(&v, ids(10), &with!(max_new_tokens: Some(119))));
    assert!(
        e.contains("Given: 10") && e.contains("119") && e.contains("128"),
        "{e}"
    );
}

#[test]
fn prompt_length_limits() {
    let v = validator_with(limits());
    assert!(rejected(validate_ids(&v, vec![], &params())).contains("must not be empty"));
    assert!(validate_ids(&v, ids(MAX_INPUT), &params()).is_ok());
    let e = rejected(validate_ids(&v, ids(MAX_INPUT + 1), &params()));
    assert!(e.contains("--max-input-tokens") && e.contains("101"), "{e}");
}

#[test]
fn the_kv_budget_bounds_a_request() {
    let v = validator_with(ValidationLimits {
        max_batch_total_tokens: 40,
        ..limits()
    });
    assert!(validate_ids(&v, ids(10), &with!(max_new_tokens: Some(30))).is_ok());
    let e = rejected(validate_ids(&v, ids(10), &with!(max_new_tokens: Some(31))));
    assert!(
        e.contains("--max-batch-total-tokens") && e.contains("10 + 31"),
        "{e}"
    );
}

#[test]
fn temperature_must_be_finite_and_positive() {
    // 1e-300 and 1e300 are finite and positive as f64, but 0 and infinity as the shard's f32.
    for t in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-300, 1e300] {
        let e = err_with(with!(temperature: Some(t)));
        assert!(e.contains("`temperature`"), "{t}: {e}");
    }
    assert!(matches!(
        ok_with(with!(temperature: Some(0.01))).request.sampling,
        Sampling::Sample { temperature, .. } if (temperature - 0.01).abs() < 1e-6
    ));
}

#[test]
fn top_p_one_is_off_and_above_one_is_refused() {
    let off = ok_with(with!(top_p: Some(1.0), typical_p: Some(1.0)));
    assert_eq!(off.request.sampling, Sampling::Greedy);
    for (name, p) in [
        ("top_p", with!(top_p: Some(1.5))),
        ("top_p", with!(top_p: Some(0.0))),
        ("typical_p", with!(typical_p: Some(1.5))),
        ("top_p", with!(top_p: Some(1e-300))),
        (
            "repetition_penalty",
            with!(repetition_penalty: Some(1e-300)),
        ),
        ("repetition_penalty", with!(repetition_penalty: Some(1e300))),
    ] {
        assert!(err_with(p).contains(&format!("`{name}`")));
    }
}

#[test]
fn top_k_and_penalties() {
    assert!(err_with(with!(top_k: Some(0))).contains("`top_k`"));
    let e = err_with(with!(repetition_penalty: Some(0.0)));
    assert!(e.contains("`repetition_penalty`"), "{e}");
    for x in [2.1, -2.1] {
        let e = err_with(with!(frequency_penalty: Some(x)));
        assert!(
            e.contains("`frequency_penalty`") && e.contains(&x.to_string()),
            "{e}"
        );
    }
    let edge = ok_with(with!(frequency_penalty: Some(-2.0)));
    assert_eq!(edge.request.frequency_penalty, Some(-2.0));
    // 0 is "no penalty": the shard must not be asked to apply one.
    let zero = ok_with(with!(frequency_penalty: Some(0.0)));
    assert_eq!(zero.request.frequency_penalty, None);
}

#[test]
fn stop_sequences() {
    let four: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
    assert_eq!(ok_with(with!(stop: four.clone())).stop, four);
    let mut five = four;
    five.push("s4".into());
    assert!(err_with(with!(stop: five)).contains("--max-stop-sequences"));
    let e = err_with(with!(stop: vec!["a".into(), String::new()]));
    assert!(e.contains("`stop[1]` must not be empty"), "{e}");
    let longest = "x".repeat(MAX_STOP_SEQUENCE_BYTES);
    assert_eq!(ok_with(with!(stop: vec![longest.clone()])).stop.len(), 1);
    let e = err_with(with!(stop: vec![format!("{longest}x")]));
    assert!(e.contains("`stop[0]`") && e.contains("1025"), "{e}");
}

#[test]
fn truncate_keeps_the_last_tokens() {
    let v = validator_with(limits());
    let p = with!(truncate: Some(3));
    assert_eq!(
        validate_ids(&v, ids(10), &p).unwrap().request.input_ids,
        [8, 9, 10]
    );
    // A prompt is measured after truncation, so a long one is accepted.
    assert_eq!(
        validate_ids(&v, ids(500), &p).unwrap().request.input_ids,
        [498, 499, 500]
    );
    for bad in [0, MAX_INPUT as i64 + 1] {
        assert!(err_with(with!(truncate: Some(bad))).contains("`truncate`"));
    }
}

#[test]
fn top_n_tokens_limit() {
    assert_eq!(
        ok_with(with!(top_n_tokens: Some(5)))
            .request
            .scores
            .top_n_tokens,
        5
    );
    let e = err_with(with!(top_n_tokens: Some(6)));
    assert!(e.contains("--max-top-n-tokens") && e.contains('6'), "{e}");
}

#[test]
fn best_of_needs_sampling_and_no_seed() {
    assert!(err_with(with!(best_of: Some(2))).contains("needs sampling"));
    let seeded = with!(best_of: Some(2), do_sample: true, seed: Some(1));
    assert!(err_with(seeded).contains("`seed`"));
    assert_eq!(
        ok_with(with!(best_of: Some(2), do_sample: true)).generations,
        2
    );
    let three = with!(best_of: Some(3), do_sample: true);
    assert!(err_with(three).contains("--max-best-of"));
}

#[test]
fn prompt_logprobs_need_the_flag() {
    let v = validator_with(ValidationLimits {
        enable_prefill_logprobs: false,
        ..limits()
    });
    let p = with!(decoder_input_details: true);
    assert!(rejected(validate_ids(&v, ids(3), &p)).contains("--enable-prefill-logprobs"));
}

#[test]
fn label_ids_must_be_in_the_vocabulary() {
    let vocab = tokenizer().vocab_size() as i64;
    let last = ok_with(with!(logprob_token_ids: vec![0, vocab - 1]));
    assert_eq!(last.request.scores.label_ids, [0, vocab as u32 - 1]);
    for bad in [vocab, -1] {
        let e = err_with(with!(logprob_token_ids: vec![5, bad]));
        assert!(
            e.contains(&bad.to_string()) && e.contains("outside the vocabulary"),
            "{e}"
        );
    }
    let nine = with!(logprob_token_ids: (0..9).collect());
    assert!(err_with(nine).contains("at most 8 ids"));
}

#[test]
fn default_max_new_tokens_is_capped_by_the_room_left() {
    let v = validator_with(limits());
    let none = GenerateParameters::default();
    let short = validate_ids(&v, ids(10), &none).unwrap();
    assert_eq!(short.request.max_new_tokens, DEFAULT_NEW);
    let capped = validate_ids(&v, ids(MAX_INPUT), &none).unwrap();
    assert_eq!(capped.request.max_new_tokens, MAX_TOTAL - MAX_INPUT);
}

/// A request that sets no `max_new_tokens` is not refused for the default the server
/// picked: the default is capped by the KV budget as it is by the context.
#[test]
fn default_max_new_tokens_fits_the_kv_budget() {
    let v = validator_with(ValidationLimits {
        max_batch_total_tokens: 40,
        ..limits()
    });
    let valid = validate_ids(&v, ids(10), &GenerateParameters::default());
    assert_eq!(valid.unwrap().request.max_new_tokens, 30);
}

fn sampling(p: &GenerateParameters) -> Sampling {
    p.to_spec(Prompt::Ids(vec![1]), false)
        .unwrap()
        .sampling
        .resolve()
}

#[test]
fn sampling_turns_on_only_for_sampling_parameters() {
    let greedy = [
        params(),
        with!(temperature: Some(1.0)),
        with!(top_p: Some(1.0), typical_p: Some(1.0)),
    ];
    for p in greedy {
        assert_eq!(sampling(&p), Sampling::Greedy, "{p:?}");
    }
    let sampled = [
        with!(do_sample: true),
        with!(temperature: Some(0.7)),
        with!(top_k: Some(5)),
        with!(top_p: Some(0.9)),
        with!(typical_p: Some(0.9)),
    ];
    for p in sampled {
        assert!(matches!(sampling(&p), Sampling::Sample { .. }), "{p:?}");
    }
    let full = sampling(&with!(top_k: Some(5), top_p: Some(0.9), seed: Some(42)));
    let want = Sampling::Sample {
        temperature: 1.0,
        top_k: Some(5),
        top_p: Some(0.9),
        typical_p: None,
        seed: 42,
    };
    assert_eq!(full, want);
}

#[test]
fn unsupported_fields_are_named() {
    let grammar = with!(grammar: Some(serde_json::json!({"type": "json"})));
    assert!(err_with(grammar).contains("`grammar`"));
    // TGI clients send `grammar: null` on every call; that must pass.
    ok_with(with!(grammar: Some(serde_json::Value::Null)));
    assert!(err_with(with!(adapter_id: Some("a".into()))).contains("`adapter_id`"));
}

#[test]
fn scores_and_mode_are_carried() {
    let processed = Some(LogprobsMode::Processed);
    let p = with!(return_logits: true, logprobs_mode: processed, details: true);
    assert!(p.wants_scores());
    let v = ok_with(p);
    assert!(v.request.scores.return_logits);
    assert_eq!(v.request.scores.mode, LogprobsMode::Processed);
    assert_eq!(ok_with(params()).request.scores.mode, LogprobsMode::Raw);
    assert!(!params().wants_scores());
}

#[tokio::test]
async fn validate_tokenizes_with_special_tokens_as_asked() {
    let v = validator_with(limits());
    for add_special_tokens in [true, false] {
        let text = "Hello world".to_string();
        let spec = params().to_spec(
            Prompt::Text {
                text,
                add_special_tokens,
            },
            false,
        );
        let valid = v.validate(spec.unwrap()).await.unwrap();
        let want = tokenizer()
            .encode("Hello world", add_special_tokens)
            .unwrap();
        assert_eq!(valid.request.input_ids, want);
    }
    // A bad parameter is reported before any tokenizing: this text would not tokenize
    // either (it is fine), but the error names `top_k`.
    let spec = with!(top_k: Some(0)).to_spec(
        Prompt::Text {
            text: "x".into(),
            add_special_tokens: true,
        },
        false,
    );
    let e = v.validate(spec.unwrap()).await.unwrap_err();
    assert_eq!(
        e.clone().in_words(&TgiNames).to_string(),
        "`top_k` must be > 0, got 0"
    );
    assert!(matches!(e, SpecError::Invalid(ref v) if v.field() == Field::TopK));
}

/// Token-id prompts (OpenAI's, `/v1/score`'s) are checked against the vocabulary like
/// label ids, and named as the API names its prompt.
#[test]
fn token_id_prompts_must_be_in_the_vocabulary() {
    let v = validator_with(limits());
    let vocab = tokenizer().vocab_size() as i64;
    let spec = |ids: Vec<i64>| GenerationSpec {
        max_new_tokens: Some(1),
        ..GenerationSpec::new(Prompt::Ids(ids))
    };
    let ok = futures::executor::block_on(v.validate(spec(vec![0, vocab - 1]))).unwrap();
    assert_eq!(ok.request.input_ids, [0, vocab as u32 - 1]);
    for bad in [-1, vocab, i64::MAX] {
        let e = futures::executor::block_on(v.validate(spec(vec![3, bad]))).unwrap_err();
        let words = e.in_words(&CompletionNames).to_string();
        assert_eq!(
            words,
            format!("`prompt` holds {bad}, outside the vocabulary (0..{vocab})")
        );
    }
}

/// The same violation reads in each API's own names, with hints only about fields that
/// API has.
#[test]
fn each_api_words_a_violation_with_its_own_names() {
    let long = Violation::PromptTooLong { max: 100, got: 101 };
    assert_eq!(
        long.sentence(&TgiNames),
        "`inputs` must have at most 100 tokens (--max-input-tokens). Given: 101; `truncate` keeps the last N"
    );
    assert_eq!(
        long.sentence(&ChatNames),
        "`messages` must have at most 100 tokens (--max-input-tokens). Given: 101"
    );
    let total = Violation::OverTotalTokens {
        max: 128,
        prompt: 10,
        new: 119,
    };
    assert_eq!(
        total.sentence(&CompletionNames),
        "`prompt` tokens + `max_tokens` must be <= 128 (--max-total-tokens). Given: 10 `prompt` tokens and 119 `max_tokens`"
    );
    let top = Violation::IntRange {
        field: Field::TopNTokens,
        min: 0,
        max: 5,
        flag: Some("--max-top-n-tokens"),
        got: 6,
    };
    assert!(top.sentence(&TgiNames).starts_with("`top_n_tokens` must"));
    assert!(top
        .sentence(&CompletionNames)
        .starts_with("`logprobs` must"));
    assert!(top.sentence(&ChatNames).starts_with("`top_logprobs` must"));
    assert!(Violation::NothingToDo
        .sentence(&ChatNames)
        .contains("must be >= 1"));
    assert!(Violation::NothingToDo
        .sentence(&CompletionNames)
        .contains("only with `echo`"));
}

/// The one seeding rule for `best_of` candidates and `n` choices: seed + i.
#[test]
fn generation_i_samples_with_the_seed_plus_i() {
    let spec = GenerationSpec {
        max_new_tokens: Some(1),
        sampling: SamplingSpec {
            do_sample: true,
            seed: Some(u64::MAX),
            ..SamplingSpec::default()
        },
        generations: Some(2),
        ..GenerationSpec::new(Prompt::Ids(vec![1, 2]))
    };
    let v = futures::executor::block_on(validator_with(limits()).validate(spec)).unwrap();
    assert_eq!(v.generations, 2);
    let seeds: Vec<_> = (0..2).map(|i| v.generation(i).sampling.seed()).collect();
    assert_eq!(seeds, [Some(u64::MAX), Some(0)]);
    // Greedy generations are the request itself.
    let greedy = ok_with(params());
    assert_eq!(greedy.generation(3), greedy.request);
}

/// A TGI answer leaves the generated tokens' logprobs out only where it shows none: a
/// plain `/generate` answer (the text), never a stream (every event has its token's
/// logprob), an answer with details or other scores, nor `best_of`, which ranks by them.
#[test]
fn tgi_skips_token_logprobs_only_where_the_answer_shows_none() {
    let skips = |p: GenerateParameters, streamed: bool| {
        p.to_spec(Prompt::Ids(vec![1]), streamed)
            .unwrap()
            .scores
            .skip_token_logprobs
    };
    assert!(skips(params(), false));
    assert!(!skips(params(), true));
    assert!(!skips(with!(details: true), false));
    assert!(!skips(with!(top_n_tokens: Some(2)), false));
    assert!(!skips(with!(return_logits: true), false));
    assert!(!skips(with!(logprob_token_ids: vec![3]), false));
    assert!(!skips(with!(do_sample: true, best_of: Some(2)), false));
}
