//! What validation found wrong, in terms of `Field`s; each API words it with its own
//! field names (`FieldNames`), so no API's message is another's rewritten.

use crate::error::ApiError;

/// A field of `GenerationSpec`, whatever an API calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Prompt,
    MaxNewTokens,
    Temperature,
    TopK,
    TopP,
    TypicalP,
    RepetitionPenalty,
    FrequencyPenalty,
    Stop,
    Truncate,
    TopNTokens,
    Generations,
    PrefillLogprobs,
    LabelIds,
}

impl Field {
    /// The name used when an API has none of its own (TGI's, which Sonde's docs use).
    pub fn neutral_name(self) -> &'static str {
        match self {
            Field::Prompt => "inputs",
            Field::MaxNewTokens => "max_new_tokens",
            Field::Temperature => "temperature",
            Field::TopK => "top_k",
            Field::TopP => "top_p",
            Field::TypicalP => "typical_p",
            Field::RepetitionPenalty => "repetition_penalty",
            Field::FrequencyPenalty => "frequency_penalty",
            Field::Stop => "stop",
            Field::Truncate => "truncate",
            Field::TopNTokens => "top_n_tokens",
            Field::Generations => "best_of",
            Field::PrefillLogprobs => "decoder_input_details",
            Field::LabelIds => "logprob_token_ids",
        }
    }
}

/// What one API calls the fields it has. `None`: the API has no such field, so a message
/// leaves out hints about it.
pub trait FieldNames: Sync {
    fn name(&self, field: Field) -> Option<&'static str>;
}

/// One rule a request broke, with the numbers a message needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Violation {
    /// An integer outside `min..=max`; `flag` is the server flag that sets the bound.
    IntRange {
        field: Field,
        min: i64,
        max: i64,
        flag: Option<&'static str>,
        got: i64,
    },
    FloatRange {
        field: Field,
        min: f64,
        max: f64,
        got: f64,
    },
    /// An integer that must be > 0.
    NotPositive {
        field: Field,
        got: i64,
    },
    /// A number that must stay finite and > 0 once the shard holds it as an f32 (1e-300
    /// would become 0 and 1e300 infinity).
    NotPositiveF32 {
        field: Field,
        got: f64,
    },
    /// Must be in (0, 1] as an f32; 1.0 is "off".
    NotProbability {
        field: Field,
        got: f64,
    },
    TooMany {
        field: Field,
        max: usize,
        unit: &'static str,
        flag: Option<&'static str>,
        got: usize,
    },
    EmptyItem {
        field: Field,
        index: usize,
    },
    ItemTooLong {
        field: Field,
        index: usize,
        max_bytes: usize,
        got: usize,
    },
    OutsideVocabulary {
        field: Field,
        id: i64,
        vocab: u32,
    },
    PrefillNotEnabled,
    Untokenizable(String),
    EmptyPrompt,
    PromptTooLong {
        max: u32,
        got: u32,
    },
    OverTotalTokens {
        max: u32,
        prompt: u32,
        new: u32,
    },
    OverKvBudget {
        max: u32,
        prompt: u32,
        new: u32,
    },
    /// `max_new_tokens` 0 without prompt logprobs: nothing to compute.
    NothingToDo,
}

impl Violation {
    /// The field the client should change.
    pub fn field(&self) -> Field {
        match self {
            Violation::IntRange { field, .. }
            | Violation::FloatRange { field, .. }
            | Violation::NotPositive { field, .. }
            | Violation::NotPositiveF32 { field, .. }
            | Violation::NotProbability { field, .. }
            | Violation::TooMany { field, .. }
            | Violation::EmptyItem { field, .. }
            | Violation::ItemTooLong { field, .. }
            | Violation::OutsideVocabulary { field, .. } => *field,
            Violation::PrefillNotEnabled => Field::PrefillLogprobs,
            Violation::Untokenizable(_)
            | Violation::EmptyPrompt
            | Violation::PromptTooLong { .. }
            | Violation::OverTotalTokens { .. }
            | Violation::OverKvBudget { .. } => Field::Prompt,
            Violation::NothingToDo => Field::MaxNewTokens,
        }
    }

