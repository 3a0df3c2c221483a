//! Speed against candle's `QMatMul` on the same tensors (ignored: run by hand).

use super::*;

use std::time::{Duration, Instant};

use candle_core::quantized::QMatMul;
use candle_core::Module;

/// Seconds per call of `f`: the best of several batches, each at least `min / 8` long,
/// so other processes on a shared machine inflate the figure as little as possible.
fn time(min: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..8 {
        let start = Instant::now();
        let mut calls = 0u32;
        while start.elapsed() < min / 8 || calls < 2 {
            f();
            calls += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / f64::from(calls));
    }
    best
}

/// A random `[n, k]` matrix quantized to `dtype` (no dequantized copy: the output layer
/// is 167M weights).
fn quantized(dtype: GgmlDType, n: usize, k: usize) -> QTensor {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let t = Tensor::from_vec(random(&mut rng, n * k), (n, k), &Device::Cpu).unwrap();
    QTensor::quantize(&t, dtype).unwrap()
}

/// The row counts `SONDE_BENCH_ROWS` names (comma-separated), else `default`'s.
fn bench_rows(default: &str) -> Vec<usize> {
    std::env::var("SONDE_BENCH_ROWS")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|r| r.trim().parse().unwrap())
        .collect()
}

/// `RAYON_NUM_THREADS=T cargo test -p sonde-shard --release --lib cpu_matmul::tests::bench
/// -- --ignored --nocapture`, for T = 1 and 2 (candle's pool reads the same variable, once
/// per process). `SONDE_BENCH_FORMATS=q4_k,q6_k` picks formats, `SONDE_BENCH_ROWS=1,2,4`
/// the row counts (default 1 and 16), `SONDE_BENCH_CANDLE=0` skips candle's side, and
/// `SONDE_BENCH_WIDE=1` gives the Q4_0–Q5_1 matrices their wide copy, as the shard does.
/// Gemma 3 270M's shapes:
/// 640 → 2048 (gate/up), 2048 → 640 (down), and its tied 262144 × 640 Q8_0 output layer
/// (which prompt logprobs run 16 rows a chunk by default, `auto_logits_chunk`). GB/s: the
/// weights' bytes streamed per second (at 1 row, the decode cost).
#[test]
#[ignore]
fn bench() {
    let min = Duration::from_millis(300);
    println!(
        "threads: {}, kernel: {:?}",
        rayon::current_num_threads(),
        isa()
    );
    let wanted = std::env::var("SONDE_BENCH_FORMATS").unwrap_or_default();
    let rows = bench_rows("1,16");
    let with_candle = std::env::var("SONDE_BENCH_CANDLE").map_or(true, |v| v != "0");
    let wide = std::env::var("SONDE_BENCH_WIDE").is_ok_and(|v| v == "1");
    let mut cases: Vec<(GgmlDType, usize, usize, &[usize])> = Vec::new();
    for dtype in FORMATS {
        let name = format!("{dtype:?}");
        if !wanted.is_empty() && !wanted.split(',').any(|w| w.eq_ignore_ascii_case(&name)) {
            continue;
        }
        for (k, n) in [(640usize, 2048usize), (2048, 640)] {
            // K-quant rows must be whole super-blocks: 640 → 768.
            cases.push((dtype, k.next_multiple_of(dtype.block_size()), n, &rows));
        }
        if dtype == GgmlDType::Q8_0 {
            cases.push((dtype, 640, 262_144, &rows));
        }
    }
    // Ours first, then candle's: once candle's barrier pool exists, its workers spin
    // between jobs and would take a core from rayon's.
    let mut results = Vec::new();
    for (dtype, k, n, rows) in cases {
        let q = quantized(dtype, n, k);
        let mut ours = CpuQuantMatrix::from_qtensor(&q).unwrap();
        if wide {
            ours.add_wide_copy();
        }
        let mut timed = Vec::new();
        for &m in rows {
            let mut rng = ChaCha8Rng::seed_from_u64(8);
            let x = Tensor::from_vec(random(&mut rng, m * k), (m, k), &Device::Cpu).unwrap();
            let t = time(min, || drop(ours.forward(&x).unwrap()));
            timed.push((m, x, t));
        }
        results.push((q, ours.dtype_name(), timed));
    }
    for (q, name, timed) in results {
        let (n, k) = q.shape().dims2().unwrap();
        let bytes = q.storage_size_in_bytes() as f64;
        let qmm = QMatMul::from_qtensor(q).unwrap();
        for (m, x, t_ours) in timed {
            let t_candle = if with_candle {
                time(min, || drop(qmm.forward(&x).unwrap()))
            } else {
                f64::NAN
            };
            let flops = 2.0 * (m * n * k) as f64;
            println!(
                "BENCH {name:>5} m={m:2} k={k:4} n={n:6}: ours {:6.1} GFLOP/s {:8.1} µs {:5.1} GB/s | candle {:6.1} GFLOP/s {:8.1} µs",
                flops / t_ours / 1e9,
                t_ours * 1e6,
                bytes / t_ours / 1e9,
                flops / t_candle / 1e9,
                t_candle * 1e6,
            );
        }
    }
}

/// SmolLM2-135M's layers.
const LAYERS: usize = 30;
/// SmolLM2-135M's products, (k, n): q, k, v, o, gate, up, down.
const SHAPES: [(usize, usize); 7] = [
    (576, 576),
    (576, 192),
    (576, 192),
    (576, 576),
    (576, 1536),
    (576, 1536),
    (1536, 576),
];

