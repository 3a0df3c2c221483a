//! A supervised child process: its own process group, its output forwarded line by line
//! into the launcher's log stream, and its last lines kept for error messages.

use std::collections::VecDeque;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// Lines of a child's output kept to explain its failure.
const TAIL_LINES: usize = 20;

/// How a child is started.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// For messages: "shard 0", "router".
    pub name: String,
    pub program: std::path::PathBuf,
    pub args: Vec<String>,
    /// Added to the launcher's environment, which the child inherits.
    pub env: Vec<(String, String)>,
}

pub struct Supervised {
    pub name: String,
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl Supervised {
    pub fn spawn(spec: &ChildSpec) -> std::io::Result<Self> {
        let mut child = Command::new(&spec.program)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C on the terminal reaches only the launcher,
            // which then stops the children in order (router drains first).
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(forward(out, tail.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(forward(err, tail.clone()));
        }
        Ok(Self {
            name: spec.name.clone(),
            child,
            tail,
        })
    }

    /// The last lines the child wrote, for an error message.
    pub fn last_lines(&self) -> String {
        match self.tail.lock() {
            Ok(tail) => tail.iter().cloned().collect::<Vec<_>>().join("\n"),
            Err(_) => String::new(),
        }
    }

    /// Resolves when the child exits.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Its status if it already exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.id() {
            // The whole group, so anything the child started goes too.
            let _ = killpg(Pid::from_raw(pid as i32), signal);
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.try_status() {
            return Some(status);
        }
        self.signal(Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                tracing::warn!(child = %self.name, grace_s = grace.as_secs(), "did not stop in time; killing it");
                self.signal(Signal::SIGKILL);
                self.child.wait().await.ok()
            }
        }
    }
}

/// Copies a child's output to the launcher's stderr, line by line (so lines of two
/// children never interleave mid-line), keeping the last few.
async fn forward(stream: impl AsyncRead + Unpin, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("{line}");
        if let Ok(mut tail) = tail.lock() {
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    }
}
