//! The gRPC client of the shards, the one place of the router that speaks protobuf. Every
//! batch call goes to every shard (tensor-parallel shards each hold a slice of the model);
//! the answer of rank 0 is the one used.

use std::path::{Path, PathBuf};

use futures::future::try_join_all;
use sonde_proto as pb;
use sonde_proto::text_generation_service_client::TextGenerationServiceClient;
use tonic::transport::Channel;

use crate::shard::{CachedBatch, NewBatch, Shard, ShardInfo, StepOutput};

mod convert;

type Client = TextGenerationServiceClient<Channel>;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("could not connect to the shard at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("shard {rank}: {message} ({code:?})")]
    Status {
        rank: usize,
        code: tonic::Code,
        message: String,
    },
    #[error("no shard to talk to")]
    NoShard,
}

impl ClientError {
    /// Whether the shard itself is gone or stuck (not merely refusing one request).
    pub fn shard_down(&self) -> bool {
        match self {
            ClientError::Connect { .. } | ClientError::NoShard => true,
            ClientError::Status { code, .. } => matches!(
                code,
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
            ),
        }
    }

    fn status(rank: usize, status: tonic::Status) -> Self {
        ClientError::Status {
            rank,
            code: status.code(),
            message: status.message().to_string(),
        }
    }
}

#[derive(Clone)]
pub struct ShardClients {
    clients: Vec<Client>,
}

impl ShardClients {
    pub async fn connect(prefix: &Path, num_shard: usize) -> Result<Self, ClientError> {
        let mut clients = Vec::with_capacity(num_shard);
        for rank in 0..num_shard {
            let path = pb::shard_socket(prefix, rank);
            let client = sonde_proto::connect_uds(&path)
                .await
                .map_err(|source| ClientError::Connect { path, source })?;
            clients.push(client);
        }
        if clients.is_empty() {
            return Err(ClientError::NoShard);
        }
        Ok(Self { clients })
    }

    pub fn num_shard(&self) -> usize {
        self.clients.len()
    }

    /// Sends one call to every shard at once and keeps rank 0's answer.
    async fn all<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let calls = self.clients.iter().enumerate().map(|(rank, client)| {
            let fut = call(client.clone());
            async move { fut.await.map_err(|s| ClientError::status(rank, s)) }
        });
        let mut answers = try_join_all(calls).await?;
        if answers.is_empty() {
            return Err(ClientError::NoShard);
        }
        Ok(answers.swap_remove(0).into_inner())
    }
}

impl Shard for ShardClients {
    async fn health(&self) -> Result<(), ClientError> {
        self.all(|mut c| async move { c.health(pb::HealthRequest {}).await })
            .await
            .map(|_| ())
    }

    async fn info(&self) -> Result<ShardInfo, ClientError> {
        self.all(|mut c| async move { c.info(pb::InfoRequest {}).await })
            .await
            .map(convert::info)
    }

    async fn warmup(&self, tokens: u32) -> Result<u32, ClientError> {
        let request = pb::WarmupRequest {
            max_input_tokens: tokens,
            max_prefill_tokens: tokens,
        };
        let answer = self
            .all(|mut c| async move { c.warmup(request).await })
            .await?;
        Ok(answer.max_batch_total_tokens)
    }

    async fn prefill(&self, batch: NewBatch) -> Result<StepOutput, ClientError> {
        let batch = convert::batch(&batch);
        let answer = self
            .all(|mut c| {
                let batch = batch.clone();
                async move { c.prefill(pb::PrefillRequest { batch: Some(batch) }).await }
            })
            .await?;
        Ok(convert::step(answer))
    }

    async fn decode(&self, batches: Vec<CachedBatch>) -> Result<StepOutput, ClientError> {
        let batches: Vec<pb::CachedBatch> =
            batches.into_iter().map(convert::cached_to_proto).collect();
        let answer = self
            .all(|mut c| {
                let batches = batches.clone();
                async move { c.decode(pb::DecodeRequest { batches }).await }
            })
            .await?;
        Ok(convert::step(answer))
    }

    async fn filter(
        &self,
        batch_id: u64,
        request_ids: Vec<u64>,
    ) -> Result<CachedBatch, ClientError> {
        let answer = self
            .all(|mut c| {
                let request_ids = request_ids.clone();
                async move {
                    c.filter_batch(pb::FilterBatchRequest {
                        batch_id,
                        request_ids,
                    })
                    .await
                }
            })
            .await?;
        answer
            .batch
            .map(convert::cached)
            .ok_or(ClientError::Status {
                rank: 0,
                code: tonic::Code::Internal,
                message: "FilterBatch answered no batch".to_string(),
            })
    }

    async fn clear(&self, id: Option<u64>) -> Result<(), ClientError> {
        self.all(|mut c| async move { c.clear_cache(pb::ClearCacheRequest { id }).await })
            .await
            .map(|_| ())
    }
}