/// SmolLM2-135M's 30 layers of products, Q4_1 with the wide copy as the shard has them.
/// The layers hold the same values (`quantized` is seeded) at distinct addresses, which is
/// all that decides whether a step finds them in cache.
fn smollm2_layers() -> Vec<Vec<CpuQuantMatrix>> {
    (0..LAYERS)
        .map(|_| {
            SHAPES
                .iter()
                .map(|&(k, n)| {
                    let q = quantized(GgmlDType::Q4_1, n, k);
                    let mut m = CpuQuantMatrix::from_qtensor(&q).unwrap();
                    m.add_wide_copy();
                    m
                })
                .collect()
        })
        .collect()
}

/// SmolLM2-135M's decode-step products (Q4_1 with its wide copy, 30 layers; q, k and v as
/// one job, gate and up as one) over 30 distinct layers, so that every step reads its
/// weights from memory as the shard's does, against one layer 30 times, whose weights
/// stay in cache. `SONDE_BENCH_ROWS` picks the rows (default 1, 4, 16, 96), and
/// `RAYON_NUM_THREADS` the threads (the team's size follows it). Prints each's best time
/// and the median ratio of 9 alternations (memory over cache), with its range.
#[test]
#[ignore]
fn step_from_memory() {
    let rows = bench_rows("1,4,16,96");
    let layers = smollm2_layers();
    let macs: usize = SHAPES.iter().map(|(k, n)| k * n).sum();
    for m in rows {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let x = Tensor::from_vec(random(&mut rng, m * 576), (m, 576), &Device::Cpu).unwrap();
        let h = Tensor::from_vec(random(&mut rng, m * 1536), (m, 1536), &Device::Cpu).unwrap();
        let step = |ls: &[&Vec<CpuQuantMatrix>]| {
            for l in ls {
                drop(CpuQuantMatrix::forward_same(&[&l[0], &l[1], &l[2]], &x).unwrap());
                drop(l[3].forward(&x).unwrap());
                drop(CpuQuantMatrix::forward_same(&[&l[4], &l[5]], &x).unwrap());
                drop(l[6].forward(&h).unwrap());
            }
        };
        let memory: Vec<&Vec<CpuQuantMatrix>> = layers.iter().collect();
        let cache: Vec<&Vec<CpuQuantMatrix>> = (0..LAYERS).map(|_| &layers[0]).collect();
        let (mut best_memory, mut best_cache, mut ratios) = (f64::INFINITY, f64::INFINITY, vec![]);
        for _ in 0..9 {
            let a = time(Duration::from_millis(200), || step(&memory));
            let b = time(Duration::from_millis(200), || step(&cache));
            (best_memory, best_cache) = (best_memory.min(a), best_cache.min(b));
            ratios.push(a / b);
        }
        ratios.sort_by(f64::total_cmp);
        let flops = 2.0 * (LAYERS * macs * m) as f64;
        println!(
            "STEP m={m:2}: from memory {:6.1} GFLOP/s {:7.0} µs, from cache {:6.1} GFLOP/s {:7.0} µs, ratio {:.2} ({:.2}-{:.2})",
            flops / best_memory / 1e9,
            best_memory * 1e6,
            flops / best_cache / 1e9,
            best_cache * 1e6,
            ratios[4],
            ratios[0],
            ratios[8],
        );
    }
}

/// The kernel that puts rows in lanes against the other kernels, on every SIMD variant this
/// CPU runs (`kernel::rows_in_lanes` gives it rows on AVX-512 only): SmolLM2's decode-step
/// products from memory (as [`step_from_memory`]), all rows to one kernel or the other.
/// Prints the median ratio of 9 alternations (the other kernels' time over the lanes
/// kernel's: above 1, lanes is faster), with its range. `SONDE_BENCH_ROWS` picks the rows
/// (default 16, 32, 96), `RAYON_NUM_THREADS` the threads.
#[test]
#[ignore]
fn lanes_against_columns() {
    let layers = smollm2_layers();
    // The portable kernel takes seconds a step: minutes for each row count.
    for isa in isas()
        .into_iter()
        .filter(|isa| !matches!(isa, Isa::Portable))
    {
        for m in bench_rows("16,32,96") {
            let mut rng = ChaCha8Rng::seed_from_u64(8);
            let x = random(&mut rng, m * 576);
            let h = random(&mut rng, m * 1536);
            let step = |in_lanes: usize| {
                let split = Split {
                    cols: None,
                    in_lanes: Some(in_lanes),
                };
                for l in &layers {
                    drop(tasks::products(&[&l[0], &l[1], &l[2]], &x, isa, split));
                    drop(tasks::products(&[&l[3]], &x, isa, split));
                    drop(tasks::products(&[&l[4], &l[5]], &x, isa, split));
                    drop(tasks::products(&[&l[6]], &h, isa, split));
                }
            };
            let mut ratios: Vec<f64> = (0..9)
                .map(|_| {
                    let columns = time(Duration::from_millis(200), || step(0));
                    columns / time(Duration::from_millis(200), || step(m))
                })
                .collect();
            ratios.sort_by(f64::total_cmp);
            println!(
                "LANES {isa:?} m={m:2}: other kernels / lanes {:.2} ({:.2}-{:.2})",
                ratios[4], ratios[0], ratios[8]
            );
        }
    }
}
