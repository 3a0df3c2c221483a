//! Gemma 3's tokenizer (the 262,144 SentencePiece pieces in the GGUF of the second real
//! model) against llama.cpp and Google's SentencePiece.
//!
//! `scripts/gemma3_tokenizer_reference.py` writes `data/reference/gemma3-tokenizer/reference.json`:
//! for each hard string (whitespace runs, newlines, scripts, emoji, combining marks, byte
//! fallback, control characters, digits, code, special tokens written in text, llama.cpp's
//! own test strings), with and without parsing special tokens, the ids llama.cpp gives
//! (its llama-server when the script is given the binary, else a transcription of
//! llama-vocab.cpp that the script checks against the server whenever it has one) and the
//! ids of SentencePiece running a model rebuilt from the same GGUF. Sonde follows
//! llama.cpp for GGUF files; the few strings where SentencePiece differs are pinned below.
//! `scripts/test` fetches the model and writes the reference before the tests run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::Instant;

use serde_json::Value;
use sonde_tokenizer::ModelTokenizer;

mod common;

fn tokenizer() -> &'static ModelTokenizer {
    static TOKENIZER: OnceLock<ModelTokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let model = sonde_testdata::path("models/gemma-3-270m-q4_k_m.gguf");
        assert!(
            model.is_file(),
            "{} is missing: run `scripts/fetch-data gemma` (or scripts/test)",
            model.display()
        );
        let start = Instant::now();
        let tokenizer = ModelTokenizer::from_gguf_file(&model).unwrap();
        eprintln!("Gemma 3 tokenizer built in {:.2?}", start.elapsed());
        tokenizer
    })
}

fn reference() -> &'static Value {
    static REFERENCE: OnceLock<Value> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let path = sonde_testdata::path("reference/gemma3-tokenizer/reference.json");
        assert!(
            path.is_file(),
            "{} is missing: run scripts/test (it runs scripts/gemma3_tokenizer_reference.py)",
            path.display()
        );
        let value: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            value["model"],
            "gemma-3-270m-q4_k_m.gguf",
            "{}",
            path.display()
        );
        value
    })
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {value}"))
        .iter()
        .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
        .collect()
}

struct Case<'a> {
    text: &'a str,
    add_special: bool,
    parse_special: bool,
    llama_cpp: Vec<u32>,
    sentencepiece: Vec<u32>,
}

fn cases() -> Vec<Case<'static>> {
    let cases: Vec<Case> = reference()["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap(),
            add_special: c["add_special"].as_bool().unwrap(),
            parse_special: c["parse_special"].as_bool().unwrap(),
            llama_cpp: ids(&c["llama_cpp"]),
            sentencepiece: ids(&c["sentencepiece"]),
        })
        .collect();
    assert!(cases.len() > 300, "the reference has {} cases", cases.len());
    cases
}

fn encode(case: &Case) -> Vec<u32> {
    let t = tokenizer();
    let got = if case.parse_special {
        t.encode(case.text, case.add_special)
    } else {
        t.encode_literal(case.text, case.add_special)
    };
    got.unwrap_or_else(|e| panic!("encode {:?}: {e}", case.text))
}

fn describe(case: &Case) -> String {
    format!(
        "{:?} (add_special {}, parse_special {})",
        case.text, case.add_special, case.parse_special
    )
}

