//! Every API through the real axum app, in process, over a scripted fake backend.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::*;
use serde_json::{json, Value};
use sonde_router::infer::Sampling;
use sonde_router::state::AppState;
use sonde_tokenizer::ChatInputs;

fn ids_of(v: &Value) -> Vec<u64> {
    let tokens = v.as_array().unwrap().iter();
    tokens.map(|t| t["id"].as_u64().unwrap()).collect()
}

fn script_ids_u64(n: usize) -> Vec<u64> {
    (0..n).map(|i| script_id(i) as u64).collect()
}

#[tokio::test]
async fn not_ready_is_503_healthcheck_until_set_ready() {
    let state = AppState::new(config());
    let app = sonde_router::server::app(state.clone()).unwrap();
    let (s, b) = call(&app, get("/health")).await;
    assert_error(s, &b, StatusCode::SERVICE_UNAVAILABLE, "healthcheck");
    let (s, b) = post_json(&app, "/generate", gen(json!({}))).await;
    assert_error(s, &b, StatusCode::SERVICE_UNAVAILABLE, "healthcheck");
    make_ready(&state, Arc::new(FakeBackend::default()));
    assert_eq!(call(&app, get("/health")).await.0, StatusCode::OK);
    let (s, b) = post_json(&app, "/generate", gen(json!({}))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(call(&app, get("/info")).await.1["model_id"], "smollm2-test");
}

#[tokio::test]
async fn generate_answers_text_and_the_scores_asked_for() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let (s, b) = post_json(&app, "/generate", gen(json!({"max_new_tokens": 3}))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b, json!({"generated_text": script_text(3)}));

    let params = json!({"max_new_tokens": 3, "details": true, "top_n_tokens": 2,
        "decoder_input_details": true, "logprob_token_ids": [42, 7], "return_full_text": true});
    let body = json!({"inputs": "Hi there", "parameters": params});
    let (s, b) = post_json(&app, "/generate", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let prompt = tokenizer().encode("Hi there", true).unwrap();
    assert_eq!(fake.last().input_ids, prompt);
    assert_eq!(b["generated_text"], format!("Hi there{}", script_text(3)));
    let d = &b["details"];
    assert_eq!(d["finish_reason"], "length");
    assert_eq!(d["generated_tokens"], 3);
    assert_eq!(d["input_length"], prompt.len());
    assert_eq!(ids_of(&d["tokens"]), script_ids_u64(3));
    assert_eq!(d["tokens"][0]["logprob"], TOKEN_LOGPROB);
    let labels = &d["tokens"][0]["label_logprobs"];
    assert_eq!(labels[1]["id"], 7);
    assert_eq!(labels[1]["logprob"], LABEL_LOGPROB);
    let tops = d["top_tokens"].as_array().unwrap();
    assert_eq!(tops.len(), 3);
    assert!(tops.iter().all(|t| len(t) == 2));
    assert_eq!(d["top_tokens"][1][0]["id"], script_id(1));
    let prefill = &d["prefill"];
    let prompt_ids: Vec<u64> = prompt.iter().map(|&i| i as u64).collect();
    assert_eq!(ids_of(prefill), prompt_ids);
    assert!(prefill[0]["logprob"].is_null());
    assert_eq!(prefill[1]["logprob"], -1.0);
    assert_eq!(len(&prefill[0]["label_logprobs"]), 2);
}

#[tokio::test]
async fn generate_stream_events_are_numbered_and_the_last_carries_the_text() {
    let app = app(&FakeBackend::default());
    let params = json!({"max_new_tokens": 4, "details": true, "top_n_tokens": 1});
    let events = events(&app, "/generate_stream", gen(params)).await;
    assert_eq!(events.len(), 4);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["index"], i + 1);
        assert_eq!(e["token"]["id"], script_id(i));
        assert_eq!(len(&e["top_tokens"]), 1);
        let last = i == 3;
        assert_eq!(e["generated_text"].is_null(), !last, "{e}");
        assert_eq!(e["details"].is_null(), !last, "{e}");
    }
    assert_eq!(events[3]["generated_text"], script_text(4));
    assert_eq!(events[3]["details"]["finish_reason"], "length");
    assert_eq!(events[3]["details"]["generated_tokens"], 4);
}

