//! serde's errors in the API's own words: the field's path, what it must be, and what it
//! was — never the JSON library's phrasing (`invalid type: string "hello", expected a
//! sequence at line 1 column 20`, `data did not match any variant of untagged enum`).
//!
//! serde reports a wrong body through a handful of `de::Error` constructors whose messages
//! have one fixed shape each (`invalid type: {found}, expected {wanted}`, `missing field
//! `{f}``, …); serde_path_to_error adds the path. Each shape is read back here and said
//! again. A message of no known shape is one of Sonde's own `Deserialize` impls (`must be
//! a string or a list of token ids`), already in the API's words.

use serde_path_to_error::Path;

/// One sentence for a body (or part of one) that did not deserialize.
pub fn describe(err: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = field_path(err.path());
    let message = err.inner().to_string();
    sentence(&path, &message)
}

/// `parameters.top_n_tokens`, `messages[0].role`; empty for the body itself.
fn field_path(path: &Path) -> String {
    let p = path.to_string();
    if p == "." {
        String::new()
    } else {
        p
    }
}

fn sentence(path: &str, message: &str) -> String {
    let subject = |path: &str| {
        if path.is_empty() {
            "the request body".to_string()
        } else {
            format!("`{path}`")
        }
    };
    let child = |field: &str| {
        if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        }
    };
    if let Some((found, wanted)) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|rest| rest.split_once(", expected "))
    {
        return format!(
            "{} must be {}, got {}",
            subject(path),
            expected(wanted),
            found_value(found)
        );
    }
    if let Some(rest) = message.strip_prefix("invalid length ") {
        if let Some((len, wanted)) = rest.split_once(", expected ") {
            let wanted = expected(wanted);
            // serde reads a struct from a list too, field by field: a list was sent.
            let found = if wanted == "an object" {
                "a list".to_string()
            } else {
                format!("{len} items")
            };
            return format!("{} must be {wanted}, got {found}", subject(path));
        }
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (field, known) = name_and_choices(rest);
        // serde_path_to_error has the unknown key in the path already.
        let named = path == field || path.ends_with(&format!(".{field}"));
        let field = format!(
            "`{}`",
            if named {
                path.to_string()
            } else {
                child(field)
            }
        );
        return match known {
            Some(known) => format!(
                "{field} is not a field here; the fields are {}",
                known.trim_start_matches("one of ").replace(" or ", " and ")
            ),
            None => format!("{field} is not a field here"),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (value, known) = name_and_choices(rest);
        return match known {
            Some(known) => format!("{} must be {known}, got `{value}`", subject(path)),
            None => format!("{} cannot be `{value}`", subject(path)),
        };
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        return format!("`{}` is required", child(field.trim_matches('`')));
    }
    if let Some(field) = message.strip_prefix("duplicate field ") {
        return format!("`{}` is given twice", child(field.trim_matches('`')));
    }
    if message.contains("untagged enum") || message.contains("variant") {
        // A shape no Sonde type should produce (every untagged choice is read by hand);
        // say what is known without the library's words.
        return format!("{} has none of the shapes it may take", subject(path));
    }
    // Sonde's own `Deserialize` sentences (`must be a string or …`).
    format!("{} {message}", subject(path))
}

/// `` `name`, expected one of `a`, `b`, `c` `` → (`name`, "one of `a`, `b`, `c`"); serde
/// writes two choices `` `a` or `b` `` and one alone; no choices for `there are no fields`.
fn name_and_choices(rest: &str) -> (&str, Option<String>) {
    let (name, tail) = rest.split_once(", ").unwrap_or((rest, ""));
    let name = name.trim_matches('`');
    let choices = tail.strip_prefix("expected ").map(str::to_string);
    (name, choices)
}

/// What serde expected (a primitive's name, `struct X`, `a sequence`, or a Sonde type's own
/// `expecting` sentence), as a reader would say it.
fn expected(wanted: &str) -> String {
    let whole = |max: u64| format!("a whole number from 0 to {max}");
    match wanted {
        "u8" => whole(u8::MAX.into()),
        "u16" => whole(u16::MAX.into()),
        "u32" => whole(u32::MAX.into()),
        "u64" | "usize" => whole(u64::MAX),
        "i8" | "i16" | "i32" | "i64" | "isize" | "i128" | "u128" => "a whole number".to_string(),
        "f32" | "f64" => "a number".to_string(),
        "a boolean" => "true or false".to_string(),
        "a string" | "a borrowed string" | "a character" | "string or map" => {
            "a string".to_string()
        }
        "a sequence" => "a list".to_string(),
        "a map" => "an object".to_string(),
        "unit" => "null".to_string(),
        w if w.starts_with("struct ") || w.starts_with("enum ") => "an object".to_string(),
        w if w.starts_with("tuple of ") => {
            format!("a list of {}", w.trim_start_matches("tuple of "))
        }
        w if w.starts_with("a tuple of size ") => {
            format!(
                "a list of {} items",
                w.trim_start_matches("a tuple of size ")
            )
        }
        w => w.to_string(),
    }
}

