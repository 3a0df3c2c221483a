//! Chat templates: the model's Jinja template rendered with minijinja the way Hugging
//! Face's `apply_chat_template` renders it (`trim_blocks`, `lstrip_blocks`, loop controls,
//! Python string/dict/list methods, `raise_exception`, `strftime_now`, and a `tojson` that
//! writes what Python's `json.dumps` writes).

use std::io;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde};
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};

use crate::error::TokenizerError;

const TEMPLATE_NAME: &str = "chat";

/// What a template is rendered with.
#[derive(Debug, Clone, Default)]
pub struct ChatInputs<'a> {
    /// OpenAI-style messages: `[{"role": "...", "content": ...}, ...]`.
    pub messages: &'a [serde_json::Value],
    /// End with the header that opens the assistant's turn.
    pub add_generation_prompt: bool,
    /// Tool definitions for templates that render them.
    pub tools: Option<&'a serde_json::Value>,
}

/// A compiled chat template with the special-token strings it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is a `TokenizerError::Template`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(template_error)?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template text as the model ships it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation into the prompt text.
    pub fn render(&self, inputs: &ChatInputs<'_>) -> Result<String, TokenizerError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        let ctx = context! {
            messages => Value::from(Serde(inputs.messages)),
            add_generation_prompt => inputs.add_generation_prompt,
            tools => inputs.tools.map(|t| Value::from(Serde(t))),
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        template.render(ctx).map_err(template_error)
    }
}

/// One sentence for the client. A template's own `raise_exception("...")` arrives as the
/// detail of an invalid-operation error: that sentence is shown as the author wrote it,
/// with the template line; other errors keep minijinja's wording, which names the line.
fn template_error(err: Error) -> TokenizerError {
    let msg = match (err.kind(), err.detail(), err.line()) {
        (ErrorKind::InvalidOperation, Some(detail), Some(line)) => {
            format!("{detail} (template line {line})")
        }
        (ErrorKind::InvalidOperation, Some(detail), None) => detail.to_string(),
        _ => err.to_string(),
    };
    TokenizerError::Template(msg)
}

/// Templates call `raise_exception("...")` to reject a conversation they cannot render
/// (e.g. roles not alternating); the message is for the client.
fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now("%d %b %Y")`, used by Llama 3.x templates for today's date (UTC).
fn strftime_now(format: String) -> Result<String, Error> {
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    jiff::fmt::strtime::format(&format, &now).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format {format:?}: {e}"),
        )
    })
}

/// `x | tojson` or `x | tojson(indent=2)`, written like Python's
/// `json.dumps(x, ensure_ascii=False, indent=...)` (what transformers uses): `", "` and
/// `": "` separators, no HTML escaping.
fn tojson(value: Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    // Python's default, and what transformers passes; accepted so templates that spell
    // it out still render.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                PrettyFormatter::with_indent(&pad),
            );
            value.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            value.serialize(&mut ser)
        }
    };
    result.map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: cannot serialize: {e}"),
        )
    })?;
    let text = String::from_utf8(out)
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "tojson: invalid UTF-8"))?;
    Ok(Value::from_safe_string(text))
}

/// Compact JSON with Python's default separators.
struct PythonFormatter;

/// `", "` before every item but the first, of arrays and objects alike.
fn item_separator<W: ?Sized + io::Write>(w: &mut W, first: bool) -> io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

impl Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn render(
        source: &str,
        messages: &[serde_json::Value],
        gen: bool,
    ) -> Result<String, TokenizerError> {
        ChatTemplate::new(source, "<s>", "</s>")?.render(&ChatInputs {
            messages,
            add_generation_prompt: gen,
            tools: None,
        })
    }

    #[test]
    fn chatml_two_turns_with_generation_prompt() {
        let messages = [
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "Hello!"}),
        ];
        assert_eq!(
            render(CHATML, &messages, true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!render(CHATML, &messages, false)
            .unwrap()
            .ends_with("assistant\n"));
    }

    #[test]
    fn python_string_methods_and_bos_eos_variables() {
        let source = "{{ bos_token }}{% for m in messages %}{{ m.content.strip().upper() }}{% if m.role.startswith('u') %}|u{% endif %}{% endfor %}{{ eos_token }}";
        let messages = [json!({"role": "user", "content": "  hey  "})];
        assert_eq!(render(source, &messages, false).unwrap(), "<s>HEY|u</s>");
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        let source = "{% for m in messages %}\n    {{ m.content }}\n{% endfor %}";
        let messages = [json!({"role": "user", "content": "a"})];
        assert_eq!(render(source, &messages, false).unwrap(), "    a\n");
    }

    #[test]
    fn raise_exception_becomes_a_template_error_with_its_message() {
        let source = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('Conversation must start with a system message') }}{% endif %}";
        let err = render(source, &[json!({"role": "user", "content": "x"})], false).unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)));
        assert_eq!(
            err.to_string(),
            "chat template error: Conversation must start with a system message (template line 1)"
        );
    }

    #[test]
    fn syntax_error_is_reported_at_compile_time() {
        let err = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)), "{err}");
        assert!(err.to_string().contains("syntax error"), "{err}");
        assert!(err.to_string().contains("chat:1"), "names the line: {err}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let source = "{{ messages[0] | tojson }}|{{ messages[0].content | tojson(indent=2) }}";
        let messages = [json!({"role": "user", "content": ["<b>", "é"]})];
        assert_eq!(
            render(source, &messages, false).unwrap(),
            "{\"role\": \"user\", \"content\": [\"<b>\", \"é\"]}|[\n  \"<b>\",\n  \"é\"\n]"
        );
    }

    #[test]
    fn strftime_now_formats_today() {
        let out = render("{{ strftime_now('%Y') }}", &[], false).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out.starts_with("20"), "{out}");
    }
}
