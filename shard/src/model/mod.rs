//! The model: its spec, weights and the batched forward pass.
//!
//! `arch` reads a file's metadata into a [`ModelSpec`]; `load` takes the tensors the spec
//! applies (refusing any it does not); `decoder` runs a ragged batch through it.

pub mod activation;
pub mod arch;
pub mod attention;
pub mod attention_device;
pub mod cpu_matmul;
pub mod decoder;
pub mod elementwise;
pub mod kv_cache;
pub mod layers;
pub mod load;
pub mod names;
pub mod rms_norm;
pub mod rope;
pub mod spec;
pub mod weights;

pub use decoder::{AttentionKernel, Model, SeqSpan, StepInput};
pub use kv_cache::{KvRows, SeqCache};
pub use load::Placement;
pub use spec::{Architecture, ModelSpec, RopeStyle};
pub use weights::WeightSource;
