//! OpenAI's wire types for `/v1/completions`, `/v1/chat/completions` and `/v1/models`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// A string or a list of strings (`stop`). Read by hand, like [`PromptInput`], so a wrong
/// shape gets a sentence naming both.
#[derive(Debug, Clone)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for StringOrList {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(s) => Some(StringOrList::One(s)),
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Some(s),
                    _ => None,
                })
                .collect::<Option<_>>()
                .map(StringOrList::Many),
            _ => None,
        }
        .ok_or_else(|| serde::de::Error::custom("must be a string or a list of strings"))
    }
}

impl StringOrList {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StringOrList::One(s) => vec![s],
            StringOrList::Many(v) => v,
        }
    }
}

/// `prompt` of `/v1/completions`: one prompt or several, each text or token ids, as
/// OpenAI takes them. Read by hand so a wrong shape gets a sentence naming the shapes,
/// not serde's "did not match any variant".
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Texts(Vec<String>),
    TokenIds(Vec<Vec<i64>>),
}

impl PromptInput {
    pub const SHAPES: &'static str =
        "a string, a list of strings, a list of token ids or a list of token-id lists";

    fn from_json(value: Value) -> Option<Self> {
        let ids =
            |v: &Value| -> Option<Vec<i64>> { v.as_array()?.iter().map(Value::as_i64).collect() };
        match value {
            Value::String(s) => Some(PromptInput::Texts(vec![s])),
            Value::Array(items) => match items.first() {
                // An empty list is a list of no prompts, refused with its own sentence.
                None => Some(PromptInput::Texts(Vec::new())),
                Some(Value::String(_)) => items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Some(s),
                        _ => None,
                    })
                    .collect::<Option<_>>()
                    .map(PromptInput::Texts),
                Some(Value::Number(_)) => {
                    ids(&Value::Array(items)).map(|p| PromptInput::TokenIds(vec![p]))
                }
                Some(Value::Array(_)) => items
                    .iter()
                    .map(ids)
                    .collect::<Option<_>>()
                    .map(PromptInput::TokenIds),
                Some(_) => None,
            },
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for PromptInput {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        PromptInput::from_json(value)
            .ok_or_else(|| serde::de::Error::custom(format!("must be {}", PromptInput::SHAPES)))
    }
}

/// The OpenAPI schema of `prompt`: its four shapes.
fn prompt_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    let string = || ObjectBuilder::new().schema_type(Type::String);
    let integer = || ObjectBuilder::new().schema_type(Type::Integer);
    let one_of = OneOfBuilder::new()
        .item(string())
        .item(ArrayBuilder::new().items(string()))
        .item(ArrayBuilder::new().items(integer()))
        .item(ArrayBuilder::new().items(ArrayBuilder::new().items(integer())))
        .build();
    Schema::OneOf(one_of)
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Declares an OpenAI request with its own fields first, then the fields completions and
/// chat share, and `take_shared` to check and convert those once (`super::Shared`). A
/// macro rather than `#[serde(flatten)]`: serde's `deny_unknown_fields`, which names an
/// unknown field back to the client, does not work together with `flatten`.
macro_rules! openai_request {
    ($(#[$meta:meta])* pub struct $name:ident { $($own:tt)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($own)*
            pub model: Option<String>,
            pub temperature: Option<f64>,
            pub top_p: Option<f64>,
            pub n: Option<i64>,
            #[serde(default)]
            pub stream: bool,
            pub stream_options: Option<StreamOptions>,
            #[schema(value_type = Option<Vec<String>>)]
            pub stop: Option<StringOrList>,
            pub seed: Option<u64>,
            pub frequency_penalty: Option<f64>,
            pub presence_penalty: Option<f64>,
            #[schema(value_type = Option<Object>)]
            pub logit_bias: Option<Value>,
            pub user: Option<String>,
        }

        impl $name {
            /// The shared sampling fields, moved out of the request.
            pub(crate) fn take_shared(&mut self) -> super::Shared {
                super::Shared {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    n: self.n,
                    stop: self.stop.take(),
                    seed: self.seed,
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    logit_bias: self.logit_bias.take(),
                }
            }
        }
    };
}

openai_request! {
    pub struct CompletionRequest {
        /// A string, a list of strings, a list of token ids or a list of token-id lists: one
        /// choice per prompt (times `n`), in order. Token ids are taken as they are (no BOS
        /// added).
        #[schema(schema_with = prompt_schema)]
        pub prompt: PromptInput,
        /// Default 16 (OpenAI's); 0 with `echo` and `logprobs` scores the prompt.
        pub max_tokens: Option<i64>,
        /// Top alternatives per position (0 = only the chosen token's logprob).
        pub logprobs: Option<i64>,
        /// Prepend the prompt (and with `logprobs`, its scores: needs --enable-prefill-logprobs).
        #[serde(default)]
        pub echo: bool,
        /// Only 1 is supported.
        pub best_of: Option<i64>,
        pub suffix: Option<String>,
    }
}

openai_request! {
    pub struct ChatRequest {
        /// `[{"role", "content"}]`, rendered with the model's chat template.
        #[schema(value_type = Vec<Object>)]
        pub messages: Vec<Value>,
        pub max_tokens: Option<i64>,
        pub max_completion_tokens: Option<i64>,
        /// Return the chosen tokens' logprobs.
        #[serde(default)]
        pub logprobs: bool,
        /// Alternatives per position (needs `logprobs: true`).
        pub top_logprobs: Option<i64>,
        #[schema(value_type = Option<Object>)]
        pub response_format: Option<Value>,
        #[schema(value_type = Option<Vec<Object>>)]
        pub tools: Option<Value>,
        #[schema(value_type = Option<Object>)]
        pub tool_choice: Option<Value>,
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens the prefix cache supplied instead of computing them (a prompt with
    /// several choices counts once, as its first choice found it).
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// null for the first prompt token (with `echo`).
    pub token_logprobs: Vec<Option<f32>>,
    /// Alternatives keyed by their text, as OpenAI defines it: two ids with the same
    /// text keep the more likely one.
    #[schema(value_type = Vec<Option<Object>>)]
    pub top_logprobs: Vec<Option<indexmap_like::TopMap>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<u32>,
}

/// An ordered map for `top_logprobs`, serialized as a JSON object in rank order.
pub mod indexmap_like {
    pub type TopMap = serde_json::Map<String, serde_json::Value>;
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` (eos or a stop sequence), `length`, or null while streaming.
    pub finish_reason: Option<String>,
}

/// What every OpenAI answer and stream chunk starts with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Header {
    pub id: String,
    /// `text_completion`, `chat.completion` or `chat.completion.chunk`.
    pub object: String,
    pub created: u64,
    pub model: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionResponse {
    #[serde(flatten)]
    pub header: Header,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    /// Sonde: the token id, so distinct ids with the same text stay distinct.
    pub id: u32,
}

/// The chosen token, and its alternatives.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatTokenLogprob {
    #[serde(flatten)]
    pub chosen: TopLogprob,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatResponse {
    #[serde(flatten)]
    pub header: Header,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChunk {
    #[serde(flatten)]
    pub header: Header,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Model {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<Model>,
}
