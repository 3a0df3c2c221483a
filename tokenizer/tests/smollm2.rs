//! The default model's tokenizer (SmolLM2-135M-Instruct GGUF) against an independent
//! reference: `scripts/smollm2_reference.py` reads the same file with the `gguf` Python
//! package, runs SmolLM2's published Hugging Face pipeline in the Python `tokenizers`
//! package, and renders the chat template with Jinja2 as transformers does.
//! `scripts/test` produces `data/reference/smollm2.json` before the tests run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use sonde_tokenizer::{ChatInputs, ModelTokenizer};

mod common;

fn load() -> (ModelTokenizer, Value) {
    let model = sonde_testdata::smollm2_gguf();
    let reference = sonde_testdata::path("reference/smollm2.json");
    let tokenizer = ModelTokenizer::from_gguf_file(&model).unwrap();
    let reference = serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    (tokenizer, reference)
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn check_cases(tokenizer: &ModelTokenizer, reference: &Value) {
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() > 40, "reference has {} cases", cases.len());
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        assert_eq!(
            tokenizer.encode(text, false).unwrap(),
            expected,
            "encode {text:?}"
        );
        assert_eq!(
            tokenizer.decode(&expected, false).unwrap(),
            text,
            "decode {text:?}"
        );
        let bytes = common::concat_token_bytes(tokenizer, &expected);
        assert_eq!(bytes, text.as_bytes(), "token bytes of {text:?}");
    }
}

fn check_chat(tokenizer: &ModelTokenizer, reference: &Value) {
    let messages = reference["conversation"].as_array().unwrap();
    for (add_generation_prompt, key) in [
        (true, "chat_with_generation_prompt"),
        (false, "chat_without_generation_prompt"),
    ] {
        let rendered = tokenizer
            .apply_chat_template(&ChatInputs {
                messages,
                add_generation_prompt,
                tools: None,
            })
            .unwrap();
        assert_eq!(rendered, reference[key].as_str().unwrap(), "{key}");
    }
}

#[test]
fn encodes_and_decodes_like_the_reference() {
    let (tokenizer, reference) = load();
    check_cases(&tokenizer, &reference);
}

/// The same pipeline saved by Python `tokenizers` as a Hugging Face folder, with a
/// `tokenizer_config.json` in transformers' shape, loads to the same tokenizer.
#[test]
fn hugging_face_folder_of_the_same_tokenizer_agrees() {
    let (_, reference) = load();
    let tokenizer =
        ModelTokenizer::from_hf_dir(&sonde_testdata::path("reference/smollm2-hf")).unwrap();
    check_cases(&tokenizer, &reference);
    check_chat(&tokenizer, &reference);
    let special = tokenizer.special_tokens();
    assert_eq!(
        (special.bos, special.eos.as_slice(), special.add_bos),
        (Some(1), &[2][..], false)
    );
    assert!(tokenizer.is_special(2) && !tokenizer.is_special(198));
}

#[test]
fn chatml_template_renders_two_turns_exactly() {
    let (tokenizer, reference) = load();
    check_chat(&tokenizer, &reference);
    let prompt = reference["chat_with_generation_prompt"].as_str().unwrap();
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
}

#[test]
fn special_tokens_of_the_default_model() {
    let (tokenizer, _) = load();
    let special = tokenizer.special_tokens();
    assert_eq!(special.bos, Some(1));
    assert_eq!(special.eos, [2]);
    assert!(
        !special.add_bos,
        "SmolLM2's GGUF says add_bos_token = false"
    );
    assert_eq!(tokenizer.vocab_size(), 49152);
    assert!(tokenizer.is_special(2) && !tokenizer.is_special(198));
    assert_eq!(tokenizer.token_text(2).as_deref(), Some("<|im_end|>"));
    // Special tokens written in the text are matched, as a served prompt needs.
    assert_eq!(tokenizer.encode("<|im_start|>user", false).unwrap()[0], 1);
    // Skipping special tokens leaves only the text.
    let chat = tokenizer
        .encode("<|im_start|>assistant\nParis<|im_end|>", false)
        .unwrap();
    assert_eq!(tokenizer.decode(&chat, true).unwrap(), "assistant\nParis");
}

#[test]
fn streaming_the_reference_tokens_rebuilds_every_text() {
    let (tokenizer, reference) = load();
    for case in reference["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let mut decoder = tokenizer.stream_decoder();
        let mut streamed = String::new();
        for id in ids(&case["ids"]) {
            let chunk = decoder.push(tokenizer.token_bytes(id).unwrap());
            assert!(!chunk.contains('\u{FFFD}'), "half a character in {text:?}");
            streamed.push_str(&chunk);
        }
        streamed.push_str(&decoder.finish());
        assert_eq!(streamed, text);
    }
}

#[test]
fn token_spans_cover_the_text() {
    let (tokenizer, _) = load();
    let text = "Hello, world! 1234 😁";
    let spans = tokenizer.encode_with_offsets(text, false).unwrap();
    let mut end = 0;
    for pair in spans.windows(2) {
        assert!(
            pair[0].start <= pair[1].start,
            "spans go backwards: {pair:?}"
        );
        // Where a token boundary falls inside a character (the emoji's bytes), both
        // tokens carry the whole character, so spans may overlap there only.
        let overlap = &text[pair[1].start..pair[0].stop.max(pair[1].start)];
        assert!(
            overlap.is_empty() || overlap == "😁",
            "overlap {overlap:?}: {pair:?}"
        );
    }
    for span in &spans {
        assert!(
            span.start < span.stop && span.stop <= text.len(),
            "{span:?}"
        );
        assert!(span.start <= end, "gap before {span:?}");
        end = end.max(span.stop);
    }
    assert_eq!(end, text.len());
    // Digits are single tokens in SmolLM2 (StarCoder split).
    let digits: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start..s.stop])
        .filter(|s| s.trim().chars().all(|c| c.is_ascii_digit()) && !s.trim().is_empty())
        .collect();
    assert_eq!(digits, ["1", "2", "3", "4"]);
}

/// A `tokenizer.json` saved with truncation and padding (as some training runs leave
/// them) must not cut or pad served prompts.
#[test]
fn truncation_and_padding_in_tokenizer_json_are_ignored() {
    let (gguf, _) = load();
    let src = sonde_testdata::path("reference/smollm2-hf");
    let dir = std::env::temp_dir().join(format!("sonde-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut spec: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap())
            .unwrap();
    spec["truncation"] = serde_json::json!({
        "direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0
    });
    spec["padding"] = serde_json::json!({
        "strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": null,
        "pad_id": 2, "pad_type_id": 0, "pad_token": "<|im_end|>"
    });
    std::fs::write(dir.join("tokenizer.json"), spec.to_string()).unwrap();
    let tokenizer = ModelTokenizer::from_hf_dir(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    let text = "The capital of France is Paris, and it has been for a long time.";
    let ids = tokenizer.unwrap().encode(text, true).unwrap();
    assert!(ids.len() > 4 && ids.len() < 64, "{ids:?}");
    assert_eq!(ids, gguf.encode(text, true).unwrap());
}
