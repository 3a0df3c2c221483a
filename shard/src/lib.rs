//! Sonde's shard: loads a Llama-family model, runs batches of sequences through it,
//! samples, and computes the token scores the router serves.

pub mod engine;
pub mod error;
mod fastmath;
pub mod loader;
pub mod model;
pub mod sampling;
pub mod server;
mod team;
mod wire;
