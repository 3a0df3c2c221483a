//! Sonde's router: the HTTP front (TGI `/generate`, Vertex AI predict, OpenAI `/v1/*`)
//! that validates, tokenizes, batches continuously and streams scores from the shards.

pub mod client;
pub mod config;
pub mod docs;
pub mod error;
pub mod generation;
pub mod http;
pub mod infer;
pub mod json;
pub mod metrics;
pub mod middleware;
pub mod openai;
pub mod ops;
pub mod request;
pub mod scheduler;
pub mod score;
pub mod server;
pub mod shard;
pub mod sse;
pub mod startup;
pub mod state;
pub mod tgi;
pub mod tokens;
pub mod validation;
pub mod vertex;

#[cfg(test)]
mod test_support;
