//! Sonde's launcher: resolves the model (local, `gs://`, Hugging Face Hub), starts the
//! shards, waits for them, starts the router, forwards their logs, and supervises them
//! (restarting a dead shard, draining on SIGTERM). Its HTTP port answers 503 from the
//! start until the router takes it over.

pub mod args;
pub mod child;
pub mod config;
pub mod liveness;
pub mod loading;
pub mod model;
pub mod supervisor;