    /// The message, in the API's words.
    pub fn sentence(&self, names: &dyn FieldNames) -> String {
        let name = |f: Field| names.name(f).unwrap_or(f.neutral_name());
        let flag =
            |flag: &Option<&'static str>| flag.map(|f| format!(" ({f})")).unwrap_or_default();
        let (prompt, new) = (name(Field::Prompt), name(Field::MaxNewTokens));
        match self {
            Violation::IntRange {
                field,
                min,
                max,
                flag: f,
                got,
            } => format!(
                "`{}` must be between {min} and {max}{}, got {got}",
                name(*field),
                flag(f)
            ),
            Violation::FloatRange {
                field,
                min,
                max,
                got,
            } => format!(
                "`{}` must be between {min:?} and {max:?}, got {got}",
                name(*field)
            ),
            Violation::NotPositive { field, got } => {
                format!("`{}` must be > 0, got {got}", name(*field))
            }
            Violation::NotPositiveF32 { field, got } => format!(
                "`{}` must be a finite number > 0 (as a 32-bit float), got {got}",
                name(*field)
            ),
            Violation::NotProbability { field, got } => format!(
                "`{}` must be > 0 (as a 32-bit float) and <= 1.0 (1.0 is off), got {got}",
                name(*field)
            ),
            Violation::TooMany {
                field,
                max,
                unit,
                flag: f,
                got,
            } => format!(
                "`{}` must have at most {max} {unit}{}, got {got}",
                name(*field),
                flag(f)
            ),
            Violation::EmptyItem { field, index } => {
                format!("`{}[{index}]` must not be empty", name(*field))
            }
            Violation::ItemTooLong {
                field,
                index,
                max_bytes,
                got,
            } => format!(
                "`{}[{index}]` must be at most {max_bytes} bytes, got {got}",
                name(*field)
            ),
            Violation::OutsideVocabulary { field, id, vocab } => format!(
                "`{}` holds {id}, outside the vocabulary (0..{vocab})",
                name(*field)
            ),
            Violation::PrefillNotEnabled => format!(
                "`{}` (prompt logprobs) needs the server started with --enable-prefill-logprobs",
                name(Field::PrefillLogprobs)
            ),
            Violation::Untokenizable(e) => format!("`{prompt}` could not be tokenized: {e}"),
            Violation::EmptyPrompt => format!("`{prompt}` must not be empty: it has 0 tokens"),
            Violation::PromptTooLong { max, got } => {
                let hint = names
                    .name(Field::Truncate)
                    .map(|t| format!("; `{t}` keeps the last N"))
                    .unwrap_or_default();
                format!(
                    "`{prompt}` must have at most {max} tokens (--max-input-tokens). Given: {got}{hint}"
                )
            }
            Violation::OverTotalTokens {
                max,
                prompt: p,
                new: n,
            } => format!(
                "`{prompt}` tokens + `{new}` must be <= {max} (--max-total-tokens). Given: {p} \
                 `{prompt}` tokens and {n} `{new}`"
            ),
            Violation::OverKvBudget {
                max,
                prompt: p,
                new: n,
            } => format!(
                "`{prompt}` tokens + `{new}` must be <= {max} (the shard's --max-batch-total-tokens). \
                 Given: {p} + {n}"
            ),
            Violation::NothingToDo => match names.name(Field::PrefillLogprobs) {
                Some(prefill) => format!(
                    "`{new}` is 0 (the prompt leaves no room, or it was asked for); 0 is allowed \
                     only with `{prefill}` (pure scoring)"
                ),
                None => format!(
                    "`{new}` is 0 (the prompt leaves no room, or it was asked for); it must be >= 1"
                ),
            },
        }
    }
}

/// Why a spec was not accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecError {
    Invalid(Violation),
    /// A bug of ours (the tokenizer task died), never the client's mistake.
    Internal(String),
}

impl SpecError {
    /// The HTTP error, worded with the API's field names.
    pub fn in_words(self, names: &dyn FieldNames) -> ApiError {
        match self {
            SpecError::Invalid(v) => ApiError::Validation(v.sentence(names)),
            SpecError::Internal(m) => ApiError::Internal(m),
        }
    }
}

impl From<Violation> for SpecError {
    fn from(v: Violation) -> Self {
        SpecError::Invalid(v)
    }
}
