//! The gRPC client of the shards. Every batch call goes to every shard (tensor-parallel
//! shards each hold a slice of the model); the answer of rank 0 is the one used.

use std::path::{Path, PathBuf};

use futures::future::try_join_all;
use sonde_proto as pb;
use sonde_proto::text_generation_service_client::TextGenerationServiceClient;
use tonic::transport::Channel;

use crate::infer::{FinishReason, LogprobsMode, Sampling, TokenScore, ValidRequest};

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

    pub async fn info(&self) -> Result<pb::InfoResponse, ClientError> {
        self.all(|mut c| async move { c.info(pb::InfoRequest {}).await })
            .await
    }

    pub async fn health(&self) -> Result<(), ClientError> {
        self.all(|mut c| async move { c.health(pb::HealthRequest {}).await })
            .await
            .map(|_| ())
    }

    pub async fn warmup(
        &self,
        max_input_tokens: u32,
        max_prefill_tokens: u32,
    ) -> Result<u32, ClientError> {
        let request = pb::WarmupRequest {
            max_input_tokens,
            max_prefill_tokens,
        };
        let answer = self
            .all(|mut c| async move { c.warmup(request).await })
            .await?;
        Ok(answer.max_batch_total_tokens)
    }

    pub async fn prefill(&self, batch: pb::Batch) -> Result<pb::PrefillResponse, ClientError> {
        self.all(|mut c| {
            let batch = batch.clone();
            async move { c.prefill(pb::PrefillRequest { batch: Some(batch) }).await }
        })
        .await
    }

    pub async fn decode(
        &self,
        batches: Vec<pb::CachedBatch>,
    ) -> Result<pb::DecodeResponse, ClientError> {
        self.all(|mut c| {
            let batches = batches.clone();
            async move { c.decode(pb::DecodeRequest { batches }).await }
        })
        .await
    }

    pub async fn filter(
        &self,
        batch_id: u64,
        request_ids: Vec<u64>,
    ) -> Result<pb::CachedBatch, ClientError> {
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
        answer.batch.ok_or(ClientError::Status {
            rank: 0,
            code: tonic::Code::Internal,
            message: "FilterBatch answered no batch".to_string(),
        })
    }

    pub async fn clear(&self, id: Option<u64>) -> Result<(), ClientError> {
        self.all(|mut c| async move { c.clear_cache(pb::ClearCacheRequest { id }).await })
            .await
            .map(|_| ())
    }
}

/// The protobuf form of a validated request.
pub fn to_proto(id: u64, r: &ValidRequest) -> pb::Request {
    let mut sampling = pb::SamplingParameters {
        repetition_penalty: r.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: r.frequency_penalty.unwrap_or(0.0),
        ..Default::default()
    };
    if let Sampling::Sample {
        temperature,
        top_k,
        top_p,
        typical_p,
        seed,
    } = r.sampling
    {
        sampling.do_sample = true;
        sampling.temperature = temperature;
        sampling.top_k = top_k.unwrap_or(0);
        sampling.top_p = top_p.unwrap_or(1.0);
        sampling.typical_p = typical_p.unwrap_or(1.0);
        sampling.seed = seed;
    }
    pb::Request {
        id,
        input_ids: r.input_ids.clone(),
        sampling: Some(sampling),
        stopping: Some(pb::StoppingParameters {
            max_new_tokens: r.max_new_tokens,
            stop_token_ids: Vec::new(),
            ignore_eos_token: false,
        }),
        scores: Some(pb::ScoreOptions {
            top_n_tokens: r.scores.top_n,
            prefill_logprobs: r.scores.prefill_logprobs,
            logprobs_mode: match r.scores.mode {
                LogprobsMode::Raw => pb::LogprobsMode::Raw,
                LogprobsMode::Processed => pb::LogprobsMode::Processed,
            } as i32,
            return_logits: r.scores.return_logits,
            logprob_token_ids: r.scores.label_ids.clone(),
        }),
    }
}

pub fn token_score(t: pb::TokenScores) -> TokenScore {
    TokenScore {
        id: t.id,
        logprob: t.logprob,
        logit: t.logit,
        rank: t.rank,
        top: t.top_ids.into_iter().zip(t.top_logprobs).collect(),
        labels: t.label_logprobs,
    }
}

pub fn finish_reason(raw: i32) -> Option<FinishReason> {
    match pb::FinishReason::try_from(raw).ok()? {
        pb::FinishReason::Unspecified => None,
        pb::FinishReason::Length => Some(FinishReason::Length),
        pb::FinishReason::EosToken => Some(FinishReason::EosToken),
        pb::FinishReason::StopToken => Some(FinishReason::StopSequence),
    }
}
