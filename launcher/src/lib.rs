//! Sonde's launcher: resolves the model (local, `gs://`, Hugging Face Hub), starts the
//! shards, waits for them, starts the router, forwards their logs, and supervises them
//! (restarting a dead shard, draining on SIGTERM).

pub mod args;
pub mod child;
pub mod config;
pub mod liveness;
pub mod model;
pub mod supervisor;