#[tokio::test]
async fn compat_route_answers_an_array_or_a_stream() {
    let app = app(&FakeBackend::default());
    let (s, b) = post_json(&app, "/", gen(json!({"max_new_tokens": 2}))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b, json!([{"generated_text": script_text(2)}]));
    let body = json!({"inputs": "Hi", "stream": true, "parameters": {"max_new_tokens": 2}});
    let events = events(&app, "/", body).await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["generated_text"], script_text(2));
}

/// The fake paces its tokens and would need seconds to finish: a stop must end the
/// request (and drop the fake's channel) long before that.
#[tokio::test]
async fn a_stop_sequence_ends_the_generation_and_cancels_it() {
    let fake = FakeBackend::paced(25);
    let app = app(&fake);
    let params = json!({"max_new_tokens": 200, "stop": ["world"], "details": true});
    let (s, b) = post_json(&app, "/generate", gen(params.clone())).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["details"]["finish_reason"], "stop_sequence");
    assert_eq!(b["generated_text"], " Hello world");
    assert!(fake.senders.lock().unwrap()[0].is_closed());
    let events = events(&app, "/generate_stream", gen(params)).await;
    let last = events.last().unwrap();
    assert_eq!(last["details"]["finish_reason"], "stop_sequence");
    assert_eq!(last["generated_text"], " Hello world");
    assert!(fake.senders.lock().unwrap()[1].is_closed());
    let sent = fake.sent.load(Ordering::SeqCst);
    assert!(sent < 20, "the fake ran on after the stop: {sent} tokens");
}

#[tokio::test]
async fn a_shard_failure_is_424_or_an_error_event() {
    let app = app(&FakeBackend::failing_after(1));
    let body = gen(json!({"max_new_tokens": 4}));
    let (s, b) = post_json(&app, "/generate", body.clone()).await;
    assert_error(s, &b, StatusCode::FAILED_DEPENDENCY, "generation");
    let events = events(&app, "/generate_stream", body).await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["token"]["id"], script_id(0));
    let keys: Vec<_> = events[1].as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["error", "error_type"]);
    assert_eq!(events[1]["error_type"], "generation");
}

