#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The router's command line, as the launcher builds it, parsed by the router's own flag
//! parser: every flag the launcher passes exists, its values arrive, and every router flag
//! is either passed or left out for a stated reason. (The request limits are one struct,
//! `sonde_common::flags::LimitArgs`, that both parse; the router's other flags are declared
//! apart from the launcher's, and this is what keeps them from drifting.)

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use sonde_launcher::args::LauncherArgs;
use sonde_launcher::config::{router_spec, Binaries};
use sonde_router::config::RouterArgs;

/// Router flags the launcher does not put on the command line, and why.
const NOT_PASSED: &[(&str, &str)] = &[
    (
        "api-key",
        "goes through the environment, which `ps` does not show",
    ),
    (
        "max-batch-total-tokens",
        "the launcher gives its KV budget to the shard, whose Info reports it to the router",
    ),
    (
        "listen-fd",
        "added when the router starts: the launcher's HTTP socket, open only then (loading.rs)",
    ),
    ("help", "clap's"),
    ("version", "clap's"),
];

fn router_args(launcher_flags: &[&str]) -> (Vec<String>, RouterArgs) {
    let mut argv = vec!["sonde-launcher", "--model-id", "/models/m.gguf"];
    argv.extend_from_slice(launcher_flags);
    let args = LauncherArgs::try_parse_from(argv).expect("launcher flags parse");
    let bins = Binaries {
        shard: PathBuf::from("/bin/sonde-shard"),
        router: PathBuf::from("/bin/sonde-router"),
    };
    let spec = router_spec(&args, &bins, Path::new("/models/m.gguf"), "m");
    let parsed = RouterArgs::try_parse_from(
        std::iter::once("sonde-router".to_string()).chain(spec.args.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("the router refuses {:?}: {e}", spec.args));
    (spec.args, parsed)
}

#[test]
fn every_router_flag_is_passed_or_left_out_for_a_reason() {
    // Switches and optional values appear only when set, so set them all.
    let (line, _) = router_args(&[
        "--enable-prefill-logprobs",
        "--json-output",
        "--max-input-tokens",
        "10",
        "--max-total-tokens",
        "20",
        "--max-batch-prefill-tokens",
        "30",
    ]);
    let passed: Vec<&str> = line.iter().filter_map(|a| a.strip_prefix("--")).collect();
    let missing: Vec<String> = RouterArgs::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .filter(|long| !passed.contains(&long.as_str()))
        .filter(|long| !NOT_PASSED.iter().any(|(n, _)| n == long))
        .collect();
    assert!(
        missing.is_empty(),
        "router flags the launcher cannot set: {missing:?}"
    );
}

#[test]
fn launcher_values_reach_the_router() {
    let (_, r) = router_args(&[
        "--default-max-new-tokens",
        "77",
        "--max-top-n-tokens",
        "9",
        "--max-input-tokens",
        "100",
        "--max-total-tokens",
        "200",
        "--max-batch-prefill-tokens",
        "300",
        "--logprobs-mode",
        "processed",
        "--shard-uds-path",
        "/run/s",
        "--port",
        "9000",
        "--shard-step-timeout",
        "7",
        "--enable-prefill-logprobs",
    ]);
    assert_eq!(r.limits.default_max_new_tokens, 77);
    assert_eq!(r.limits.max_top_n_tokens, 9);
    assert_eq!(r.limits.max_input_tokens, Some(100));
    assert_eq!(r.limits.max_total_tokens, Some(200));
    assert_eq!(r.batching.max_batch_prefill_tokens, Some(300));
    assert!(matches!(
        r.limits.logprobs_mode,
        sonde_proto::LogprobsMode::Processed
    ));
    assert_eq!(r.shard_uds_path, PathBuf::from("/run/s"));
    assert_eq!(r.port, 9000);
    assert_eq!(r.batching.shard_step_timeout, 7);
    assert!(r.limits.enable_prefill_logprobs);
    assert_eq!(r.model_id.as_deref(), Some("m"));
}

#[test]
fn launcher_and_router_defaults_agree() {
    let (_, passed) = router_args(&[]);
    let own = RouterArgs::try_parse_from(["sonde-router", "--model", "/models/m.gguf"])
        .expect("router defaults parse");
    assert_eq!(passed.shard_uds_path, own.shard_uds_path);
    assert_eq!(
        passed.limits.default_max_new_tokens,
        own.limits.default_max_new_tokens
    );
    assert_eq!(passed.limits.max_top_n_tokens, own.limits.max_top_n_tokens);
    assert_eq!(passed.limits.max_best_of, own.limits.max_best_of);
    assert_eq!(
        passed.limits.max_concurrent_requests,
        own.limits.max_concurrent_requests
    );
    assert_eq!(passed.limits.payload_limit, own.limits.payload_limit);
    assert_eq!(
        passed.graceful_termination_timeout,
        own.graceful_termination_timeout
    );
}
