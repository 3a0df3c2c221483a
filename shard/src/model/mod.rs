//! The model: its shape, weights and the batched forward pass.

pub mod attention;
pub mod config;
pub mod cpu_matmul;
pub mod kv_cache;
pub mod layers;
pub mod llama;
pub mod weights;

pub use config::{Architecture, ModelConfig, RopeStyle};
pub use kv_cache::SeqCache;
pub use llama::{Model, SeqSpan, StepInput};
pub use weights::{QuantPolicy, WeightSource};
