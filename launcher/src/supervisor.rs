//! Starts the shards, waits until they answer, starts the router, and watches them all:
//! a dead shard is restarted (bounded, with back-off), a shard that stops answering its
//! health check is killed and restarted the same way (`liveness.rs`), a dead router stops
//! everything with an error, SIGTERM/SIGINT drain the router and then stop the shards.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal as Kill;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::child::{ChildSpec, Supervised};
use crate::liveness::{self, Liveness};
use crate::loading::Loading;

/// What the supervisor runs and how patiently.
#[derive(Debug, Clone)]
pub struct Plan {
    pub shards: Vec<ShardPlan>,
    pub router: ChildSpec,
    pub startup_timeout: Duration,
    /// Time the router gets to drain after SIGTERM (it stops by itself within it).
    pub drain_timeout: Duration,
    pub max_restarts: u32,
}

#[derive(Debug, Clone)]
pub struct ShardPlan {
    pub spec: ChildSpec,
    pub socket: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("could not start {name}: {source}")]
    Spawn {
        name: String,
        source: std::io::Error,
    },
    #[error("{name} exited ({status}) while loading the model; its last lines:\n{lines}")]
    DiedAtStartup {
        name: String,
        status: String,
        lines: String,
    },
    #[error("{name} did not answer its health check within --shard-startup-timeout ({secs} s); its last lines:\n{lines}")]
    StartupTimeout {
        name: String,
        secs: u64,
        lines: String,
    },
    #[error("{name} died {restarts} times; giving up (--max-shard-restarts) so the platform restarts the container")]
    TooManyRestarts { name: String, restarts: u32 },
    #[error("the router exited ({status}); its last lines:\n{lines}")]
    RouterDied { status: String, lines: String },
    #[error("could not listen for signals: {0}")]
    Signals(std::io::Error),
    #[error("could not hand the HTTP port over to the router: {0}")]
    HandOver(std::io::Error),
}

/// A shard that stayed up this long has its restart count forgiven.
const HEALTHY_RESET: Duration = Duration::from_secs(300);
/// Time one health check may take while a shard starts.
const STARTUP_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a shard gets to stop after SIGTERM.
const SHARD_STOP_GRACE: Duration = Duration::from_secs(10);

struct Running {
    plan: ShardPlan,
    child: Supervised,
    restarts: u32,
    started: Instant,
}

/// Runs everything until a signal (Ok) or an unrecoverable failure (Err). `http` answers
/// 503 on the HTTP port until the router takes the port over.
pub async fn run(plan: Plan, http: Loading) -> Result<(), SuperviseError> {
    let mut term = signal(SignalKind::terminate()).map_err(SuperviseError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SuperviseError::Signals)?;
    let mut shards = Vec::with_capacity(plan.shards.len());
    for shard in &plan.shards {
        let child = start_shard(shard, plan.startup_timeout).await?;
        shards.push(Running {
            plan: shard.clone(),
            child,
            restarts: 0,
            started: Instant::now(),
        });
    }
    tracing::info!("shards ready; starting the router");
    let mut router = spawn_router(&plan.router, http).await?;
    let mut liveness = Liveness::new(plan.shards.iter().map(|s| s.socket.clone()).collect());
    loop {
        tokio::select! {
            _ = stop_signal(&mut term, &mut int) => {
                tracing::info!("stopping: the router drains, then the shards stop");
                shutdown(&mut router, &mut shards, plan.drain_timeout).await;
                return Ok(());
            }
            status = router.wait() => {
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                let lines = router.last_lines();
                stop_shards(&mut shards).await;
                return Err(SuperviseError::RouterDied { status, lines });
            }
            i = liveness.next_stuck() => {
                // A hung shard never exits by itself; killed, it takes the restart path
                // below like any other death (its requests already failed with 424 at the
                // router's --shard-step-timeout).
                let shard = &mut shards[i];
                tracing::error!(shard = %shard.child.name, missed = liveness::MAX_MISSED,
                    timeout_s = liveness::PROBE_TIMEOUT.as_secs(),
                    "the shard does not answer its health checks; killing it to restart it");
                shard.child.signal(Kill::SIGKILL);
                liveness.reset(i);
            }
            (i, status) = any_exit(&mut shards) => {
                let shard = &mut shards[i];
                tracing::error!(shard = %shard.child.name, status = %status, last_lines = %shard.child.last_lines(), "a shard died");
                if shard.started.elapsed() > HEALTHY_RESET {
                    shard.restarts = 0;
                }
                if shard.restarts >= plan.max_restarts {
                    let err = SuperviseError::TooManyRestarts { name: shard.child.name.clone(), restarts: shard.restarts + 1 };
                    router.stop(plan.drain_timeout).await;
                    stop_shards(&mut shards).await;
                    return Err(err);
                }
                let backoff = Duration::from_secs(1 << shard.restarts.min(5));
                shard.restarts += 1;
                tracing::info!(shard = %shard.child.name, restart = shard.restarts, backoff_s = backoff.as_secs(), "restarting the shard");
                // Signals still count while waiting: a SIGTERM during a restart stops cleanly.
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop_signal(&mut term, &mut int) => {
                        shutdown(&mut router, &mut shards, plan.drain_timeout).await;
                        return Ok(());
                    }
                }
                let shard = &mut shards[i];
                shard.child = start_shard(&shard.plan, plan.startup_timeout).await?;
                shard.started = Instant::now();
                liveness.reset(i);
                // The router notices by itself: its health check of the shard succeeds again.
            }
        }
    }
}

