//! The shard's errors, and the one place they become gRPC statuses.

use tonic::{Code, Status};

/// Loading a model failed: the shard logs this one line and exits, and the launcher
/// exits with it. Every variant names the file, and the key or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{file}: {problem}")]
    Config { file: String, problem: String },
    #[error("{file}: metadata {key} {problem}")]
    Metadata {
        file: String,
        key: String,
        problem: String,
    },
    /// The file holds a tensor or a key this architecture's forward pass would ignore.
    #[error(
        "{file}: {what} is not applied by Sonde's {architecture} forward pass; \
         refusing to serve scores that would ignore it"
    )]
    NotApplied {
        file: String,
        what: Unapplied,
        architecture: String,
    },
    #[error(
        "{file}: architecture {found:?} is not supported (supported: {})",
        crate::model::Architecture::supported()
    )]
    UnsupportedArchitecture { file: String, found: String },
    #[error("{file}: {what}")]
    Unsupported { file: String, what: String },
    #[error("{file}: the model's hyperparameters are inconsistent: {problem}")]
    Spec { file: String, problem: String },
    #[error("{file}: tensor {tensor} is missing")]
    MissingTensor { file: String, tensor: String },
    #[error("{file}: tensor {tensor} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        file: String,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error(
        "{file}: tensor {tensor} is stored as {format}, which Sonde has no exact kernel for \
         (served exactly: {served}); requantize the file to one of those"
    )]
    UnsupportedFormat {
        file: String,
        tensor: String,
        format: String,
        served: String,
    },
    #[error("{file}: {problem}")]
    Corrupt { file: String, problem: String },
    #[error("{0} is neither a .gguf file nor a folder with config.json and *.safetensors")]
    UnknownFormat(String),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] sonde_tokenizer::TokenizerError),
    #[error("candle: {}", candle_message(.0))]
    Candle(#[from] candle_core::Error),
}

/// What [`LoadError::NotApplied`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unapplied {
    /// A metadata key of the architecture's namespace.
    Metadata(String),
    Tensor(String),
}

impl std::fmt::Display for Unapplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unapplied::Metadata(key) => write!(f, "metadata {key}"),
            Unapplied::Tensor(name) => write!(f, "tensor {name}"),
        }
    }
}

/// A candle error without the backtrace candle attaches when `RUST_BACKTRACE` is set, so
/// that a load error stays the one line the launcher prints.
pub fn candle_message(err: &candle_core::Error) -> String {
    match err {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        other => other.to_string(),
    }
}

/// A request to the engine failed. Client mistakes name the field and the limit.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The router sent something the shard cannot run.
    #[error("{0}")]
    InvalidRequest(String),
    /// A batch id the shard does not hold (never created, already cleared or merged).
    #[error("batch {0} is not cached on this shard")]
    UnknownBatch(u64),
    /// The KV cache budget cannot hold the batch; nothing was allocated.
    #[error(
        "batch needs {needed} KV cache tokens but only {available} of \
         --max-batch-total-tokens {budget} are free"
    )]
    OutOfBudget {
        needed: usize,
        available: usize,
        budget: usize,
    },
    /// The forward pass itself failed; the batch it ran is dropped.
    #[error("forward pass failed: {}", candle_message(.0))]
    Model(#[from] candle_core::Error),
    /// Sampling or scoring a row failed (a NaN row, say); the batch is dropped.
    #[error("scoring failed: {0}")]
    Scoring(String),
    /// The engine thread is gone (the shard is shutting down or crashed).
    #[error("the model thread has stopped")]
    EngineStopped,
}

impl From<EngineError> for Status {
    fn from(err: EngineError) -> Status {
        let code = match &err {
            EngineError::InvalidRequest(_) => Code::InvalidArgument,
            EngineError::UnknownBatch(_) => Code::NotFound,
            EngineError::OutOfBudget { .. } => Code::ResourceExhausted,
            EngineError::Model(_) | EngineError::Scoring(_) => Code::Internal,
            EngineError::EngineStopped => Code::Unavailable,
        };
        Status::new(code, err.to_string())
    }
}
