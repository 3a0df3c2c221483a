//! From flags and environment to the commands of the children. The environment is read
//! here, once (`LaunchEnv`); the router and shards get everything else as flags.

use std::path::{Path, PathBuf};

use sonde_proto::FlagValue;

use crate::args::LauncherArgs;
use crate::child::ChildSpec;

/// The default model's file name, as `scripts/fetch-data` puts it in `<data dir>/models/`.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("--num-shard {0} is not supported yet: Sonde runs one shard per model today (tensor parallelism across GPUs is planned)")]
    NumShard(usize),
    #[error("AIP_HTTP_PORT must be a port number, got {0:?}")]
    AipPort(String),
    #[error("{name} was not found next to the launcher ({path}); build the workspace (cargo build --release) or install all three binaries together")]
    MissingBinary { name: &'static str, path: PathBuf },
    #[error(
        "the port {port} on {host} is already in use; stop what uses it or pass another --port"
    )]
    PortInUse { host: String, port: u16 },
    #[error("cannot listen on {host}:{port}: {source}")]
    Bind {
        host: String,
        port: u16,
        source: std::io::Error,
    },
}

/// The environment variables the launcher reads.
#[derive(Debug, Clone, Default)]
pub struct LaunchEnv {
    /// Vertex AI's port; wins over --port.
    pub aip_http_port: Option<String>,
    /// Vertex AI's model location (`gs://…`), used when --model-id is not given.
    pub aip_storage_uri: Option<String>,
    /// Where `scripts/fetch-data` puts data (`SONDE_DATA_DIR`, default `./data`).
    pub data_dir: Option<PathBuf>,
    pub home: Option<PathBuf>,
}

impl LaunchEnv {
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            aip_http_port: var("AIP_HTTP_PORT"),
            aip_storage_uri: var("AIP_STORAGE_URI"),
            data_dir: var("SONDE_DATA_DIR").map(PathBuf::from),
            home: var("HOME").map(PathBuf::from),
        }
    }

    pub fn default_model(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("data"))
            .join("models")
            .join(DEFAULT_MODEL_FILE)
    }

    pub fn cache_dir(&self, args: &LauncherArgs) -> PathBuf {
        if let Some(dir) = &args.model_cache_dir {
            return dir.clone();
        }
        match &self.home {
            Some(home) => home.join(".cache").join("sonde"),
            None => std::env::temp_dir().join("sonde-cache"),
        }
    }

    /// The HTTP port the router will use.
    pub fn http_port(&self, args: &LauncherArgs) -> Result<u16, LaunchError> {
        match &self.aip_http_port {
            Some(p) => p.parse().map_err(|_| LaunchError::AipPort(p.clone())),
            None => Ok(args.port),
        }
    }
}

pub fn check_args(args: &LauncherArgs) -> Result<(), LaunchError> {
    if args.num_shard != 1 {
        return Err(LaunchError::NumShard(args.num_shard));
    }
    Ok(())
}

/// Binds the HTTP port first thing: a port in use fails before a model loads for minutes,
/// and the socket answers 503 while it does (`loading.rs`), then goes to the router.
pub fn bind_http(host: &str, port: u16) -> Result<std::net::TcpListener, LaunchError> {
    match std::net::TcpListener::bind((host, port)) {
        Ok(listener) => Ok(listener),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(LaunchError::PortInUse {
            host: host.to_string(),
            port,
        }),
        Err(source) => Err(LaunchError::Bind {
            host: host.to_string(),
            port,
            source,
        }),
    }
}

/// The shard and router binaries, installed next to the launcher.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub shard: PathBuf,
    pub router: PathBuf,
}

impl Binaries {
    pub fn beside(launcher: &Path) -> Result<Self, LaunchError> {
        let dir = launcher.parent().unwrap_or(Path::new("."));
        let find = |name: &'static str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(LaunchError::MissingBinary { name, path })
            }
        };
        Ok(Self {
            shard: find("sonde-shard")?,
            router: find("sonde-router")?,
        })
    }
}

pub fn shard_spec(args: &LauncherArgs, bins: &Binaries, model: &Path, rank: usize) -> ChildSpec {
    let mut a = vec![
        "--model".to_string(),
        model.display().to_string(),
        "--uds-path".to_string(),
        sonde_proto::shard_socket(&args.shard_uds_path, rank)
            .display()
            .to_string(),
        "--max-batch-total-tokens".to_string(),
        args.batching.max_batch_total_tokens.to_string(),
        "--prefix-caching".to_string(),
        args.batching.prefix_caching.to_string(),
        "--speculate".to_string(),
        args.batching.speculate.to_string(),
        "--gguf-quant".to_string(),
        args.dtype.flag_value(),
        "--wide-quants-mib".to_string(),
        args.wide_quants_mib.to_string(),
        "--device".to_string(),
        args.device.flag_value(),
    ];
    if args.json_output {
        a.push("--json-output".to_string());
    }
    ChildSpec {
        name: format!("shard {rank}"),
        program: bins.shard.clone(),
        args: a,
        env: Vec::new(),
    }
}

/// The router's command. `AIP_*` variables reach it through the environment, which it
/// inherits, so it reads them the same way whether started by hand or by the launcher.
pub fn router_spec(
    args: &LauncherArgs,
    bins: &Binaries,
    model: &Path,
    model_id: &str,
) -> ChildSpec {
    let b = &args.batching;
    let mut a: Vec<String> = Vec::new();
    let mut flag = |name: &str, value: String| {
        a.push(format!("--{name}"));
        a.push(value);
    };
    flag("model", model.display().to_string());
    flag("model-id", model_id.to_string());
    flag("shard-uds-path", args.shard_uds_path.display().to_string());
    flag("num-shard", args.num_shard.to_string());
    flag("hostname", args.hostname.clone());
    flag("port", args.port.to_string());
    if let Some(v) = b.max_batch_prefill_tokens {
        flag("max-batch-prefill-tokens", v.to_string());
    }
    flag("waiting-served-ratio", b.waiting_served_ratio.to_string());
    flag("max-waiting-tokens", b.max_waiting_tokens.to_string());
    flag(
        "graceful-termination-timeout",
        args.supervision.graceful_termination_timeout.to_string(),
    );
    flag(
        "shard-startup-timeout",
        args.supervision.shard_startup_timeout.to_string(),
    );
    flag(
        "shard-step-timeout",
        args.supervision.shard_step_timeout.to_string(),
    );
    a.extend(args.limits.to_args());
    if args.json_output {
        a.push("--json-output".to_string());
    }
    // The key goes through the environment: a command line is visible to every user of the
    // machine (`ps`).
    let env = args
        .api_key
        .iter()
        .map(|key| ("API_KEY".to_string(), key.clone()))
        .collect();
    ChildSpec {
        name: "router".to_string(),
        program: bins.router.clone(),
        args: a,
        env,
    }
}
