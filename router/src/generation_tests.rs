//! `TextTracker` over real SmolLM2 tokens: what a stream shows must add up to the text,
//! never reveal a stop sequence, and never cut a character.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use super::*;

fn tokenizer() -> Arc<ModelTokenizer> {
    crate::test_support::smollm2_tokenizer()
}

fn encode(text: &str) -> Vec<u32> {
    tokenizer().encode(text, false).unwrap()
}

fn tracker(stops: &[&str]) -> TextTracker {
    TextTracker::new(tokenizer(), stops.iter().map(|s| s.to_string()).collect())
}

/// Pushes every token, returning each push's delta and the flush at the end.
fn run(text: &str, stops: &[&str]) -> (Vec<String>, String, TextTracker) {
    let mut t = tracker(stops);
    let deltas = encode(text).into_iter().map(|id| t.push(id)).collect();
    let tail = t.flush();
    (deltas, tail, t)
}

#[test]
fn deltas_concatenate_to_the_text() {
    let text = " Hello world, this is a test. Ünïcödé and numbers 12345!";
    let (deltas, tail, t) = run(text, &[]);
    assert!(deltas.len() > 5, "the text must span several tokens");
    assert_eq!(deltas.concat() + &tail, text);
    assert_eq!(t.full_text(), text);
    assert_eq!(t.text_before_stop(), text);
    assert!(!t.stopped());
}

#[test]
fn stop_split_across_tokens_is_found_and_never_shown() {
    let text = " Hello world, this is a test.";
    let stop = "lo wor";
    let ids = encode(text);
    // The stop must really straddle a token boundary for this test to mean anything.
    assert!(ids.iter().all(|&id| {
        let piece = String::from_utf8_lossy(tokenizer().token_bytes(id).unwrap()).into_owned();
        !piece.contains(stop)
    }));
    let stop_at = text.find(stop).unwrap();
    let mut t = tracker(&[stop]);
    let mut shown = String::new();
    let mut pushed = 0;
    for &id in &ids {
        shown += &t.push(id);
        pushed += 1;
        assert!(shown.len() <= stop_at, "{shown:?} shows part of the stop");
        if t.stopped() {
            break;
        }
    }
    assert!(t.stopped());
    assert!(
        pushed < ids.len(),
        "generation must end at the stop, not at the end"
    );
    shown += &t.flush();
    assert_eq!(shown, " Hel");
    assert_eq!(t.text_before_stop(), " Hel");
    assert!(t.full_text().starts_with(" Hello wor"));
    // Tokens after the stop add nothing.
    let full = t.full_text().to_string();
    assert_eq!(t.push(ids[0]), "");
    assert_eq!(t.full_text(), full);
}

#[test]
fn held_back_text_is_released_when_it_diverges() {
    let ids = encode(" Hello world");
    let mut t = tracker(&["lo there"]);
    // " Hello" ends with "lo", which may begin the stop: hold it.
    assert_eq!(t.push(ids[0]), " Hel");
    // " world" rules the stop out: the held "lo" comes out with it.
    assert_eq!(t.push(ids[1]), "lo world");
    assert!(!t.stopped());
}

#[test]
fn a_partial_stop_at_the_end_is_flushed() {
    let ids = encode(" Hello");
    let mut t = tracker(&["lo there"]);
    assert_eq!(ids.iter().map(|&id| t.push(id)).collect::<String>(), " Hel");
    assert_eq!(t.flush(), "lo");
    assert_eq!(t.text_before_stop(), " Hello");
}

#[test]
fn stop_inside_one_token_keeps_the_rest_in_full_text() {
    let (deltas, tail, t) = run(" Hello world, this", &[" wor"]);
    assert_eq!(deltas.concat() + &tail, " Hello");
    assert_eq!(t.text_before_stop(), " Hello");
    assert_eq!(t.full_text(), " Hello world");
}

#[test]
fn the_earliest_of_several_stops_wins() {
    let (deltas, tail, t) = run(" Hello world, this is", &["this", ", "]);
    assert_eq!(deltas.concat() + &tail, " Hello world");
    assert_eq!(t.text_before_stop(), " Hello world");
}

#[test]
fn a_split_character_is_never_shown_in_part() {
    let text = "I like 🦀 crabs";
    let ids = encode(text);
    // SmolLM2's byte-level BPE must split the crab into byte tokens, or nothing is tested.
    let partial = ids
        .iter()
        .filter(|&&id| std::str::from_utf8(tokenizer().token_bytes(id).unwrap()).is_err())
        .count();
    assert!(partial >= 2, "expected 🦀 split over byte tokens: {ids:?}");
    let (deltas, tail, t) = run(text, &[]);
    for d in &deltas {
        assert!(!d.contains(char::REPLACEMENT_CHARACTER), "{deltas:?}");
    }
    assert!(deltas.iter().any(|d| d.contains('🦀')));
    assert_eq!(deltas.concat() + &tail, text);
    assert_eq!(t.full_text(), text);
}

#[test]
fn a_multibyte_stop_is_matched_across_byte_tokens() {
    let (deltas, tail, t) = run("I like 🦀 crabs", &["🦀"]);
    assert!(t.stopped());
    assert_eq!(deltas.concat() + &tail, "I like ");
    assert_eq!(t.text_before_stop(), "I like ");
}

#[test]
fn special_tokens_add_no_text() {
    let tok = tokenizer();
    let eos = *tok.special_tokens().eos.first().expect("an eos token");
    assert!(tok.is_special(eos));
    let ids = encode(" Hello");
    let mut t = tracker(&[]);
    let mut shown: String = ids.iter().map(|&id| t.push(id)).collect();
    shown += &t.push(eos);
    shown += &t.flush();
    assert_eq!(shown, " Hello");
    assert_eq!(t.full_text(), " Hello");
}

#[test]
fn json_logprob_floors_infinities() {
    assert_eq!(json_logprob(-0.25), -0.25);
    assert_eq!(json_logprob(f32::NEG_INFINITY), LOGPROB_FLOOR);
    assert_eq!(json_logprob(f32::NAN), LOGPROB_FLOOR);
}
