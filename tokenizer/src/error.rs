//! The crate's one error type. The router maps it to HTTP: `Template` and `NoChatTemplate`
//! answer a chat request the model cannot render (422); `Tokenizers` from encode/decode
//! is the server's fault; the others happen while loading a model, at startup.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("invalid GGUF metadata: {0}")]
    Gguf(String),

    /// A metadata key the tokenizer needs is absent or has the wrong type.
    #[error("GGUF metadata key `{key}`: {problem}")]
    Metadata { key: String, problem: String },

    #[error(
        "tokenizer model `{found}` (tokenizer.ggml.model) is not supported; supported: {supported}"
    )]
    UnsupportedModel { found: String, supported: String },

    #[error(
        "pre-tokenizer `{found}` (tokenizer.ggml.pre) is not supported; supported: {supported}"
    )]
    UnsupportedPreTokenizer { found: String, supported: String },

    #[error("invalid Hugging Face tokenizer files in {dir}: {problem}")]
    HfFiles { dir: PathBuf, problem: String },

    /// Building or running the `tokenizers` pipeline failed.
    #[error("tokenizer: {0}")]
    Tokenizers(String),

    /// The chat template failed to parse or to render for the given messages; the
    /// router answers 422 with this sentence.
    #[error("chat template error: {0}")]
    Template(String),

    #[error("the model has no chat template; send a raw prompt instead of messages")]
    NoChatTemplate,
}

impl From<tokenizers::Error> for TokenizerError {
    fn from(err: tokenizers::Error) -> Self {
        TokenizerError::Tokenizers(err.to_string())
    }
}
