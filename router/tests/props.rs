//! Property tests: arbitrary bodies (JSON shaped like each API's requests, any JSON value,
//! any bytes) go through the real app (extractor, validation, tokenizer) over the fake
//! backend. Nothing panics; every answer is a 200 whose scheduled requests are within the
//! limits, or a 4xx in the error envelope whose sentence says what was wrong.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use common::*;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value};
use sonde_router::infer::Sampling;

const CASES: u32 = 256;

const TGI_KEYS: &[&str] = &[
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "truncate",
    "return_full_text",
    "details",
    "decoder_input_details",
    "top_n_tokens",
    "best_of",
    "logprobs_mode",
    "return_logits",
    "logprob_token_ids",
    "watermark",
    "grammar",
    "adapter_id",
];
const OPENAI_KEYS: &[&str] = &[
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "echo",
    "best_of",
    "model",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "user",
    "suffix",
    "response_format",
    "tools",
    "tool_choice",
];
const SCORE_KEYS: &[&str] = &[
    "query",
    "items",
    "label_token_ids",
    "apply_softmax",
    "item_first",
    "model",
];
const TOKENIZE_KEYS: &[&str] = &["inputs", "prompt", "add_special_tokens", "tokens", "model"];
const ROLES: &[&str] = &["system", "user", "assistant", "tool", "robot", ""];
/// What a 4xx may be, and the words its sentence must hold.
const ERROR_TYPES: &[&str] = &[
    "validation",
    "malformed_json",
    "unsupported_media_type",
    "payload_too_large",
    "response_too_large",
];

/// Numbers near the limits (and far past them), short text with control characters and
/// non-ASCII, booleans and nulls.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..1200).prop_map(Value::from),
        select(vec![
            i64::MIN,
            -1,
            0,
            1,
            2,
            5,
            6,
            8,
            9,
            1000,
            1101,
            u32::MAX as i64 + 1,
            i64::MAX
        ])
        .prop_map(Value::from),
        select(vec![
            -1.0, 0.0, 1e-300, 1e-9, 0.5, 0.99, 1.0, 1.5, 2.0, 2.5, 1e300, -1e300
        ])
        .prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        "[\\x00-\\x1f a-z\\u{e9}\\u{1F600}]{0,8}".prop_map(Value::from),
        select(vec!["raw", "processed", "length", "\u{0}"]).prop_map(Value::from),
    ]
}

/// Any JSON value a few levels deep.
fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{0,8}", inner, 0..4).prop_map(object),
        ]
    })
}

fn object(m: BTreeMap<String, Value>) -> Value {
    Value::Object(m.into_iter().collect::<Map<_, _>>())
}

/// A value for a known field: mostly leaves, lists of them, sometimes anything.
fn field_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => leaf(),
        2 => prop::collection::vec(leaf(), 0..10).prop_map(Value::Array),
        1 => value(),
    ]
}

/// An object over mostly known keys (and now and then an unknown one).
fn fields(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let key = prop_oneof![9 => select(keys).prop_map(str::to_string), 1 => "[a-z]{1,6}"];
    prop::collection::btree_map(key, field_value(), 0..6).prop_map(object)
}

fn prose() -> impl Strategy<Value = Value> {
    prop_oneof![8 => "\\PC{0,40}".prop_map(Value::from), 1 => field_value()]
}

fn with(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}

fn tgi_body() -> impl Strategy<Value = Value> {
    (prose(), fields(TGI_KEYS), prop::option::of(any::<bool>())).prop_map(
        |(inputs, params, stream)| {
            let mut body = serde_json::json!({"inputs": inputs, "parameters": params});
            if let Some(s) = stream {
                body["stream"] = Value::from(s);
            }
            body
        },
    )
}

fn completion_body() -> impl Strategy<Value = Value> {
    (prose(), fields(OPENAI_KEYS))
        .prop_map(|(prompt, f)| with(serde_json::json!({"prompt": prompt}), f))
}

fn chat_body() -> impl Strategy<Value = Value> {
    let message = prop_oneof![
        8 => (select(ROLES), prose()).prop_map(|(role, content)| serde_json::json!({"role": role, "content": content})),
        1 => value(),
    ];
    (prop::collection::vec(message, 0..4), fields(OPENAI_KEYS))
        .prop_map(|(messages, f)| with(serde_json::json!({"messages": messages}), f))
}

fn vertex_body() -> impl Strategy<Value = Value> {
    let instance = prop_oneof![tgi_body(), completion_body(), chat_body(), value()];
    (
        prop::collection::vec(instance, 0..6),
        prop::option::of(fields(TGI_KEYS)),
    )
        .prop_map(|(instances, parameters)| {
            let mut body = serde_json::json!({"instances": instances});
            if let Some(p) = parameters {
                body["parameters"] = p;
            }
            body
        })
}

