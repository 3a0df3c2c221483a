//! Flags and environment → configuration, and its combination with the shard's facts:
//! pure functions, tested without a shard.

use clap::Parser;

use super::*;
use sonde_proto::LogprobsMode;

fn args(flags: &[&str]) -> RouterArgs {
    let argv = ["sonde-router", "--model", "/models/SmolLM2.gguf"];
    RouterArgs::try_parse_from(argv.iter().chain(flags)).unwrap()
}

fn resolved(flags: &[&str]) -> RouterConfig {
    args(flags).resolve(&VertexEnv::default()).unwrap()
}

const FACTS: ShardFacts = ShardFacts {
    max_context: 8192,
    vocab_size: 49152,
    max_label_tokens: 128,
};

#[test]
fn vertex_variables_win_over_flags_and_are_checked() {
    let env = VertexEnv {
        http_port: Some("9000".into()),
        predict_route: Some("/v1/endpoints/e:predict".into()),
        health_route: None,
    };
    let c = args(&["--port", "8080"]).resolve(&env).unwrap();
    assert_eq!(c.server.port, 9000);
    assert_eq!(c.server.predict_route, "/v1/endpoints/e:predict");
    assert_eq!(c.server.health_route, "/health");
    assert_eq!(c.server.model_id, "SmolLM2");
    let bad_port = VertexEnv {
        http_port: Some("eighty".into()),
        ..VertexEnv::default()
    };
    let e = args(&[]).resolve(&bad_port).unwrap_err();
    assert!(e.contains("AIP_HTTP_PORT"), "{e}");
    let capture = VertexEnv {
        predict_route: Some("/predict/{id}".into()),
        ..VertexEnv::default()
    };
    let e = args(&[]).resolve(&capture).unwrap_err();
    assert!(e.contains("AIP_PREDICT_ROUTE"), "{e}");
}

#[test]
fn shards_come_from_their_flags() {
    let c = resolved(&[
        "--shard-uds-path",
        "/run/s",
        "--num-shard",
        "2",
        "--shard-startup-timeout",
        "7",
    ]);
    assert_eq!(c.shards.uds_prefix, PathBuf::from("/run/s"));
    assert_eq!(c.shards.num_shard, 2);
    assert_eq!(c.shards.startup_timeout, Duration::from_secs(7));
}

#[test]
fn input_limits_default_as_tgi_does() {
    let limits = input_limits(&resolved(&[]), &FACTS).unwrap();
    // The context, at most 4096; one token less for the prompt; a prefill of 4096.
    let want = InputLimits {
        max_input_tokens: 4095,
        max_total_tokens: 4096,
        max_batch_prefill_tokens: 4096,
    };
    assert_eq!(limits, want);
    let small = ShardFacts {
        max_context: 2048,
        ..FACTS
    };
    let limits = input_limits(&resolved(&[]), &small).unwrap();
    assert_eq!(
        (limits.max_input_tokens, limits.max_total_tokens),
        (2047, 2048)
    );
    // A longer input limit raises the prefill default with it.
    let long = resolved(&["--max-total-tokens", "8192", "--max-input-tokens", "6000"]);
    assert_eq!(
        input_limits(&long, &FACTS)
            .unwrap()
            .max_batch_prefill_tokens,
        6000
    );
}

#[test]
fn inconsistent_limits_are_refused_naming_the_flags() {
    let cases: [(&[&str], &str); 4] = [
        (&["--max-total-tokens", "9000"], "--max-total-tokens"),
        (
            &["--max-total-tokens", "100", "--max-input-tokens", "100"],
            "--max-input-tokens",
        ),
        (&["--max-input-tokens", "0"], "--max-input-tokens"),
        (
            &[
                "--max-input-tokens",
                "3000",
                "--max-batch-prefill-tokens",
                "2000",
            ],
            "--max-batch-prefill-tokens",
        ),
    ];
    for (flags, named) in cases {
        let e = input_limits(&resolved(flags), &FACTS).unwrap_err();
        assert!(e.contains(named), "{flags:?}: {e}");
    }
}

#[test]
fn the_kv_budget_is_the_shards_or_less() {
    let input = input_limits(&resolved(&[]), &FACTS).unwrap();
    let shard_budget = 16_384;
    let s = serving(&resolved(&[]), &FACTS, input, shard_budget);
    assert_eq!(s.batching.max_batch_total_tokens, shard_budget);
    assert_eq!(s.limits.max_batch_total_tokens, shard_budget);
    let less = resolved(&["--max-batch-total-tokens", "5000"]);
    let s = serving(&less, &FACTS, input, shard_budget);
    assert_eq!(
        (
            s.batching.max_batch_total_tokens,
            s.limits.max_batch_total_tokens
        ),
        (5000, 5000)
    );
    // Asking for more than the shard has gets the shard's.
    let more = resolved(&["--max-batch-total-tokens", "99999"]);
    assert_eq!(
        serving(&more, &FACTS, input, shard_budget)
            .batching
            .max_batch_total_tokens,
        shard_budget
    );
}

#[test]
fn serving_carries_the_flags_and_the_models_facts() {
    let c = resolved(&[
        "--max-top-n-tokens",
        "7",
        "--logprobs-mode",
        "processed",
        "--max-best-of",
        "0",
    ]);
    let input = input_limits(&c, &FACTS).unwrap();
    let s = serving(&c, &FACTS, input, 1000);
    assert_eq!(s.limits.max_top_n_tokens, 7);
    assert_eq!(s.limits.default_logprobs_mode, LogprobsMode::Processed);
    // best_of 0 would refuse every request: 1 is the least.
    assert_eq!(s.limits.max_best_of, 1);
    assert_eq!(
        (s.limits.vocab_size, s.limits.max_label_tokens),
        (49152, 128)
    );
    assert_eq!(s.limits.max_input_tokens, input.max_input_tokens);
    assert_eq!(
        s.batching.max_batch_prefill_tokens,
        input.max_batch_prefill_tokens
    );
}
