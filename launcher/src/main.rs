//! `sonde-launcher`: flags → model → shards → router, supervised until SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sonde_launcher::args::LauncherArgs;
use sonde_launcher::config::{self, Binaries, LaunchEnv};
use sonde_launcher::loading::Loading;
use sonde_launcher::model::{self, GcsOptions, HubOptions, ProgressStyle, ResolveConfig};
use sonde_launcher::supervisor::{self, Plan, ShardPlan};

#[tokio::main]
async fn main() -> ExitCode {
    let args = LauncherArgs::parse();
    sonde_common::init_logging(args.json_output);
    match launch(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One sentence (plus a child's last lines where they explain it), then exit
            // non-zero so a platform (Vertex AI, Kubernetes) restarts or reports it.
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn launch(args: LauncherArgs) -> anyhow::Result<()> {
    let env = LaunchEnv::from_process();
    config::check_args(&args)?;
    let port = env.http_port(&args)?;
    let http = Loading::serve(config::bind_http(&args.hostname, port)?)?;
    let launcher = std::env::current_exe()?;
    let bins = Binaries::beside(&launcher)?;

    let resolve = ResolveConfig {
        model_id: args.model_id.clone(),
        revision: args.revision.clone(),
        aip_storage_uri: env.aip_storage_uri.clone(),
        cache_dir: env.cache_dir(&args),
        default_model: env.default_model(),
        progress: if std::io::IsTerminal::is_terminal(&std::io::stderr()) && !args.json_output {
            ProgressStyle::Terminal
        } else {
            ProgressStyle::Log
        },
        gcs: GcsOptions::from_env(),
        hub: HubOptions::from_env(),
    };
    let resolved = model::resolve(&resolve).await?;
    tracing::info!(model = %resolved.path.display(), source = %resolved.source, "model resolved");
    // The name clients see: what the user named (a Hub id, a gs:// URI), else the file's.
    let model_id = args
        .model_id
        .clone()
        .filter(|m| !m.trim().is_empty())
        .or(env.aip_storage_uri.clone())
        .unwrap_or_else(|| {
            resolved
                .path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });

    let shards = (0..args.num_shard)
        .map(|rank| ShardPlan {
            spec: config::shard_spec(&args, &bins, &resolved.path, rank),
            socket: sonde_proto::shard_socket(&args.shard_uds_path, rank),
        })
        .collect();
    let plan = Plan {
        shards,
        router: config::router_spec(&args, &bins, &resolved.path, &model_id),
        startup_timeout: Duration::from_secs(args.supervision.shard_startup_timeout),
        drain_timeout: Duration::from_secs(args.supervision.graceful_termination_timeout),
        max_restarts: args.supervision.max_shard_restarts,
    };
    supervisor::run(plan, http).await?;
    tracing::info!("stopped");
    Ok(())
}
