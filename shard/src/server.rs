//! The gRPC face of the shard. Handlers forward each call to the one engine thread that
//! owns the model and the caches, and await its answer; nothing is shared behind locks.

use std::future::Future;
use std::path::PathBuf;
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use sonde_proto as pb;
use sonde_proto::text_generation_service_server::{
    TextGenerationService, TextGenerationServiceServer,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::engine::types::{Batch, CachedBatch};
use crate::engine::{Engine, StepOutput};
use crate::error::EngineError;
use crate::wire;

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

enum Command {
    Info(Reply<pb::InfoResponse>),
    /// Longest prompt and prompt tokens in all; answers the KV budget.
    Warmup(usize, usize, Reply<usize>),
    Prefill(Batch, Reply<StepOutput>),
    Decode(Vec<u64>, Reply<StepOutput>),
    Filter(u64, Vec<u64>, Reply<CachedBatch>),
    Clear(Option<u64>, Reply<()>),
}

/// A cloneable handle to the engine thread. The thread ends when every handle is dropped.
#[derive(Clone)]
pub struct EngineHandle {
    tx: std_mpsc::Sender<Command>,
}

impl EngineHandle {
    /// Moves the engine onto its own OS thread: forward passes are long, blocking CPU work
    /// that must not stall the async runtime serving gRPC.
    pub fn spawn(engine: Engine) -> std::io::Result<Self> {
        let (tx, rx) = std_mpsc::channel();
        std::thread::Builder::new()
            .name("sonde-engine".into())
            .spawn(move || run_engine(engine, rx))?;
        Ok(EngineHandle { tx })
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .map_err(|_| EngineError::EngineStopped)?;
        rx.await.map_err(|_| EngineError::EngineStopped)?
    }
}

fn run_engine(mut engine: Engine, rx: std_mpsc::Receiver<Command>) {
    // The engine thread becomes worker 0 of the pool its parallel loops run on (sampling
    // and scoring a decode step's rows), so a loop is a work-stealing `join` from inside
    // the pool rather than a job injected from outside it: outside, every join put this
    // thread to sleep on a lock and woke it again (when the matmuls still ran on rayon, a
    // quarter of a single-stream step went to futex waits and context switches; they and
    // attention now run on their own team, `crate::team`). The pool has one thread per CPU
    // in all, this one included.
    let _pool = match rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("sonde-engine-{i}"))
        .use_current_thread()
        .build()
    {
        Ok(pool) => Some(pool),
        Err(e) => {
            tracing::warn!("engine thread pool: {e}; using rayon's global pool");
            None
        }
    };
    while let Ok(cmd) = rx.recv() {
        // A reply whose caller went away (client disconnected) is simply dropped.
        match cmd {
            Command::Info(reply) => {
                let _ = reply.send(Ok(wire::info(&engine)));
            }
            Command::Warmup(input, prefill, reply) => {
                let _ = reply.send(engine.warmup(input, prefill));
            }
            Command::Prefill(batch, reply) => {
                let _ = reply.send(engine.prefill(batch));
            }
            Command::Decode(ids, reply) => {
                let _ = reply.send(engine.decode(&ids));
            }
            Command::Filter(id, keep, reply) => {
                let _ = reply.send(engine.filter(id, &keep));
            }
            Command::Clear(id, reply) => {
                engine.clear(id);
                let _ = reply.send(Ok(()));
            }
        }
    }
}

struct Service {
    engine: EngineHandle,
}

#[tonic::async_trait]
impl TextGenerationService for Service {
    async fn info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        Ok(Response::new(self.engine.call(Command::Info).await?))
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        // The server only listens once the model is loaded.
        Ok(Response::new(pb::HealthResponse {}))
    }

    async fn warmup(
        &self,
        request: Request<pb::WarmupRequest>,
    ) -> Result<Response<pb::WarmupResponse>, Status> {
        let req = request.into_inner();
        let (input, prefill) = (
            req.max_input_tokens as usize,
            req.max_prefill_tokens as usize,
        );
        let budget = self
            .engine
            .call(|r| Command::Warmup(input, prefill, r))
            .await?;
        Ok(Response::new(pb::WarmupResponse {
            max_batch_total_tokens: budget as u32,
        }))
    }

    async fn prefill(
        &self,
        request: Request<pb::PrefillRequest>,
    ) -> Result<Response<pb::StepResponse>, Status> {
        let started = Instant::now();
        let batch = request
            .into_inner()
            .batch
            .ok_or_else(|| Status::invalid_argument("PrefillRequest has no batch"))?;
        let batch = wire::batch(batch)?;
        let out = self.engine.call(|r| Command::Prefill(batch, r)).await?;
        Ok(Response::new(wire::step(out, started.elapsed())))
    }

    async fn decode(
        &self,
        request: Request<pb::DecodeRequest>,
    ) -> Result<Response<pb::StepResponse>, Status> {
        let started = Instant::now();
        let ids = request.into_inner().batches.iter().map(|b| b.id).collect();
        let out = self.engine.call(|r| Command::Decode(ids, r)).await?;
        Ok(Response::new(wire::step(out, started.elapsed())))
    }

    async fn filter_batch(
        &self,
        request: Request<pb::FilterBatchRequest>,
    ) -> Result<Response<pb::FilterBatchResponse>, Status> {
        let req = request.into_inner();
        let batch = self
            .engine
            .call(|r| Command::Filter(req.batch_id, req.request_ids, r))
            .await?;
        Ok(Response::new(pb::FilterBatchResponse {
            batch: Some(wire::cached(batch)),
        }))
    }

    async fn clear_cache(
        &self,
        request: Request<pb::ClearCacheRequest>,
    ) -> Result<Response<pb::ClearCacheResponse>, Status> {
        let id = request.into_inner().id;
        self.engine.call(|r| Command::Clear(id, r)).await?;
        Ok(Response::new(pb::ClearCacheResponse {}))
    }
}

pub struct ServeConfig {
    /// The Unix socket to listen on; a stale file there is replaced.
    pub uds_path: PathBuf,
}

/// Serves the engine on a Unix socket until `shutdown` resolves.
pub async fn serve(
    cfg: ServeConfig,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let handle = EngineHandle::spawn(engine)?;
    if cfg.uds_path.exists() {
        std::fs::remove_file(&cfg.uds_path)?;
    }
    let listener = tokio::net::UnixListener::bind(&cfg.uds_path)?;
    tracing::info!(socket = %cfg.uds_path.display(), "shard listening");
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let service = TextGenerationServiceServer::new(Service { engine: handle })
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(256 << 20);
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    let _ = std::fs::remove_file(&cfg.uds_path);
    Ok(())
}