/// What was found (serde_json's rendering of `Unexpected`), as a reader would say it.
fn found_value(found: &str) -> String {
    let quoted = |prefix: &str| {
        found
            .strip_prefix(prefix)
            .map(|rest| rest.trim_matches('`').to_string())
    };
    if let Some(s) = found.strip_prefix("string ") {
        let shown: String = s.chars().take(40).collect();
        return if shown.len() < s.len() {
            format!("the string {shown}…")
        } else {
            format!("the string {shown}")
        };
    }
    if let Some(n) = quoted("integer ").or_else(|| quoted("floating point ")) {
        return n;
    }
    if let Some(b) = quoted("boolean ") {
        return b;
    }
    match found {
        "null" | "unit value" => "null".to_string(),
        "sequence" => "a list".to_string(),
        "map" => "an object".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        top_k: Option<u32>,
        temperature: Option<f64>,
        details: Option<bool>,
        mode: Option<Mode>,
        stop: Option<Vec<String>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        Raw,
        Processed,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        inputs: String,
        parameters: Option<Inner>,
        messages: Option<Vec<serde_json::Value>>,
    }

    fn said(body: serde_json::Value) -> String {
        describe(&serde_path_to_error::deserialize::<_, Outer>(body).unwrap_err())
    }

    /// The words of serde and serde_json a message must not carry.
    const LIBRARY_WORDS: &[&str] = &[
        "untagged enum",
        "variant",
        "at line",
        "column",
        "invalid type",
        "expected struct",
        "sequence",
    ];

    #[test]
    fn each_kind_of_mistake_in_the_apis_words() {
        let cases = [
            (
                json!({"inputs": "x", "messages": "hello"}),
                "`messages` must be a list, got the string \"hello\"",
            ),
            (
                json!({"inputs": "x", "parameters": {"top_k": -1}}),
                "`parameters.top_k` must be a whole number from 0 to 4294967295, got -1",
            ),
            (
                json!({"inputs": "x", "parameters": {"top_k": 5000000000u64}}),
                "`parameters.top_k` must be a whole number from 0 to 4294967295, got 5000000000",
            ),
            (
                json!({"inputs": "x", "parameters": {"temperature": "hot"}}),
                "`parameters.temperature` must be a number, got the string \"hot\"",
            ),
            (
                json!({"inputs": "x", "parameters": {"details": 1}}),
                "`parameters.details` must be true or false, got 1",
            ),
            (
                json!({"inputs": "x", "parameters": {"mode": "fast"}}),
                "`parameters.mode` must be `raw` or `processed`, got `fast`",
            ),
            (
                json!({"inputs": "x", "parameters": {"stop": [1]}}),
                "`parameters.stop[0]` must be a string, got 1",
            ),
            (
                json!({"inputs": "x", "parameters": []}),
                "`parameters` must be an object, got a list",
            ),
            (json!({"parameters": {}}), "`inputs` is required"),
            (
                json!({"inputs": "x", "input": 1}),
                "`input` is not a field here; the fields are `inputs`, `parameters`, `messages`",
            ),
            (
                json!({"inputs": "x", "parameters": {"topk": 1}}),
                "`parameters.topk` is not a field here; the fields are `top_k`, `temperature`, \
                 `details`, `mode`, `stop`",
            ),
            (
                json!({"inputs": "x", "parameters": [1]}),
                "`parameters` must be an object, got a list",
            ),
        ];
        for (body, want) in cases {
            let got = said(body.clone());
            assert_eq!(got, want, "{body}");
            for word in LIBRARY_WORDS {
                assert!(!got.contains(word), "{got:?} has {word:?}");
            }
        }
    }

    #[test]
    fn sondes_own_sentences_are_kept_with_the_path() {
        assert_eq!(
            sentence("query", "must be a string or a list of token ids"),
            "`query` must be a string or a list of token ids"
        );
        assert_eq!(
            sentence("stop", "data did not match any variant of untagged enum X"),
            "`stop` has none of the shapes it may take"
        );
    }

    #[test]
    fn long_strings_are_cut() {
        let got = said(json!({"inputs": "x", "messages": "a".repeat(100)}));
        assert!(got.ends_with("…"), "{got}");
        assert!(got.len() < 100, "{got}");
    }
}