#[test]
fn encodes_every_hard_string_like_llama_cpp() {
    let cases = cases();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            let got = encode(case);
            (got != case.llama_cpp).then(|| {
                format!(
                    "{}\n   llama.cpp {:?}\n   sonde     {got:?}",
                    describe(case),
                    case.llama_cpp
                )
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from llama.cpp ({}):\n{}",
        failures.len(),
        cases.len(),
        reference()["source"]["llama_cpp"],
        failures.join("\n")
    );
}

/// Offsets come from a second encode path; its ids must be the same.
#[test]
fn encode_with_offsets_gives_the_same_ids_and_spans_inside_the_text() {
    for case in cases().iter().filter(|c| c.parse_special) {
        let spans = tokenizer()
            .encode_with_offsets(case.text, case.add_special)
            .unwrap();
        let got: Vec<u32> = spans.iter().map(|s| s.id).collect();
        assert_eq!(got, case.llama_cpp, "{}", describe(case));
        for span in &spans {
            assert!(
                span.start <= span.stop && span.stop <= case.text.len(),
                "{}: {span:?}",
                describe(case)
            );
        }
    }
}

/// SentencePiece (the tokenizer Gemma was trained with) agrees with llama.cpp except where
/// llama.cpp's GGUF conventions differ by design; a new disagreement fails here so that it
/// is looked at (and Sonde keeps following llama.cpp).
#[test]
fn sentencepiece_differs_from_llama_cpp_only_where_known() {
    let mut unexplained = Vec::new();
    let mut known = 0;
    for case in cases() {
        if case.sentencepiece == case.llama_cpp {
            continue;
        }
        // A literal `▁` in the text: SentencePiece cannot tell it from an escaped space, so
        // `▁▁` matches its user-defined piece for two spaces; llama.cpp matches user-defined
        // pieces in the raw text, where the converter wrote them with real spaces.
        let literal_marker = case.text.contains('\u{2581}');
        // SentencePiece never matches its unknown piece in text (and refuses a model whose
        // `<unk>` is anything else); llama.cpp splits it out like any control token.
        let unk = case.parse_special && case.text.contains("<unk>");
        // llama.cpp makes `</s>` (a user-defined HTML tag in Gemma 3) a control token by
        // its text (it is an end-of-generation token of other models), so without
        // parse_special it stays text; SentencePiece splits it out like the other tags.
        let end_tag = !case.parse_special && case.text.contains("</s>");
        if literal_marker || unk || end_tag {
            known += 1;
        } else {
            unexplained.push(format!(
                "{}\n   llama.cpp     {:?}\n   sentencepiece {:?}",
                describe(&case),
                case.llama_cpp,
                case.sentencepiece
            ));
        }
    }
    assert!(
        known > 0,
        "the known disagreements are no longer in the reference"
    );
    assert!(
        unexplained.is_empty(),
        "SentencePiece and llama.cpp disagree in new ways:\n{}",
        unexplained.join("\n")
    );
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// The bytes of every token are llama.cpp's pieces (`common_token_to_piece` with specials),
/// `decode` writes them as text, and streaming them token by token gives the same text in
/// whole characters.
#[test]
fn decodes_like_llama_cpp() {
    let t = tokenizer();
    let decodes = reference()["decode"].as_array().unwrap();
    assert!(decodes.len() > 100, "{} decode cases", decodes.len());
    let mut failures = Vec::new();
    for entry in decodes {
        let ids = ids(&entry["ids"]);
        let want = hex_bytes(entry["llama_cpp_hex"].as_str().unwrap());
        let bytes = common::concat_token_bytes(t, &ids);
        if bytes != want {
            failures.push(format!(
                "token bytes of {ids:?}\n   llama.cpp {:?}\n   sonde     {:?}",
                String::from_utf8_lossy(&want),
                String::from_utf8_lossy(&bytes)
            ));
            continue;
        }
        let lossy = String::from_utf8_lossy(&want).into_owned();
        let decoded = t.decode(&ids, false).unwrap();
        if decoded != lossy {
            failures.push(format!(
                "decode {ids:?}\n   llama.cpp {lossy:?}\n   sonde     {decoded:?}"
            ));
        }
        if let Some(server) = entry.get("llama_server_text").and_then(Value::as_str) {
            if decoded != server {
                failures.push(format!(
                    "decode {ids:?}\n   llama-server {server:?}\n   sonde        {decoded:?}"
                ));
            }
        }
        let mut stream = t.stream_decoder();
        let mut chunks: Vec<String> = ids
            .iter()
            .map(|&id| stream.push(t.token_bytes(id).unwrap()))
            .collect();
        chunks.push(stream.finish());
        // Chunks are whole characters by type; a character split across byte tokens that
        // came out early would show as U+FFFD and break the equality.
        if chunks.concat() != lossy {
            failures.push(format!("streaming {ids:?}: {chunks:?}, want {lossy:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} decode cases differ:\n{}",
        failures.len(),
        decodes.len(),
        failures.join("\n")
    );
}

/// Every encoded case decodes back to its text (control tokens as their text), except a
/// literal `▁`, which is how SentencePiece writes a space.
#[test]
fn encoded_text_round_trips() {
    let t = tokenizer();
    for case in cases().iter().filter(|c| !c.text.contains('\u{2581}')) {
        let mut want = String::new();
        if case.add_special {
            want.push_str("<bos>");
        }
        want.push_str(case.text);
        assert_eq!(
            t.decode(&case.llama_cpp, false).unwrap(),
            want,
            "{}",
            describe(case)
        );
    }
}

/// Skipping special tokens, decoding is SentencePiece's `DecodeIds` (which leaves control
/// pieces out), wherever the bytes are valid UTF-8 and SentencePiece has no `<unk>` (it
/// writes ` ⁇ ` for it).
#[test]
fn decode_without_specials_matches_sentencepiece() {
    let t = tokenizer();
    let mut checked = 0;
    for entry in reference()["decode"].as_array().unwrap() {
        let ids = ids(&entry["ids"]);
        let bytes = hex_bytes(entry["llama_cpp_hex"].as_str().unwrap());
        if std::str::from_utf8(&bytes).is_err() || ids.contains(&3) {
            continue;
        }
        let want = entry["sentencepiece"].as_str().unwrap();
        assert_eq!(t.decode(&ids, true).unwrap(), want, "decode {ids:?}");
        checked += 1;
    }
    assert!(checked > 100, "{checked} decode cases checked");
}

#[test]
fn special_tokens_are_gemmas() {
    let t = tokenizer();
    let special = t.special_tokens();
    assert_eq!(special.bos, Some(2));
    assert_eq!(special.eos.first(), Some(&1));
    assert!(special.add_bos);
    assert_eq!(t.vocab_size(), 262_144);
    for (id, text) in [
        (0, "<pad>"),
        (1, "<eos>"),
        (2, "<bos>"),
        (3, "<unk>"),
        (105, "<start_of_turn>"),
        (106, "<end_of_turn>"),
    ] {
        assert!(t.is_special(id), "{id} {text}");
        assert_eq!(t.token_bytes(id), Some(text.as_bytes()));
    }
    // User-defined pieces (runs of spaces, newlines, tabs; HTML tags) are text, not special.
    for id in [107, 108, 138, 168] {
        assert!(!t.is_special(id), "{id}");
    }
    assert_eq!(t.token_bytes(138), Some(&b"  "[..]));
}
