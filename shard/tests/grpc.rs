//! The shard over real gRPC on a Unix socket, with the real model: each test starts its own
//! server in-process (`sonde_shard::server::serve`) and talks to it through
//! `sonde_proto::connect_uds`, the client the router uses.
// The harness below is test code too: a failed step should fail the test right there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{engine, gguf_path};
use sonde_proto as pb;
use sonde_proto::text_generation_service_client::TextGenerationServiceClient;
use sonde_shard::server::{serve, ServeConfig};
use sonde_tokenizer::ModelTokenizer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::Code;

type Client = TextGenerationServiceClient<Channel>;

const VOCAB: u32 = 49_152;
const CHAT_PROMPT: &str =
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

/// A request as the router's client sends it: greedy, no scores, every unset field "off".
#[derive(Clone)]
struct Req(pb::Request);

impl Req {
    fn new(id: u64, ids: &[u32], max_new_tokens: u32) -> Self {
        let stopping = pb::StoppingParameters {
            max_new_tokens,
            ..Default::default()
        };
        Req(pb::Request {
            id,
            input_ids: ids.to_vec(),
            stopping: Some(stopping),
            ..Default::default()
        })
    }
    fn scores(mut self, f: impl FnOnce(&mut pb::ScoreOptions)) -> Self {
        f(self.0.scores.get_or_insert_default());
        self
    }
    fn sampling(mut self, f: impl FnOnce(&mut pb::SamplingParameters)) -> Self {
        f(self.0.sampling.get_or_insert_default());
        self
    }
    fn ignore_eos(mut self) -> Self {
        self.0.stopping.get_or_insert_default().ignore_eos_token = true;
        self
    }
}

/// What the shard said about one request, in its protobuf form.
#[derive(Default, Debug)]
struct Outcome {
    prefill: Vec<pb::TokenScores>,
    tokens: Vec<pb::TokenScores>,
    finish_reason: Option<pb::FinishReason>,
}

impl Outcome {
    fn ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.id).collect()
    }
}

/// Adds one step's generations to what each request said so far.
fn absorb_proto(out: &mut HashMap<u64, Outcome>, generations: Vec<pb::Generation>) {
    for g in generations {
        let said = out.entry(g.request_id).or_default();
        said.prefill.extend(g.prefill);
        said.tokens.extend(g.token);
        if let Some(f) = g.finish_reason {
            let known = pb::FinishReason::try_from(f);
            said.finish_reason = Some(known.unwrap_or_else(|_| panic!("finish reason {f}")));
        }
    }
}