async fn stop_signal(term: &mut Signal, int: &mut Signal) {
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn spawn(spec: &ChildSpec) -> Result<Supervised, SuperviseError> {
    tracing::info!(child = %spec.name, program = %spec.program.display(), "starting");
    Supervised::spawn(spec).map_err(|source| SuperviseError::Spawn {
        name: spec.name.clone(),
        source,
    })
}

/// Starts the router on the socket the launcher has answered on so far (`loading.rs`).
async fn spawn_router(spec: &ChildSpec, http: Loading) -> Result<Supervised, SuperviseError> {
    let (listener, fd) = http.hand_over().await.map_err(SuperviseError::HandOver)?;
    let mut spec = spec.clone();
    spec.args
        .extend(["--listen-fd".to_string(), fd.to_string()]);
    let router = spawn(&spec);
    // The router holds the socket now; a shard restarted later must not inherit it.
    drop(listener);
    router
}

/// Starts a shard and waits until it answers its gRPC health check.
async fn start_shard(plan: &ShardPlan, timeout: Duration) -> Result<Supervised, SuperviseError> {
    // A socket left by a killed shard would be mistaken for a live one.
    let _ = std::fs::remove_file(&plan.socket);
    let mut child = spawn(&plan.spec)?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_status() {
            // Let the output forwarders catch the last lines.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Err(SuperviseError::DiedAtStartup {
                name: child.name.clone(),
                status: status.to_string(),
                lines: child.last_lines(),
            });
        }
        if plan.socket.exists() && liveness::healthy(&plan.socket, STARTUP_PROBE_TIMEOUT).await {
            tracing::info!(shard = %child.name, "ready");
            return Ok(child);
        }
        if Instant::now() > deadline {
            let err = SuperviseError::StartupTimeout {
                name: child.name.clone(),
                secs: timeout.as_secs(),
                lines: child.last_lines(),
            };
            child.stop(SHARD_STOP_GRACE).await;
            return Err(err);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first shard to exit, with its index and status.
async fn any_exit(shards: &mut [Running]) -> (usize, String) {
    if shards.is_empty() {
        return std::future::pending().await;
    }
    let waits = shards.iter_mut().map(|s| {
        Box::pin(async move {
            s.child
                .wait()
                .await
                .map_or_else(|e| e.to_string(), |status| status.to_string())
        })
    });
    let (status, i, _) = futures::future::select_all(waits).await;
    (i, status)
}

/// The router drains (503 to new requests, in-flight ones finish), then the shards stop.
async fn shutdown(router: &mut Supervised, shards: &mut [Running], drain: Duration) {
    // The router stops by itself once drained; the extra seconds cover its own exit.
    if let Some(status) = router.stop(drain + Duration::from_secs(5)).await {
        tracing::info!(status = %status, "router stopped");
    }
    stop_shards(shards).await;
}

async fn stop_shards(shards: &mut [Running]) {
    for shard in shards.iter_mut() {
        shard.child.stop(SHARD_STOP_GRACE).await;
        let _ = std::fs::remove_file(&shard.plan.socket);
    }
}
