//! Reaching a shard: connecting to a socket, or starting `sonde-shard` and waiting for it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sonde_proto as pb;

use crate::{Args, Client};

pub(crate) async fn connect(path: &Path) -> anyhow::Result<Client> {
    let hint = || {
        format!(
            "no shard answers on {}: start one (`sonde-shard --model MODEL --uds-path {0}`), \
             pass its socket with --uds-path, or let the bench start one with --model",
            path.display()
        )
    };
    let mut client = sonde_proto::connect_uds(path).await.with_context(hint)?;
    client
        .health(pb::HealthRequest {})
        .await
        .with_context(hint)?;
    Ok(client)
}

/// A `sonde-shard` process the bench started; killed, and its temp dir removed, on drop.
pub(crate) struct SpawnedShard {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl SpawnedShard {
    pub(crate) fn start(args: &Args, model: &Path, budget: usize) -> anyhow::Result<Self> {
        // `cargo run --bin sonde-shard-bench` builds only the bench: the sibling comes from
        // the last `cargo build -p sonde-shard --bins`.
        let bin = match &args.shard_bin {
            Some(bin) => bin.clone(),
            None => {
                let me = std::env::current_exe().context("locating the bench's executable")?;
                me.with_file_name(format!("sonde-shard{}", std::env::consts::EXE_SUFFIX))
            }
        };
        if !bin.is_file() {
            bail!(
                "{} does not exist: build it with `cargo build -p sonde-shard --bins` \
                 (or name a shard binary with --shard-bin)",
                bin.display()
            );
        }
        let dir = std::env::temp_dir().join(format!("sonde-shard-bench-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("removing the stale {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join("shard.sock");
        let log = dir.join("shard.log");
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating the log file")?;

        let mut cmd = Command::new(&bin);
        cmd.arg("--model").arg(model).arg("--uds-path").arg(&socket);
        if !args
            .shard_args
            .iter()
            .any(|a| a.starts_with("--max-batch-total-tokens"))
        {
            cmd.arg("--max-batch-total-tokens").arg(budget.to_string());
        }
        if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
            // Keep a failed start's error (an anyhow report) readable in the log tail.
            cmd.env("RUST_LIB_BACKTRACE", "0");
        }
        cmd.args(&args.shard_args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        eprintln!("starting {} --model {}", bin.display(), model.display());
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e).with_context(|| format!("starting {}", bin.display()));
            }
        };
        Ok(SpawnedShard {
            child,
            dir,
            socket,
            log,
        })
    }

    /// Polls Health until it answers; fails early if the shard exits.
    pub(crate) async fn wait_healthy(&mut self, timeout: Duration) -> anyhow::Result<Client> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exit_status()? {
                bail!(
                    "sonde-shard exited ({status}) before answering Health; its output ends:\n{}",
                    self.log_tail()
                );
            }
            if self.socket.exists() {
                if let Ok(mut client) = sonde_proto::connect_uds(&self.socket).await {
                    if client.health(pb::HealthRequest {}).await.is_ok() {
                        eprintln!(
                            "shard healthy after {:.1} s",
                            started.elapsed().as_secs_f64()
                        );
                        return Ok(client);
                    }
                }
            }
            if started.elapsed() > timeout {
                bail!(
                    "sonde-shard did not answer Health on {} within {} s \
                     (--startup-timeout-secs); its output ends:\n{}",
                    self.socket.display(),
                    timeout.as_secs(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn exit_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .context("checking whether sonde-shard is still running")
    }

    /// The last lines the shard wrote (stdout and stderr share the log).
    pub(crate) fn log_tail(&self) -> String {
        const LINES: usize = 20;
        match std::fs::read_to_string(&self.log) {
            Ok(text) => {
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(LINES)..];
                if tail.is_empty() {
                    "(nothing)".to_string()
                } else {
                    tail.join("\n")
                }
            }
            Err(e) => format!("(cannot read {}: {e})", self.log.display()),
        }
    }
}

impl Drop for SpawnedShard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
