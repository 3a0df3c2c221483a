//! The two attention kernels — the host kernel the CPU serves with, and the candle-ops
//! path GPUs take — are written independently (one loops over the visible keys, the
//! other masks them); run on the CPU over Gemma 3 with a prompt longer than its 512-token
//! sliding window, they must agree, prefill and decode, on every score. The candle path
//! also gives the same bits when the last layer computes only the last position.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use sonde_proto::WeightQuant;
use sonde_shard::loader::LoadOptions;
use sonde_shard::model::AttentionKernel;

#[test]
fn host_and_candle_attention_agree_past_the_sliding_window() {
    // 700 prompt tokens (past the window of 512), then 40 decode steps.
    let ids: Vec<u32> = std::iter::once(2)
        .chain((1..700u32).map(|i| 1000 + (i * 7919) % 200_000))
        .collect();
    let run = |attention, scored| {
        let opts = LoadOptions {
            attention: Some(attention),
            ..LoadOptions::cpu(WeightQuant::default())
        };
        let mut engine = engine_opts(&gemma3_path(), 1024, &opts);
        run_one(
            &mut engine,
            Req::new(1, &ids, 40).ignore_eos().scores(|s| {
                s.prefill_logprobs = scored;
                s.top_n_tokens = 3;
            }),
        )
    };
    let host = run(AttentionKernel::Host, true);
    let candle = run(AttentionKernel::Candle, true);
    assert_eq!(host.ids(), candle.ids());
    // Without prompt scores the last layer queries from the last position alone, on the
    // candle path too: the same tokens, the same bits.
    let plain = run(AttentionKernel::Candle, false);
    assert!(plain.prefill.is_empty());
    assert_eq!(plain.tokens, candle.tokens);
    let mut worst = 0f32;
    for (a, b) in host
        .prefill
        .iter()
        .chain(&host.tokens)
        .zip(candle.prefill.iter().chain(&candle.tokens))
    {
        if let (Some(x), Some(y)) = (a.logprob, b.logprob) {
            worst = worst.max((x - y).abs());
        }
    }
    eprintln!("host vs candle attention, 700 + 40 positions: max |Δ logprob| {worst:.2e}");
    assert!(worst < 1e-4, "{worst}");
}