/// Instance 0 asks for more (paced) tokens, so it finishes last.
#[tokio::test]
async fn vertex_answers_in_instance_order_plain_unless_scores_are_asked() {
    let app = app(&FakeBackend::paced(10));
    let scored = json!({"max_new_tokens": 2, "top_n_tokens": 1, "details": true});
    let body = json!({"instances": [
        {"inputs": "a", "parameters": {"max_new_tokens": 6}},
        {"inputs": "b", "parameters": {"max_new_tokens": 1}},
        {"inputs": "c", "parameters": scored},
    ]});
    let (s, b) = post_json(&app, "/vertex", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let p = &b["predictions"];
    assert_eq!(p[0], script_text(6));
    assert_eq!(p[1], script_text(1));
    assert_eq!(p[2]["generated_text"], script_text(2));
    assert_eq!(len(&p[2]["details"]["top_tokens"]), 2);
}

/// Scores asked for without `details` (top-N, labels) come back in `details` anyway: the
/// shard computed them, and Vertex answers an object because of them.
#[tokio::test]
async fn scores_asked_without_details_are_returned() {
    let app = app(&FakeBackend::default());
    let params = json!({"max_new_tokens": 2, "top_n_tokens": 1, "logprob_token_ids": [5]});
    let body = json!({"instances": [{"inputs": "c", "parameters": params}]});
    let (s, b) = post_json(&app, "/vertex", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let d = &b["predictions"][0]["details"];
    assert_eq!(len(&d["top_tokens"]), 2, "{b}");
    assert_eq!(d["tokens"][0]["label_logprobs"][0]["id"], 5, "{b}");
}

#[tokio::test]
async fn vertex_instance_parameters_override_top_level_ones() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let body = json!({"parameters": {"max_new_tokens": 2, "top_n_tokens": 1},
        "instances": [{"inputs": "a", "parameters": {"max_new_tokens": 3}}]});
    let (s, b) = post_json(&app, "/predict", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let r = fake.last();
    assert_eq!((r.max_new_tokens, r.scores.top_n_tokens), (3, 1));
    let body = json!({"instances": [
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        {"prompt": "Hi", "max_tokens": 2},
    ]});
    let (s, b) = post_json(&app, "/vertex", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["predictions"][0]["object"], "chat.completion");
    assert_eq!(b["predictions"][1]["choices"][0]["text"], script_text(2));
}

#[tokio::test]
async fn vertex_errors_name_the_instance_and_limits() {
    let mut cfg = config();
    cfg.max_response_bytes = 2_000;
    let app = app_with(cfg, &FakeBackend::default());
    let bad = json!({"inputs": "b", "parameters": {"temperature": -1}});
    let body = json!({"instances": [{"inputs": "a"}, bad]});
    let (s, b) = post_json(&app, "/vertex", body).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(error_text(&b).starts_with("instances[1]: "), "{b}");
    let (s, b) = post_json(&app, "/vertex", json!({"instances": []})).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    let five: Vec<_> = (0..5).map(|_| json!({"inputs": "a"})).collect();
    let (s, b) = post_json(&app, "/vertex", json!({"instances": five})).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(error_text(&b).contains("--max-vertex-instances"), "{b}");
    let big = json!({"max_new_tokens": 30, "details": true, "top_n_tokens": 5});
    let body = json!({"instances": [{"inputs": "a", "parameters": big}]});
    let (s, b) = post_json(&app, "/vertex", body).await;
    assert_error(s, &b, StatusCode::PAYLOAD_TOO_LARGE, "response_too_large");
}

#[tokio::test]
async fn openai_completions_json_and_stream() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let body = json!({"prompt": "Hi", "max_tokens": 3, "temperature": 0, "logprobs": 2});
    let (s, b) = post_json(&app, "/v1/completions", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(fake.last().sampling, Sampling::Greedy);
    assert_eq!(b["object"], "text_completion");
    assert_eq!(b["model"], "smollm2-test");
    let c = &b["choices"][0];
    assert_eq!(c["text"], script_text(3));
    assert_eq!(c["finish_reason"], "length");
    let lp = &c["logprobs"];
    assert_eq!(lp["token_logprobs"], json!(vec![TOKEN_LOGPROB; 3]));
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    let prompt = tokenizer().encode("Hi", true).unwrap().len();
    // The fake backend reports all but the last prompt token as cached.
    let usage = json!({"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3,
                       "prompt_tokens_details": {"cached_tokens": prompt - 1}});
    assert_eq!(b["usage"], usage);

    let options = json!({"include_usage": true});
    let body = json!({"prompt": "Hi", "max_tokens": 3, "stream": true, "stream_options": options});
    let events = events(&app, "/v1/completions", body).await;
    // OpenAI's default temperature is 1: it samples.
    let sampling = fake.last().sampling;
    assert!(matches!(sampling, Sampling::Sample { temperature, .. } if temperature == 1.0));
    assert_eq!(events.len(), 5, "{events:?}");
    let texts = events[..3]
        .iter()
        .map(|e| e["choices"][0]["text"].as_str().unwrap());
    assert_eq!(texts.collect::<String>(), script_text(3));
    assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[3]["choices"], json!([]));
    assert_eq!(events[3]["usage"]["completion_tokens"], 3);
    assert_eq!(
        events[3]["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt - 1
    );
    assert_eq!(events[4], "[DONE]");
}

#[tokio::test]
async fn openai_chat_renders_the_template_json_and_stream() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let messages = json!([{"role": "user", "content": "Hello"}]);
    let body = json!({"messages": messages, "max_tokens": 3, "logprobs": true,
        "top_logprobs": 1, "seed": 7});
    let (s, b) = post_json(&app, "/v1/chat/completions", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let list = messages.as_array().unwrap();
    let inputs = ChatInputs {
        messages: list,
        add_generation_prompt: true,
        tools: None,
    };
    let rendered = tokenizer().apply_chat_template(&inputs).unwrap();
    let r = fake.last();
    // The template writes BOS and friends itself: no special tokens added on top.
    assert_eq!(r.input_ids, tokenizer().encode(&rendered, false).unwrap());
    assert_eq!(r.sampling.seed(), Some(7));
    assert_eq!(b["object"], "chat.completion");
    let message = json!({"role": "assistant", "content": script_text(3)});
    assert_eq!(b["choices"][0]["message"], message);
    let content = &b["choices"][0]["logprobs"]["content"];
    assert_eq!(ids_of(content), script_ids_u64(3));
    assert_eq!(len(&content[0]["top_logprobs"]), 1);
    assert_eq!(b["usage"]["prompt_tokens"], r.input_ids.len());

    let body = json!({"messages": messages, "max_tokens": 2, "stream": true});
    let events = events(&app, "/v1/chat/completions", body).await;
    assert_eq!(events.len(), 4, "{events:?}");
    let opening = json!({"role": "assistant", "content": ""});
    assert_eq!(events[0]["choices"][0]["delta"], opening);
    let texts = events[1..3].iter();
    let texts = texts.map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap());
    assert_eq!(texts.collect::<String>(), script_text(2));
    assert!(events[1]["choices"][0]["finish_reason"].is_null());
    assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[3], "[DONE]");
}

