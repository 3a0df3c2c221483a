//! The rules of `check_parameters` / `validate_ids` at their boundaries, with the real
//! SmolLM2 tokenizer behind the validator (its vocabulary size bounds label ids).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::*;

fn data_dir() -> PathBuf {
    std::env::var_os("SONDE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../data")))
}

fn tokenizer() -> Arc<ModelTokenizer> {
    static TOKENIZER: OnceLock<Arc<ModelTokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = data_dir().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
            Arc::new(ModelTokenizer::from_gguf_file(&path).expect("SmolLM2 tokenizer"))
        })
        .clone()
}

const MAX_INPUT: u32 = 100;
const MAX_TOTAL: u32 = 128;
// Larger than the room a 100-token prompt leaves (28), so the cap is observable.
const DEFAULT_NEW: u32 = 64;

fn limits() -> ValidationLimits {
    ValidationLimits {
        max_input_tokens: MAX_INPUT,
        max_total_tokens: MAX_TOTAL,
        max_top_n_tokens: 5,
        max_best_of: 2,
        max_stop_sequences: 4,
        max_label_tokens: 8,
        enable_prefill_logprobs: true,
        default_logprobs_mode: LogprobsMode::Raw,
        default_max_new_tokens: DEFAULT_NEW,
        vocab_size: tokenizer().vocab_size() as u32,
        max_batch_total_tokens: u32::MAX,
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

fn ok_with(p: GenerateParameters) -> ValidGenerate {
    validator_with(limits()).validate_ids(ids(10), &p).unwrap()
}

/// The 422 sentence, so each test can check it names the field and the limit.
fn rejected(result: Result<ValidGenerate, ApiError>) -> String {
    match result {
        Err(ApiError::Validation(message)) => message,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

fn err_with(p: GenerateParameters) -> String {
    rejected(validator_with(limits()).validate_ids(ids(10), &p))
}

#[test]
fn max_new_tokens_zero_is_only_for_pure_scoring() {
    let zero = GenerateParameters {
        max_new_tokens: Some(0),
        ..Default::default()
    };
    assert!(err_with(zero.clone()).contains("`max_new_tokens` is 0"));
    let scoring = ok_with(GenerateParameters {
        decoder_input_details: true,
        ..zero
    });
    assert_eq!(scoring.request.max_new_tokens, 0);
    assert!(scoring.request.scores.prefill_logprobs);
}

#[test]
fn max_new_tokens_range() {
    for bad in [-1, MAX_TOTAL as i64 + 1] {
        let e = err_with(GenerateParameters {
            max_new_tokens: Some(bad),
            ..Default::default()
        });
        assert!(
            e.contains("`max_new_tokens`") && e.contains(&bad.to_string()),
            "{e}"
        );
    }
}

#[test]
fn prompt_plus_new_tokens_within_total_names_both_numbers() {
    let v = validator_with(limits());
    let fits = GenerateParameters {
        max_new_tokens: Some(118),
        ..Default::default()
    };
    assert_eq!(
        v.validate_ids(ids(10), &fits)
            .unwrap()
            .request
            .max_new_tokens,
        118
    );
    let over = GenerateParameters {
        max_new_tokens: Some(119),
        ..Default::default()
    };
    let e = rejected(v.validate_ids(ids(10), &over));
    assert!(
        e.contains("Given: 10") && e.contains("119") && e.contains("128"),
        "{e}"
    );
}

#[test]
fn prompt_length_limits() {
    let v = validator_with(limits());
    assert!(rejected(v.validate_ids(vec![], &params())).contains("must not be empty"));
    assert!(v.validate_ids(ids(MAX_INPUT), &params()).is_ok());
    let e = rejected(v.validate_ids(ids(MAX_INPUT + 1), &params()));
    assert!(e.contains("--max-input-tokens") && e.contains("101"), "{e}");
}

#[test]
fn temperature_must_be_finite_and_positive() {
    for t in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = err_with(GenerateParameters {
            temperature: Some(t),
            ..params()
        });
        assert!(e.contains("`temperature`"), "{t}: {e}");
    }
    assert!(matches!(
        ok_with(GenerateParameters { temperature: Some(0.01), ..params() }).request.sampling,
        Sampling::Sample { temperature, .. } if (temperature - 0.01).abs() < 1e-6
    ));
}

#[test]
fn top_p_one_is_off_and_above_one_is_refused() {
    let off = ok_with(GenerateParameters {
        top_p: Some(1.0),
        typical_p: Some(1.0),
        ..params()
    });
    assert_eq!(off.request.sampling, Sampling::Greedy);
    for (name, p) in [
        (
            "top_p",
            GenerateParameters {
                top_p: Some(1.5),
                ..params()
            },
        ),
        (
            "top_p",
            GenerateParameters {
                top_p: Some(0.0),
                ..params()
            },
        ),
        (
            "typical_p",
            GenerateParameters {
                typical_p: Some(1.5),
                ..params()
            },
        ),
    ] {
        assert!(err_with(p).contains(&format!("`{name}`")));
    }
}

#[test]
fn top_k_and_penalties() {
    assert!(err_with(GenerateParameters {
        top_k: Some(0),
        ..params()
    })
    .contains("`top_k`"));
    assert!(err_with(GenerateParameters {
        repetition_penalty: Some(0.0),
        ..params()
    })
    .contains("`repetition_penalty`"));
    for x in [2.1, -2.1] {
        let e = err_with(GenerateParameters {
            frequency_penalty: Some(x),
            ..params()
        });
        assert!(
            e.contains("`frequency_penalty`") && e.contains(&x.to_string()),
            "{e}"
        );
    }
    let edge = ok_with(GenerateParameters {
        frequency_penalty: Some(-2.0),
        ..params()
    });
    assert_eq!(edge.request.frequency_penalty, Some(-2.0));
    // 0 is "no penalty": the shard must not be asked to apply one.
    let zero = ok_with(GenerateParameters {
        frequency_penalty: Some(0.0),
        ..params()
    });
    assert_eq!(zero.request.frequency_penalty, None);
}

#[test]
fn stop_sequences() {
    let stop = |v: Vec<String>| GenerateParameters {
        stop: v,
        ..params()
    };
    let four: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
    assert_eq!(ok_with(stop(four.clone())).stop, four);
    let mut five = four;
    five.push("s4".into());
    assert!(err_with(stop(five)).contains("--max-stop-sequences"));
    assert!(err_with(stop(vec!["a".into(), String::new()])).contains("`stop[1]` must not be empty"));
    let longest = "x".repeat(MAX_STOP_SEQUENCE_BYTES);
    assert!(ok_with(stop(vec![longest.clone()])).stop.len() == 1);
    let e = err_with(stop(vec![format!("{longest}x")]));
    assert!(e.contains("`stop[0]`") && e.contains("1025"), "{e}");
}

#[test]
fn truncate_keeps_the_last_tokens() {
    let v = validator_with(limits());
    let p = GenerateParameters {
        truncate: Some(3),
        ..params()
    };
    assert_eq!(
        v.validate_ids(ids(10), &p).unwrap().request.input_ids,
        vec![8, 9, 10]
    );
    // A truncated prompt is measured after truncation, so a long one is accepted.
    assert_eq!(
        v.validate_ids(ids(500), &p).unwrap().request.input_ids,
        vec![498, 499, 500]
    );
    for bad in [0, MAX_INPUT as i64 + 1] {
        assert!(err_with(GenerateParameters {
            truncate: Some(bad),
            ..params()
        })
        .contains("`truncate`"));
    }
}

#[test]
fn top_n_tokens_limit() {
    let five = ok_with(GenerateParameters {
        top_n_tokens: Some(5),
        ..params()
    });
    assert_eq!(five.request.scores.top_n, 5);
    let e = err_with(GenerateParameters {
        top_n_tokens: Some(6),
        ..params()
    });
    assert!(e.contains("--max-top-n-tokens") && e.contains('6'), "{e}");
}

#[test]
fn best_of_needs_sampling_and_no_seed() {
    let best = |p: GenerateParameters| GenerateParameters {
        best_of: Some(2),
        ..p
    };
    assert!(err_with(best(params())).contains("needs sampling"));
    let sampled = GenerateParameters {
        do_sample: true,
        ..params()
    };
    assert!(err_with(best(GenerateParameters {
        seed: Some(1),
        ..sampled.clone()
    }))
    .contains("`seed`"));
    assert_eq!(ok_with(best(sampled.clone())).best_of, 2);
    let three = GenerateParameters {
        best_of: Some(3),
        ..sampled
    };
    assert!(err_with(three).contains("--max-best-of"));
}

#[test]
fn prompt_logprobs_need_the_flag() {
    let v = validator_with(ValidationLimits {
        enable_prefill_logprobs: false,
        ..limits()
    });
    let p = GenerateParameters {
        decoder_input_details: true,
        ..params()
    };
    assert!(rejected(v.validate_ids(ids(3), &p)).contains("--enable-prefill-logprobs"));
}

#[test]
fn label_ids_must_be_in_the_vocabulary() {
    let vocab = tokenizer().vocab_size() as i64;
    let labels = |v: Vec<i64>| GenerateParameters {
        logprob_token_ids: v,
        ..params()
    };
    let last = ok_with(labels(vec![0, vocab - 1]));
    assert_eq!(last.request.scores.label_ids, vec![0, vocab as u32 - 1]);
    for bad in [vocab, -1] {
        let e = err_with(labels(vec![5, bad]));
        assert!(
            e.contains(&bad.to_string()) && e.contains("outside the vocabulary"),
            "{e}"
        );
    }
    assert!(err_with(labels((0..9).collect())).contains("at most 8 ids"));
}

#[test]
fn default_max_new_tokens_is_capped_by_the_room_left() {
    let v = validator_with(limits());
    let none = GenerateParameters::default();
    assert_eq!(
        v.validate_ids(ids(10), &none)
            .unwrap()
            .request
            .max_new_tokens,
        DEFAULT_NEW
    );
    let capped = v.validate_ids(ids(MAX_INPUT), &none).unwrap();
    assert_eq!(capped.request.max_new_tokens, MAX_TOTAL - MAX_INPUT);
}

/// A request that sets no `max_new_tokens` should not be refused for the default the
/// server picked: the default ought to be capped by the KV budget as it is by the context.
#[test]
#[ignore = "bug: default max_new_tokens ignores max_batch_total_tokens (see report)"]
fn default_max_new_tokens_fits_the_kv_budget() {
    let v = validator_with(ValidationLimits {
        max_batch_total_tokens: 40,
        ..limits()
    });
    let valid = v
        .validate_ids(ids(10), &GenerateParameters::default())
        .unwrap();
    assert_eq!(valid.request.max_new_tokens, 30);
}

#[test]
fn sampling_turns_on_only_for_sampling_parameters() {
    let greedy = [
        params(),
        GenerateParameters {
            temperature: Some(1.0),
            ..params()
        },
        GenerateParameters {
            top_p: Some(1.0),
            typical_p: Some(1.0),
            ..params()
        },
    ];
    for p in greedy {
        assert_eq!(sampling(&p), Sampling::Greedy, "{p:?}");
    }
    let sampled = [
        GenerateParameters {
            do_sample: true,
            ..params()
        },
        GenerateParameters {
            temperature: Some(0.7),
            ..params()
        },
        GenerateParameters {
            top_k: Some(5),
            ..params()
        },
        GenerateParameters {
            top_p: Some(0.9),
            ..params()
        },
        GenerateParameters {
            typical_p: Some(0.9),
            ..params()
        },
    ];
    for p in sampled {
        assert!(matches!(sampling(&p), Sampling::Sample { .. }), "{p:?}");
    }
    let full = sampling(&GenerateParameters {
        top_k: Some(5),
        top_p: Some(0.9),
        seed: Some(42),
        ..params()
    });
    assert_eq!(
        full,
        Sampling::Sample {
            temperature: 1.0,
            top_k: Some(5),
            top_p: Some(0.9),
            typical_p: None,
            seed: 42
        }
    );
}

#[test]
fn unsupported_fields_are_named() {
    let grammar = GenerateParameters {
        grammar: Some(serde_json::json!({"type": "json"})),
        ..params()
    };
    assert!(err_with(grammar).contains("`grammar`"));
    // TGI clients send `grammar: null` on every call; that must pass.
    assert!(validator_with(limits())
        .validate_ids(
            ids(3),
            &GenerateParameters {
                grammar: Some(serde_json::Value::Null),
                ..params()
            }
        )
        .is_ok());
    assert!(err_with(GenerateParameters {
        adapter_id: Some("a".into()),
        ..params()
    })
    .contains("`adapter_id`"));
}

#[test]
fn scores_and_mode_are_carried() {
    let v = ok_with(GenerateParameters {
        return_logits: true,
        logprobs_mode: Some(LogprobsModeParam::Processed),
        details: true,
        ..params()
    });
    assert!(v.request.scores.return_logits && v.details && v.wants_scores());
    assert_eq!(v.request.scores.mode, LogprobsMode::Processed);
    assert_eq!(ok_with(params()).request.scores.mode, LogprobsMode::Raw);
    assert!(!ok_with(params()).wants_scores());
}

#[tokio::test]
async fn validate_tokenizes_with_special_tokens_as_asked() {
    let v = validator_with(limits());
    let valid = v
        .validate("Hello world".into(), &params(), true)
        .await
        .unwrap();
    assert_eq!(
        valid.request.input_ids,
        tokenizer().encode("Hello world", true).unwrap()
    );
    // A bad parameter is reported before any tokenizing.
    let bad = GenerateParameters {
        top_k: Some(0),
        ..params()
    };
    assert!(rejected(v.validate("x".into(), &bad, true).await).contains("`top_k`"));
}