/// Sends `bytes` as JSON to `path` and checks the answer; the scheduled requests must be
/// within the limits.
fn check(
    app: &Router,
    fake: &FakeBackend,
    path: &str,
    bytes: Vec<u8>,
) -> Result<(), TestCaseError> {
    fake.requests.lock().expect("lock").clear();
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(bytes))
        .expect("request");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (status, body) = rt.block_on(async {
        let response = send(app, request).await;
        (response.status(), text(response).await)
    });
    if status == StatusCode::OK {
        for r in fake.requests() {
            check_within_limits(&r)?;
        }
        return Ok(());
    }
    prop_assert!(status.is_client_error(), "{path}: {status} {body}");
    let json: Value =
        serde_json::from_str(&body).map_err(|e| TestCaseError::fail(format!("{e}: {body}")))?;
    let (error, error_type) = (
        json["error"].as_str().unwrap_or(""),
        json["error_type"].as_str().unwrap_or(""),
    );
    prop_assert!(ERROR_TYPES.contains(&error_type), "{path}: {status} {body}");
    if error_type == "validation" {
        prop_assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    }
    prop_assert!(
        names_what_is_wrong(error),
        "{path}: the sentence names no field: {body}"
    );
    for phrase in LIBRARY_PHRASES {
        prop_assert!(
            !error.contains(phrase),
            "{path}: the JSON library's words ({phrase:?}): {body}"
        );
    }
    Ok(())
}

/// serde's and serde_json's phrasing, which a message must say in the API's words instead.
const LIBRARY_PHRASES: &[&str] = &[
    "untagged enum",
    "any variant",
    "unknown variant",
    "at line",
    " column ",
    "invalid type:",
    "invalid value:",
    "expected struct",
    "a sequence",
    "missing field",
];

/// A validation sentence quotes a field (`max_new_tokens`, `instances[1]`) or starts with
/// a path (`instances[1]: …`); the others say what about the body is wrong.
fn names_what_is_wrong(error: &str) -> bool {
    let quoted = error.contains('`');
    let path = error.split_once(": ").is_some_and(|(p, _)| {
        !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || "_.[]".contains(c))
    });
    let body = error.contains("body") || error.contains("JSON");
    quoted || path || body
}

fn check_within_limits(r: &sonde_router::infer::ValidRequest) -> Result<(), TestCaseError> {
    let l = limits();
    let n = r.input_ids.len() as u32;
    prop_assert!(n >= 1 && n <= l.max_input_tokens, "{r:?}");
    prop_assert!(n + r.max_new_tokens <= l.max_total_tokens, "{r:?}");
    prop_assert!(r.max_new_tokens > 0 || r.scores.prefill_logprobs, "{r:?}");
    prop_assert!(r.scores.top_n_tokens <= l.max_top_n_tokens, "{r:?}");
    prop_assert!(
        r.scores.label_ids.len() as u32 <= l.max_label_tokens,
        "{r:?}"
    );
    prop_assert!(
        r.scores.label_ids.iter().all(|&id| id < l.vocab_size),
        "{r:?}"
    );
    prop_assert!(
        r.repetition_penalty
            .is_none_or(|x| x.is_finite() && x > 0.0),
        "{r:?}"
    );
    prop_assert!(r.frequency_penalty.is_none_or(f32::is_finite), "{r:?}");
    if let Sampling::Sample {
        temperature,
        top_k,
        top_p,
        typical_p,
        ..
    } = &r.sampling
    {
        prop_assert!(temperature.is_finite() && *temperature > 0.0, "{r:?}");
        prop_assert!(top_k.is_none_or(|k| k > 0), "{r:?}");
        for p in [top_p, typical_p].into_iter().flatten() {
            prop_assert!(*p > 0.0 && *p <= 1.0, "{r:?}");
        }
    }
    Ok(())
}

fn setup() -> (Router, FakeBackend) {
    let fake = FakeBackend::default();
    (app(&fake), fake)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn tgi_bodies(body in tgi_body(), path in select(vec!["/generate", "/generate_stream", "/", "/invoke/generate"])) {
        let (app, fake) = setup();
        check(&app, &fake, path, body.to_string().into_bytes())?;
    }

    #[test]
    fn openai_bodies(completion in completion_body(), chat in chat_body()) {
        let (app, fake) = setup();
        check(&app, &fake, "/v1/completions", completion.to_string().into_bytes())?;
        check(&app, &fake, "/v1/chat/completions", chat.to_string().into_bytes())?;
    }

    #[test]
    fn scoring_and_tokenizer_bodies(score in fields(SCORE_KEYS), tokens in fields(TOKENIZE_KEYS),
                                    path in select(vec!["/tokenize", "/detokenize"])) {
        let (app, fake) = setup();
        check(&app, &fake, "/v1/score", score.to_string().into_bytes())?;
        check(&app, &fake, path, tokens.to_string().into_bytes())?;
    }

    #[test]
    fn vertex_bodies(body in vertex_body(), path in select(vec!["/predict", "/vertex"])) {
        let (app, fake) = setup();
        check(&app, &fake, path, body.to_string().into_bytes())?;
    }

    #[test]
    fn any_json_and_any_bytes(v in value(), bytes in prop::collection::vec(any::<u8>(), 0..64),
                              path in select(vec!["/generate", "/v1/completions", "/v1/chat/completions", "/predict", "/tokenize", "/detokenize", "/v1/score"])) {
        let (app, fake) = setup();
        check(&app, &fake, path, v.to_string().into_bytes())?;
        check(&app, &fake, path, bytes)?;
    }
}