#[tokio::test]
async fn invoke_routes_and_custom_vertex_routes() {
    let mut cfg = config();
    cfg.predict_route = "/custom/predict".into();
    cfg.health_route = "/custom/health".into();
    let app = app_with(cfg, &FakeBackend::default());
    let body = gen(json!({"max_new_tokens": 2, "details": true}));
    let plain = post_json(&app, "/generate", body.clone()).await;
    assert_eq!(plain.0, StatusCode::OK);
    assert_eq!(post_json(&app, "/invoke/generate", body).await, plain);
    let predict = json!({"instances": [gen(json!({"max_new_tokens": 2}))]});
    for path in [
        "/custom/predict",
        "/invoke/custom/predict",
        "/invoke/vertex",
    ] {
        let (s, b) = post_json(&app, path, predict.clone()).await;
        assert_eq!(s, StatusCode::OK, "{path}");
        assert_eq!(b["predictions"][0], script_text(2), "{path}");
    }
    for path in ["/custom/health", "/invoke/custom/health", "/invoke/health"] {
        assert_eq!(call(&app, get(path)).await.0, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn api_key_guards_inference_but_not_ops() {
    let mut cfg = config();
    cfg.api_key = Some("sekrit".into());
    let app = app_with(cfg, &FakeBackend::default());
    let body = gen(json!({"max_new_tokens": 1}));
    let with_key = |key: &str| {
        let mut r = post("/generate", &body);
        let value = format!("Bearer {key}").parse().unwrap();
        r.headers_mut().insert(header::AUTHORIZATION, value);
        r
    };
    let (s, b) = call(&app, post("/generate", &body)).await;
    assert_error(s, &b, StatusCode::UNAUTHORIZED, "unauthorized");
    let (s, b) = call(&app, with_key("sekrit-not")).await;
    assert_error(s, &b, StatusCode::UNAUTHORIZED, "unauthorized");
    assert_eq!(call(&app, with_key("sekrit")).await.0, StatusCode::OK);
    for path in "/health /metrics /docs /api-doc/openapi.json /info".split(' ') {
        let status = send(&app, get(path)).await.status();
        assert_eq!(status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn bodies_that_are_not_json_requests() {
    let app = app(&FakeBackend::default());
    let big = json!({"inputs": "x".repeat(config().payload_limit + 1)});
    let (s, b) = post_json(&app, "/generate", big).await;
    assert_error(s, &b, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    let plain = Request::post("/generate").body(Body::from(r#"{"inputs":"Hi"}"#));
    let (s, b) = call(&app, plain.unwrap()).await;
    let want = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    assert_error(s, &b, want, "unsupported_media_type");
    let broken = Request::post("/generate").header(header::CONTENT_TYPE, "application/json");
    let (s, b) = call(&app, broken.body(Body::from(r#"{"inputs": "#)).unwrap()).await;
    assert_error(s, &b, StatusCode::BAD_REQUEST, "malformed_json");
    let (s, b) = post_json(&app, "/generate", gen(json!({"top_k": "x"}))).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(error_text(&b).contains("top_k"), "{b}");
    // A body of the wrong shape names the body (serde alone names only a Rust type).
    for body in [json!(null), json!([]), json!(5)] {
        let (s, b) = post_json(&app, "/generate", body).await;
        assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
        assert!(error_text(&b).contains("body must be a JSON object"), "{b}");
    }
    let (s, b) = call(&app, get("/nowhere")).await;
    assert_error(s, &b, StatusCode::NOT_FOUND, "not_found");
    // A known route with the wrong method gets the envelope too, under /invoke as well.
    for path in ["/generate", "/invoke/generate"] {
        let (s, b) = call(&app, get(path)).await;
        assert_error(s, &b, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
        assert!(error_text(&b).contains(path), "{b}");
    }
}

/// Vertex forwards `/invoke/` with its trailing slash as it came: TGI's compat route.
#[tokio::test]
async fn invoke_root_with_a_trailing_slash_is_the_compat_route() {
    let app = app(&FakeBackend::default());
    for path in ["/invoke", "/invoke/"] {
        let (s, b) = post_json(&app, path, gen(json!({"max_new_tokens": 2}))).await;
        assert_eq!(s, StatusCode::OK, "{path}: {b}");
        assert!(b[0]["generated_text"].is_string(), "{path}: {b}");
    }
}

#[tokio::test]
async fn openapi_lists_every_route_and_docs_render_it() {
    let app = app(&FakeBackend::default());
    let (s, spec) = call(&app, get("/api-doc/openapi.json")).await;
    assert_eq!(s, StatusCode::OK);
    let paths = spec["paths"].as_object().unwrap();
    let served = "/generate /generate_stream / /vertex /v1/completions /v1/chat/completions \
                  /v1/models /health /info /metrics /tokenize";
    let mut routes: Vec<String> = served.split_whitespace().map(String::from).collect();
    // Once docs/API.md exists, every route it documents must be in the spec too.
    let api_md = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/API.md");
    if let Ok(doc) = std::fs::read_to_string(api_md) {
        for word in doc.split(|c: char| c.is_whitespace() || c == '`') {
            let end = |c: char| !c.is_alphanumeric() && c != '/' && c != '_';
            let w = word.trim_end_matches(end);
            if w.starts_with("/v1/") || w.starts_with("/generate") {
                routes.push(w.to_string());
            }
        }
    }
    for route in &routes {
        assert!(
            paths.contains_key(route),
            "{route} missing from the OpenAPI document"
        );
    }
    let page = send(&app, get("/docs")).await;
    let content_type = page.headers()[header::CONTENT_TYPE].to_str().unwrap();
    assert!(content_type.starts_with("text/html"), "{content_type}");
    assert!(text(page).await.contains("api-doc/openapi.json"));
}

#[tokio::test]
async fn a_held_stream_takes_the_only_permit() {
    let mut cfg = config();
    cfg.max_concurrent_requests = 1;
    let app = app_with(cfg, &FakeBackend::default());
    let body = gen(json!({"max_new_tokens": 2}));
    // The body is not read, so the stream (and its permit) stays alive.
    let held = send(&app, post("/generate_stream", &body)).await;
    assert_eq!(held.status(), StatusCode::OK);
    let (s, b) = post_json(&app, "/generate", body.clone()).await;
    assert_error(s, &b, StatusCode::TOO_MANY_REQUESTS, "overloaded");
    drop(held);
    assert_eq!(post_json(&app, "/generate", body).await.0, StatusCode::OK);
}

/// lm-evaluation-harness's loglikelihood call: token-id lists, `echo`, `logprobs: 1`,
/// `max_tokens: 1`. Each list is one choice, in order, scored on exactly those ids.
#[tokio::test]
async fn openai_completions_take_token_id_prompts() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let hello = tokenizer().encode("Hello there", false).unwrap();
    let sea = tokenizer().encode(" the sea", false).unwrap();
    let body = json!({"prompt": [hello, sea], "max_tokens": 1, "logprobs": 1, "echo": true,
                      "temperature": 0, "seed": 1234});
    let (s, b) = post_json(&app, "/v1/completions", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let asked: Vec<Vec<u32>> = fake.requests().into_iter().map(|r| r.input_ids).collect();
    assert_eq!(asked, [hello.clone(), sea.clone()]);
    for (i, ids) in [&hello, &sea].into_iter().enumerate() {
        let c = &b["choices"][i];
        assert_eq!(c["index"], i);
        let lp = &c["logprobs"];
        // Every prompt position (the first has none) and the generated token.
        assert_eq!(len(&lp["token_logprobs"]), ids.len() + 1);
        assert_eq!(lp["token_logprobs"][0], Value::Null);
        // The echoed text is the ids' text, then the generated token's.
        let text = tokenizer().decode(ids, false).unwrap();
        assert_eq!(c["text"], format!("{text}{}", script_text(1)));
    }
    // One list of ids is one prompt.
    let (s, b) = post_json(
        &app,
        "/v1/completions",
        json!({"prompt": hello, "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(len(&b["choices"]), 1);
    assert_eq!(fake.last().input_ids, hello);
}

#[tokio::test]
async fn openai_prompts_of_the_wrong_shape_or_vocabulary_are_named() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let vocab = tokenizer().vocab_size();
    for bad in [
        json!(5),
        json!([1, "a"]),
        json!([[1], "a"]),
        json!([1.5]),
        json!({"a": 1}),
        json!([null]),
    ] {
        let (s, b) = post_json(&app, "/v1/completions", json!({"prompt": bad})).await;
        assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
        let e = error_text(&b);
        assert!(
            e.contains("`prompt`") || e.starts_with("prompt"),
            "{bad}: {e}"
        );
        assert!(
            e.contains("a list of token-id lists") && !e.contains("variant"),
            "{bad}: {e}"
        );
    }
    let (s, b) = post_json(
        &app,
        "/v1/completions",
        json!({"prompt": [[1, 2], [vocab]]}),
    )
    .await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    let want = format!("prompt[1]: `prompt` holds {vocab}, outside the vocabulary (0..{vocab})");
    assert_eq!(error_text(&b), want);
    let (s, b) = post_json(&app, "/v1/completions", json!({"prompt": [[]]})).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(error_text(&b).contains("must not be empty"), "{b}");
    assert!(fake.requests().is_empty());
}

/// vLLM's remote-tokenizer contract, as lm-evaluation-harness's `RemoteTokenizer` uses it.
#[tokio::test]
async fn the_remote_tokenizer_contract() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let t = tokenizer();
    let text = "<|im_start|>user\nHi<|im_end|>";
    let body = json!({"prompt": text, "add_special_tokens": false});
    let (s, b) = post_json(&app, "/tokenize", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let want = t.encode(text, false).unwrap();
    assert_eq!(b["tokens"], json!(want));
    assert_eq!(b["count"], want.len());
    assert_eq!(b["max_model_len"], limits().max_total_tokens);
    // TGI's shape is unchanged.
    let (s, b) = post_json(&app, "/tokenize", json!({"inputs": text})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        ids_of(&b),
        want.iter().map(|&i| i as u64).collect::<Vec<_>>()
    );
    for both in [
        json!({"inputs": "a", "prompt": "a"}),
        json!({}),
        json!({"inputs": "a", "add_special_tokens": true}),
    ] {
        let (s, b) = post_json(&app, "/tokenize", both).await;
        assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    }

    let (s, b) = post_json(&app, "/detokenize", json!({"tokens": want})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["prompt"], text);
    let vocab = t.vocab_size();
    let (s, b) = post_json(&app, "/detokenize", json!({"tokens": [1, vocab]})).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(
        error_text(&b).contains(&format!("`tokens` holds {vocab}")),
        "{b}"
    );

    let (s, info) = call(&app, get("/tokenizer_info")).await;
    assert_eq!(s, StatusCode::OK, "{info}");
    let special = t.special_tokens();
    let eos = t.token_text(special.eos[0]).unwrap();
    assert_eq!(info["eos_token"], eos);
    // What the harness derives from it: the eos id, by tokenizing its text.
    let (_, b) = post_json(
        &app,
        "/tokenize",
        json!({"prompt": eos, "add_special_tokens": false}),
    )
    .await;
    assert_eq!(b["tokens"], json!([special.eos[0]]));
    assert_eq!(info["add_bos_token"], special.add_bos);
    assert_eq!(info["chat_template"], t.chat_template().unwrap().source());
    assert_eq!(info["vocab_size"], vocab);
}

/// SGLang's `/v1/score`: one generation per item on query + item, the labels' logprobs at
/// the next position turned into probabilities.
#[tokio::test]
async fn score_runs_query_and_item_and_reports_label_probabilities() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let body = json!({"query": "Is the sky blue? Answer:", "items": [" yes", " no"],
                      "label_token_ids": [42, 7, 9]});
    let (s, b) = post_json(&app, "/v1/score", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let asked = fake.requests();
    let t = tokenizer();
    for (r, item) in asked.iter().zip([" yes", " no"]) {
        let text = format!("Is the sky blue? Answer:{item}");
        assert_eq!(r.input_ids, t.encode(&text, true).unwrap());
        assert_eq!(r.max_new_tokens, 1);
        assert_eq!(r.scores.label_ids, [42, 7, 9]);
        assert_eq!(r.sampling, Sampling::Greedy);
    }
    let p = f64::from(LABEL_LOGPROB).exp();
    assert_eq!(b["scores"], json!([[p, p, p], [p, p, p]]));
    assert_eq!(b["object"], "scoring");
    let prompt: usize = asked.iter().map(|r| r.input_ids.len()).sum();
    assert_eq!(
        b["usage"],
        json!({"prompt_tokens": prompt, "total_tokens": prompt})
    );

    // Token ids are concatenated, item first when asked; softmax renormalises over labels.
    let body = json!({"query": [5, 6], "items": [[7], [8, 9]], "label_token_ids": [1, 2],
                      "item_first": true, "apply_softmax": true});
    let (s, b) = post_json(&app, "/v1/score", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let asked: Vec<Vec<u32>> = fake.requests()[2..]
        .iter()
        .map(|r| r.input_ids.clone())
        .collect();
    assert_eq!(asked, [vec![7, 5, 6], vec![8, 9, 5, 6]]);
    assert_eq!(b["scores"], json!([[0.5, 0.5], [0.5, 0.5]]));

    // A Vertex instance with `query` is a scoring request.
    let body = json!({"instances": [{"query": "a", "items": ["b"], "label_token_ids": [3]}]});
    let (s, b) = post_json(&app, "/vertex", body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["predictions"][0]["scores"], json!([[p]]));
}

#[tokio::test]
async fn score_refusals_name_the_field() {
    let fake = FakeBackend::default();
    let app = app(&fake);
    let vocab = tokenizer().vocab_size();
    let cases = [
        (
            json!({"query": "q", "items": [], "label_token_ids": [1]}),
            "`items` must not be empty",
        ),
        (
            json!({"query": "q", "items": ["a", "b", "c", "d", "e"], "label_token_ids": [1]}),
            "--max-score-items",
        ),
        (
            json!({"query": "q", "items": ["a"], "label_token_ids": []}),
            "`label_token_ids` must not be empty",
        ),
        (
            json!({"query": "q", "items": [[1]], "label_token_ids": [1]}),
            "both be text or both be token ids",
        ),
        (
            json!({"query": "q", "items": ["a"], "label_token_ids": [vocab]}),
            "`label_token_ids` holds",
        ),
        (
            json!({"query": [1], "items": [[vocab]], "label_token_ids": [1]}),
            "items[0]: `items` holds",
        ),
        (
            json!({"query": 5, "items": ["a"], "label_token_ids": [1]}),
            "a string or a list of token ids",
        ),
        (
            json!({"query": "q", "items": "a", "label_token_ids": [1]}),
            "a list of strings or a list of token-id lists",
        ),
    ];
    for (body, words) in cases {
        let (s, b) = post_json(&app, "/v1/score", body.clone()).await;
        assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "validation");
        assert!(error_text(&b).contains(words), "{body}: {b}");
    }
    assert!(fake.requests().is_empty());
}
