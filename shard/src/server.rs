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

use crate::engine::{Engine, PrefixStats, StepOutput, MAX_LABEL_TOKENS, PREFIX_BLOCK_TOKENS};
use crate::error::EngineError;

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

enum Command {
    Info(Reply<pb::InfoResponse>),
    Warmup(pb::WarmupRequest, Reply<pb::WarmupResponse>),
    Prefill(pb::Batch, Reply<StepOutput>),
    Decode(Vec<u64>, Reply<StepOutput>),
    Filter(u64, Vec<u64>, Reply<pb::CachedBatch>),
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
    // The engine thread becomes worker 0 of the pool its kernels split work over, so a
    // parallel matmul is a work-stealing `join` from inside the pool rather than a job
    // injected from outside it: outside, every one of a decode step's ~150 parallel
    // products put this thread to sleep on a lock and woke it again (a quarter of a
    // single-stream step went to futex waits and context switches). The pool has one
    // thread per CPU in all, this one included.
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
                let _ = reply.send(Ok(info(&engine)));
            }
            Command::Warmup(req, reply) => {
                let _ = reply.send(engine.warmup(&req));
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

fn info(engine: &Engine) -> pb::InfoResponse {
    let f = engine.facts();
    pb::InfoResponse {
        model_id: f.model_id.clone(),
        architecture: f.architecture.clone(),
        weights_format: f.weights_format.clone(),
        dtype: f.dtype.clone(),
        device: f.device.clone(),
        vocab_size: f.vocab_size as u32,
        eos_token_ids: f.eos_token_ids.clone(),
        bos_token_id: f.bos_token_id,
        max_context: f.max_context as u32,
        max_batch_total_tokens: engine.config().max_batch_total_tokens as u32,
        max_label_tokens: MAX_LABEL_TOKENS as u32,
        prefix_caching: engine.prefix_caching(),
        prefix_block_tokens: PREFIX_BLOCK_TOKENS as u32,
    }
}

fn prefix_stats(s: PrefixStats) -> pb::PrefixCacheStats {
    pb::PrefixCacheStats {
        hit_tokens: s.hit_tokens,
        evicted_tokens: s.evicted_tokens,
        cached_tokens: s.cached_tokens,
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
        Ok(Response::new(
            self.engine.call(|r| Command::Warmup(req, r)).await?,
        ))
    }

    async fn prefill(
        &self,
        request: Request<pb::PrefillRequest>,
    ) -> Result<Response<pb::PrefillResponse>, Status> {
        let started = Instant::now();
        let batch = request
            .into_inner()
            .batch
            .ok_or_else(|| Status::invalid_argument("PrefillRequest has no batch"))?;
        let out = self.engine.call(|r| Command::Prefill(batch, r)).await?;
        Ok(Response::new(pb::PrefillResponse {
            generations: out.generations,
            batch: out.batch,
            forward_ns: out.forward_ns,
            total_ns: started.elapsed().as_nanos() as u64,
            prefix_cache: Some(prefix_stats(out.prefix)),
        }))
    }

    async fn decode(
        &self,
        request: Request<pb::DecodeRequest>,
    ) -> Result<Response<pb::DecodeResponse>, Status> {
        let started = Instant::now();
        let ids = request.into_inner().batches.iter().map(|b| b.id).collect();
        let out = self.engine.call(|r| Command::Decode(ids, r)).await?;
        Ok(Response::new(pb::DecodeResponse {
            generations: out.generations,
            batch: out.batch,
            forward_ns: out.forward_ns,
            total_ns: started.elapsed().as_nanos() as u64,
        }))
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
            batch: Some(batch),
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
