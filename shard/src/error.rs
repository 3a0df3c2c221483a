//! The shard's errors, and the one place they become gRPC statuses.

use tonic::{Code, Status};

/// Loading a model failed: the launcher shows this and exits.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("architecture {0:?} is not supported (supported: llama, mistral, qwen2)")]
    UnsupportedArchitecture(String),
    #[error("weights: {0}")]
    MissingTensor(String),
    #[error("{0} is neither a .gguf file nor a folder with config.json and *.safetensors")]
    UnknownFormat(String),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] sonde_tokenizer::TokenizerError),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
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
    #[error("forward pass failed: {0}")]
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