/// A shard served on a socket in its own temp dir; stopped and cleaned up on drop.
struct Shard {
    client: Client,
    dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Shard {
    /// Loads the real model with a KV budget of `budget` tokens and serves it.
    async fn start(test: &str, budget: usize) -> Shard {
        let dir = std::env::temp_dir().join(format!("sonde-grpc-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("shard.sock");
        let engine = engine(&gguf_path(), budget);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            ServeConfig {
                uds_path: socket.clone(),
            },
            engine,
            async move {
                let _ = stopped.await;
            },
        ));
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            match sonde_proto::connect_uds(&socket).await {
                Ok(client) => break client,
                Err(e) => {
                    if task.is_finished() {
                        panic!("the server stopped before accepting: {:?}", task.await);
                    }
                    assert!(
                        Instant::now() < deadline,
                        "no connection to {} after 30 s: {e}",
                        socket.display()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        Shard {
            client,
            dir,
            stop: Some(stop),
            task,
        }
    }

    async fn prefill(
        &mut self,
        id: u64,
        reqs: Vec<Req>,
    ) -> Result<pb::StepResponse, tonic::Status> {
        self.client
            .prefill(pb::PrefillRequest {
                batch: Some(batch(id, reqs)),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn decode(
        &mut self,
        batches: Vec<pb::CachedBatch>,
    ) -> Result<pb::StepResponse, tonic::Status> {
        self.client
            .decode(pb::DecodeRequest { batches })
            .await
            .map(tonic::Response::into_inner)
    }

    /// Prefills `reqs` as one batch and decodes it until every request finished, checking
    /// the step bookkeeping on the way.
    async fn run(&mut self, batch_id: u64, reqs: Vec<Req>) -> HashMap<u64, Outcome> {
        let n = reqs.len();
        let step = self.prefill(batch_id, reqs).await.unwrap();
        assert_eq!(step.generations.len(), n);
        let mut out = HashMap::new();
        absorb_proto(&mut out, step.generations);
        let mut cached = step.batch;
        while let Some(b) = cached {
            assert_eq!(b.id, batch_id);
            let step = self.decode(vec![b.clone()]).await.unwrap();
            // Every request advances, by one token or (a verified draft) several, each
            // its own Generation in order; only a request's last may finish it.
            for id in &b.request_ids {
                assert!(step.generations.iter().any(|g| g.request_id == *id));
            }
            for g in step.generations {
                let said = out
                    .get(&g.request_id)
                    .map_or(0, |o: &Outcome| o.tokens.len());
                assert!(
                    out.get(&g.request_id)
                        .is_none_or(|o| o.finish_reason.is_none()),
                    "request {} went on after it finished",
                    g.request_id
                );
                assert_eq!(
                    g.generated_tokens as usize,
                    said + 1,
                    "generated_tokens of request {}",
                    g.request_id
                );
                absorb_proto(&mut out, vec![g]);
            }
            cached = step.batch;
        }
        assert_eq!(out.len(), n);
        out
    }

    async fn run_one(&mut self, batch_id: u64, req: Req) -> Outcome {
        let id = req.0.id;
        self.run(batch_id, vec![req]).await.remove(&id).unwrap()
    }

    /// A small greedy request still runs to its length.
    async fn assert_serving(&mut self, id: u64) {
        let out = self
            .run_one(id, Req::new(id, &[1, 504, 3458], 2).ignore_eos())
            .await;
        assert_eq!(
            out.tokens.len(),
            2,
            "after an error the shard no longer serves"
        );
        assert_eq!(out.finish_reason, Some(pb::FinishReason::Length));
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn batch(id: u64, reqs: Vec<Req>) -> pb::Batch {
    pb::Batch {
        id,
        requests: reqs.into_iter().map(|r| r.0).collect(),
    }
}

/// Asserts a gRPC error's code and that its message mentions every one of `words`.
fn assert_status<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, words: &[&str]) {
    let status = match result {
        Ok(v) => panic!("expected {code:?}, got a success: {v:?}"),
        Err(s) => s,
    };
    assert_eq!(status.code(), code, "message: {}", status.message());
    for w in words {
        assert!(
            status.message().contains(w),
            "{code:?} message {:?} does not mention {w:?}",
            status.message()
        );
    }
}

#[tokio::test]
async fn info_reports_the_model() {
    let mut shard = Shard::start("info", 4096).await;
    let info = shard
        .client
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.vocab_size, VOCAB);
    assert!(info.eos_token_ids.contains(&2), "{:?}", info.eos_token_ids);
    assert_eq!(info.architecture, "llama");
    assert_eq!(info.weights_format, "gguf");
    assert_eq!(info.max_context, 8192);
    assert_eq!(info.max_label_tokens, 128);
    assert_eq!(info.max_batch_total_tokens, 4096);
    assert_eq!(info.device, "cpu");
    shard.client.health(pb::HealthRequest {}).await.unwrap();
}

#[tokio::test]
async fn greedy_chat_over_grpc_names_paris_and_stops_on_eos() {
    let path = gguf_path();
    let tok = ModelTokenizer::from_gguf_file(&path).unwrap();
    let ids = tok.encode(CHAT_PROMPT, true).unwrap();
    let mut shard = Shard::start("paris", 4096).await;
    let out = shard.run_one(1, Req::new(7, &ids, 48)).await;
    let text = tok.decode(&out.ids(), true).unwrap();
    assert!(text.contains("Paris"), "{text:?}");
    assert_eq!(
        out.finish_reason,
        Some(pb::FinishReason::EosToken),
        "{} tokens: {text:?}",
        out.tokens.len()
    );
    assert_eq!(out.tokens.last().map(|t| t.id), Some(2));
    for t in &out.tokens {
        let lp = t.logprob.unwrap_or(f32::NAN);
        assert!(lp.is_finite() && lp <= 0.0, "token {}: logprob {lp}", t.id);
    }
    assert!(out.prefill.is_empty(), "prompt scores were not asked for");
}

#[tokio::test]
async fn bad_requests_are_clear_errors_and_the_shard_keeps_serving() {
    let mut shard = Shard::start("errors", 256).await;
    let mut good = 1000;
    let mut serving = async |shard: &mut Shard| {
        good += 1;
        shard.assert_serving(good).await;
    };

    // A batch the shard never had.
    let unknown = pb::CachedBatch {
        id: 777_001,
        request_ids: vec![1],
        reserved_tokens: 10,
    };
    assert_status(
        shard.decode(vec![unknown]).await,
        Code::NotFound,
        &["777001"],
    );
    serving(&mut shard).await;

    // Decode naming no batch at all.
    assert_status(shard.decode(Vec::new()).await, Code::InvalidArgument, &[]);
    serving(&mut shard).await;

    // Token ids: the first id past the vocabulary, and one far past it.
    let r = shard.prefill(1, vec![Req::new(1, &[5, VOCAB], 4)]).await;
    assert_status(
        r,
        Code::InvalidArgument,
        &["input_ids", "49152", "vocabulary"],
    );
    serving(&mut shard).await;
    let r = shard.prefill(2, vec![Req::new(2, &[5, 60_000], 4)]).await;
    assert_status(r, Code::InvalidArgument, &["input_ids", "60000", "49152"]);
    serving(&mut shard).await;

    // An empty prompt.
    let r = shard.prefill(3, vec![Req::new(3, &[], 4)]).await;
    assert_status(r, Code::InvalidArgument, &["input_ids"]);
    serving(&mut shard).await;

    // Too many labels.
    let labels: Vec<u32> = (10..139).collect();
    let req = Req::new(4, &[1, 2, 3], 4).scores(|s| s.logprob_token_ids = labels);
    assert_status(
        shard.prefill(4, vec![req]).await,
        Code::InvalidArgument,
        &["logprob_token_ids", "129", "128"],
    );
    serving(&mut shard).await;
    // 128 labels are fine.
    let labels: Vec<u32> = (10..138).collect();
    let req = Req::new(5, &[1, 2, 3], 1).scores(|s| s.logprob_token_ids = labels);
    let step = shard.prefill(5, vec![req]).await.unwrap();
    let token = step.generations[0].token.clone().unwrap();
    assert_eq!(token.label_logprobs.len(), 128);
    assert!(step.batch.is_none());

    // Nothing to compute.
    let r = shard.prefill(6, vec![Req::new(6, &[1, 2, 3], 0)]).await;
    assert_status(r, Code::InvalidArgument, &["max_new_tokens"]);
    serving(&mut shard).await;
    // ...but pure scoring is fine: prompt scores, no token, no cached batch.
    let req = Req::new(7, &[1, 2, 3], 0).scores(|s| s.prefill_logprobs = true);
    let step = shard.prefill(7, vec![req]).await.unwrap();
    assert!(step.batch.is_none());
    assert_eq!(step.generations[0].prefill.len(), 3);
    assert!(step.generations[0].token.is_none());

    // Over the KV budget: 200 + 100 = 300 > 256. Nothing is reserved by the refusal, so a
    // request using 250 of the 256 tokens fits right after.
    let prompt: Vec<u32> = (1000..1200).collect();
    let r = shard.prefill(8, vec![Req::new(8, &prompt, 100)]).await;
    assert_status(r, Code::ResourceExhausted, &["300", "256"]);
    let out = shard
        .run_one(9, Req::new(9, &prompt, 50).ignore_eos())
        .await;
    assert_eq!(out.tokens.len(), 50);
    serving(&mut shard).await;

    // A batch id that is still cached.
    let live = shard
        .prefill(10, vec![Req::new(10, &[1, 2, 3], 8)])
        .await
        .unwrap();
    assert_eq!(live.batch.as_ref().map(|b| b.id), Some(10));
    let r = shard.prefill(10, vec![Req::new(11, &[4, 5, 6], 8)]).await;
    assert_status(r, Code::InvalidArgument, &["10", "already cached"]);
    // The live batch is untouched by the refused one.
    let step = shard
        .decode(live.batch.into_iter().collect())
        .await
        .unwrap();
    assert_eq!(step.batch.map(|b| b.request_ids), Some(vec![10]));
    shard
        .client
        .clear_cache(pb::ClearCacheRequest { id: Some(10) })
        .await
        .unwrap();
    serving(&mut shard).await;

    // A PrefillRequest without its batch.
    let r = shard
        .client
        .prefill(pb::PrefillRequest { batch: None })
        .await;
    assert_status(r, Code::InvalidArgument, &["batch"]);
    serving(&mut shard).await;
}

#[tokio::test]
async fn batches_merge_filter_and_clear_over_the_protocol() {
    let mut shard = Shard::start("batching", 256).await;
    let prompts: [&[u32]; 3] = [
        &[1, 504, 3458, 314],
        &[1, 1557, 28, 253, 1345],
        &[1, 9690, 17],
    ];
    let req = |i: usize| Req::new(i as u64 + 1, prompts[i], 8).ignore_eos();
    let mut seen: HashMap<u64, Outcome> = HashMap::new();

    // Batch A: requests 1 and 2, two decode steps.
    let step = shard.prefill(100, vec![req(0), req(1)]).await.unwrap();
    absorb_proto(&mut seen, step.generations);
    let mut a = step.batch.unwrap();
    for _ in 0..2 {
        let step = shard.decode(vec![a]).await.unwrap();
        absorb_proto(&mut seen, step.generations);
        a = step.batch.unwrap();
    }
    assert_eq!(a.id, 100);
    assert_eq!(a.request_ids, vec![1, 2]);

    // Batch B: request 3 joins.
    let step = shard.prefill(200, vec![req(2)]).await.unwrap();
    absorb_proto(&mut seen, step.generations);
    let b = step.batch.unwrap();
    assert_eq!((b.id, b.request_ids.clone()), (200, vec![3]));

    // One decode over both: they continue as one batch under A's id.
    let step = shard.decode(vec![a, b.clone()]).await.unwrap();
    let generated: HashMap<u64, u32> = step
        .generations
        .iter()
        .map(|g| (g.request_id, g.generated_tokens))
        .collect();
    assert_eq!(generated, HashMap::from([(1, 4), (2, 4), (3, 2)]));
    absorb_proto(&mut seen, step.generations);
    let merged = step.batch.unwrap();
    assert_eq!(merged.id, 100);
    let mut ids = merged.request_ids.clone();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3]);
    let reservation = |i: usize| prompts[i].len() as u32 + 8;
    assert_eq!(
        merged.reserved_tokens,
        reservation(0) + reservation(1) + reservation(2)
    );

    // B lives on only inside A.
    assert_status(shard.decode(vec![b]).await, Code::NotFound, &["200"]);

    // Keep request 2 only.
    let kept = shard
        .client
        .filter_batch(pb::FilterBatchRequest {
            batch_id: 100,
            request_ids: vec![2],
        })
        .await
        .unwrap()
        .into_inner()
        .batch
        .unwrap();
    assert_eq!((kept.id, kept.request_ids.clone()), (100, vec![2]));
    assert_eq!(kept.reserved_tokens, reservation(1));
    let step = shard.decode(vec![kept.clone()]).await.unwrap();
    // Request 2 alone advances: by one token, or several where its draft held.
    assert!(!step.generations.is_empty());
    assert!(step.generations.iter().all(|g| g.request_id == 2));
    absorb_proto(&mut seen, step.generations);

    // While request 2 holds its reservation the whole budget is not free...
    let whole: Vec<u32> = (1000..1248).collect();
    let r = shard.prefill(300, vec![Req::new(30, &whole, 8)]).await;
    assert_status(r, Code::ResourceExhausted, &["256"]);
    // ...and once ClearCache frees A, it is.
    shard
        .client
        .clear_cache(pb::ClearCacheRequest { id: Some(100) })
        .await
        .unwrap();
    assert_status(shard.decode(vec![kept]).await, Code::NotFound, &["100"]);
    let step = shard
        .prefill(300, vec![Req::new(30, &whole, 8)])
        .await
        .unwrap();
    assert_eq!(step.batch.map(|b| b.reserved_tokens), Some(256));
    shard
        .client
        .clear_cache(pb::ClearCacheRequest { id: None })
        .await
        .unwrap();

    // What each request generated while batched, merged and filtered is what it generates
    // alone (greedy).
    for (i, batch_id) in [(0usize, 401u64), (1, 402), (2, 403)] {
        let id = i as u64 + 1;
        let got = seen[&id].ids();
        let alone = shard.run_one(batch_id, req(i)).await.ids();
        assert_eq!(got[..], alone[..got.len()], "request {id}");
    }
}

#[tokio::test]
async fn same_seed_same_tokens_other_seed_other_tokens() {
    let path = gguf_path();
    let tok = ModelTokenizer::from_gguf_file(&path).unwrap();
    let ids = tok
        .encode(
            "<|im_start|>user\nWrite a short story about a robot.<|im_end|>\n<|im_start|>assistant\n",
            true,
        )
        .unwrap();
    let mut shard = Shard::start("seeds", 4096).await;
    let sampled = |id: u64, seed: u64| {
        Req::new(id, &ids, 24).ignore_eos().sampling(|s| {
            s.do_sample = true;
            s.temperature = 0.8;
            s.top_p = 0.9;
            s.seed = seed;
        })
    };
    let first = shard.run_one(1, sampled(1, 42)).await.ids();
    let again = shard.run_one(2, sampled(2, 42)).await.ids();
    let other = shard.run_one(3, sampled(3, 43)).await.ids();
    assert_eq!(first.len(), 24);
    assert_eq!(first, again, "seed 42 twice");
    assert_ne!(first, other, "seeds 42 and 43 gave the same 24 tokens");
}
