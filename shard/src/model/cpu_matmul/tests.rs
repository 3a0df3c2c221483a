use super::blocks::Tile;
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Portable, Simd};
use super::*;

use std::time::{Duration, Instant};

use candle_core::quantized::QMatMul;
use candle_core::Module;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const FORMATS: [GgmlDType; 3] = [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0];

fn random(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// A random `[n, k]` matrix quantized to `dtype`: (candle's tensor, ours, dequantized).
fn matrix(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> (QTensor, CpuQuantMatrix, Vec<f32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let t = Tensor::from_vec(random(&mut rng, n * k), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, dtype).unwrap();
    let ours = CpuQuantMatrix::from_qtensor(&q).unwrap();
    let w = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    (q, ours, w)
}

/// Every kernel variant this CPU can run.
fn isas() -> Vec<Isa> {
    #[allow(unused_mut)]
    let mut v = vec![Isa::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        v.extend(Avx2::detect().map(Isa::Avx2));
        v.extend(Avx512::detect().map(Isa::Avx512));
    }
    v
}

/// The `[n, k]` weights the tiles hold, row-major, as the kernel dequantizes them.
fn dequantize_all<S: Simd, T: Tile>(s: S, tiles: &[T], n: usize, k: usize) -> Vec<f32> {
    let nb = k / QK;
    let mut out = vec![0f32; n * k];
    for (i, t) in tiles.iter().enumerate() {
        let (g, b) = (i / nb, i % nb);
        let scales = t.scales(s);
        for j in 0..QK / 2 {
            for (half, v) in t.pair(s, &scales, j).into_iter().enumerate() {
                let mut h = [0.0; LANES];
                s.store(v, &mut h);
                for (c, w) in h.iter().enumerate() {
                    let col = g * TILE + c;
                    if col < n {
                        out[col * k + b * QK + half * QK / 2 + j] = *w;
                    }
                }
            }
        }
    }
    out
}

fn dequantize_with<S: Simd>(s: S, m: &CpuQuantMatrix) -> Vec<f32> {
    let (n, k) = m.dims();
    match &m.tiles {
        Tiles::Q4_0(t) => dequantize_all(s, t, n, k),
        Tiles::Q4_1(t) => dequantize_all(s, t, n, k),
        Tiles::Q8_0(t) => dequantize_all(s, t, n, k),
        Tiles::F32(t) => dequantize_all(s, t, n, k),
    }
}

#[test]
fn dequantization_matches_candle_bit_for_bit() {
    for dtype in FORMATS {
        let (n, k) = (37, 576); // not a multiple of 16: a padded tile too
        let (_, ours, w) = matrix(dtype, n, k, 1);
        for isa in isas() {
            let got = match isa {
                Isa::Portable => dequantize_with(Portable, &ours),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2(t) => dequantize_with(t, &ours),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512(t) => dequantize_with(t, &ours),
            };
            assert_eq!(got.len(), w.len());
            for (i, (a, b)) in got.iter().zip(&w).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{dtype:?} {isa:?} element {i}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn matches_f64_reference() {
    let mut worst = 0f64;
    for (f, dtype) in FORMATS.into_iter().enumerate() {
        for k in [32, 576, 1536] {
            for n in [1, 7, 576] {
                let (_, ours, w) = matrix(dtype, n, k, 10 + f as u64);
                assert_eq!(ours.dims(), (n, k));
                for m in [1, 3, 17, 32] {
                    let mut rng = ChaCha8Rng::seed_from_u64((m * 1000 + k + n) as u64);
                    let x = random(&mut rng, m * k);
                    let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
                    let y = ours.forward(&xt).unwrap();
                    assert_eq!(y.dims(), &[m, n]);
                    let y = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    // Error bound of k sequential fmas (and the final f64 → f32
                    // comparison), relative to Σ|x·w|.
                    let bound = (k + 1) as f64 * f64::from(f32::EPSILON) / 2.0;
                    for r in 0..m {
                        for j in 0..n {
                            let (mut exact, mut mag) = (0f64, 0f64);
                            for i in 0..k {
                                let p = f64::from(x[r * k + i]) * f64::from(w[j * k + i]);
                                exact += p;
                                mag += p.abs();
                            }
                            let err = (f64::from(y[r * n + j]) - exact).abs();
                            assert!(
                                err <= bound * mag + 1e-30,
                                "{dtype:?} m={m} k={k} n={n} ({r},{j}): {} vs {exact} (|x·w| {mag})",
                                y[r * n + j]
                            );
                            worst = worst.max(err / mag.max(1e-30));
                        }
                    }
                }
            }
        }
    }
    println!("worst error relative to Σ|x·w|: {worst:.3e}");
}

#[test]
fn a_row_is_bitwise_the_same_alone_or_in_any_batch() {
    let (n, k) = (101, 576); // n not a multiple of any column group: padded groups too
    for (f, dtype) in FORMATS.into_iter().enumerate() {
        let (_, ours, _) = matrix(dtype, n, k, 20 + f as u64);
        let mut rng = ChaCha8Rng::seed_from_u64(99);
        let probe = random(&mut rng, k);
        let alone = ours.matmul(&probe, 1, isa(), None);
        let via_forward = ours
            .forward(&Tensor::from_vec(probe.clone(), (1, k), &Device::Cpu).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(bits(&alone), bits(&via_forward));

        for m in [1, 2, 5, 17, 32, 130] {
            for pos in [0, m / 2, m - 1] {
                let mut x = random(&mut rng, m * k);
                if m > 1 {
                    // A neighbour full of NaN and huge values must not leak either.
                    let other = if pos == 0 { 1 } else { 0 };
                    x[other * k] = f32::NAN;
                    x[other * k + 1] = 3e38;
                }
                x[pos * k..(pos + 1) * k].copy_from_slice(&probe);
                for isa in isas() {
                    for cols in [None, Some(1), Some(16), Some(48), Some(n)] {
                        let y = ours.matmul(&x, m, isa, cols);
                        assert_eq!(
                            bits(&y[pos * n..(pos + 1) * n]),
                            bits(&alone),
                            "{dtype:?} m={m} pos={pos} {isa:?} cols={cols:?}"
                        );
                    }
                }
                let y = ours
                    .forward(&Tensor::from_vec(x, (m, k), &Device::Cpu).unwrap())
                    .unwrap()
                    .get(pos)
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                assert_eq!(bits(&y), bits(&alone), "{dtype:?} forward m={m} pos={pos}");
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn forward_takes_any_leading_shape_and_layout() {
    let (n, k) = (13, 64);
    let (_, ours, _) = matrix(GgmlDType::Q4_1, n, k, 5);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let x = Tensor::from_vec(random(&mut rng, 6 * k), (6, k), &Device::Cpu).unwrap();
    let flat = ours.forward(&x).unwrap();
    let y3 = ours.forward(&x.reshape((2, 3, k)).unwrap()).unwrap();
    assert_eq!(y3.dims(), &[2, 3, n]);
    let same = |a: &Tensor, b: &Tensor| {
        let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(bits(&a), bits(&b));
    };
    same(&y3, &flat);
    // Non-contiguous input (a transpose) and a non-zero start offset (a narrow).
    let xt = x.t().unwrap().contiguous().unwrap().t().unwrap();
    assert!(!xt.is_contiguous());
    same(&ours.forward(&xt).unwrap(), &flat);
    same(
        &ours.forward(&x.narrow(0, 2, 3).unwrap()).unwrap(),
        &flat.narrow(0, 2, 3).unwrap(),
    );
    let empty = Tensor::zeros((0, k), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(ours.forward(&empty).unwrap().dims(), &[0, n]);

    assert!(ours.forward(&x.narrow(1, 0, 32).unwrap()).is_err());
    assert!(ours.forward(&x.to_dtype(DType::F16).unwrap()).is_err());
    assert_eq!(ours.dtype_name(), "q4_1");
    assert_eq!(format!("{ours:?}"), "CpuQuantMatrix[q4_1; 13x64]");
}

#[test]
fn only_2d_q4_0_q4_1_q8_0_are_taken() {
    let t = |shape: &[usize]| {
        let len = shape.iter().product();
        Tensor::from_vec(vec![0.5f32; len], shape, &Device::Cpu).unwrap()
    };
    let q = |shape: &[usize], dtype| QTensor::quantize(&t(shape), dtype).unwrap();
    for (dtype, name) in FORMATS.into_iter().zip(["q4_0", "q4_1", "q8_0"]) {
        let m = CpuQuantMatrix::from_qtensor(&q(&[3, 64], dtype)).unwrap();
        assert_eq!((m.dims(), m.dtype_name()), ((3, 64), name));
        assert!(CpuQuantMatrix::from_qtensor(&q(&[2, 3, 64], dtype)).is_none());
        assert!(CpuQuantMatrix::from_qtensor(&q(&[64], dtype)).is_none());
    }
    for dtype in [
        GgmlDType::Q4K,
        GgmlDType::Q6K,
        GgmlDType::F32,
        GgmlDType::F16,
    ] {
        assert!(CpuQuantMatrix::from_qtensor(&q(&[2, 256], dtype)).is_none());
    }
}

/// Every Q4_0 / Q4_1 / Q8_0 matrix of the real model (skipped when the GGUF is not
/// fetched): weights bit-identical to candle's, products within the f32 bound.
#[test]
fn real_model_matrices() {
    use candle_core::quantized::gguf_file;
    let data = std::env::var_os("SONDE_DATA_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data"));
    let path = data.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let Ok(file) = std::fs::File::open(&path) else {
        println!("skipped: no {}", path.display());
        return;
    };
    let mut reader = std::io::BufReader::new(file);
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut names: Vec<_> = content.tensor_infos.keys().cloned().collect();
    names.sort();
    let (mut taken, mut formats) = (0, std::collections::BTreeSet::new());
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for name in names {
        let q = content.tensor(&mut reader, &name, &Device::Cpu).unwrap();
        let Some(ours) = CpuQuantMatrix::from_qtensor(&q) else {
            continue;
        };
        taken += 1;
        formats.insert(ours.dtype_name());
        let (n, k) = ours.dims();
        let w = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
        let w = w.to_vec1::<f32>().unwrap();
        assert_eq!(bits(&dequantize_with(Portable, &ours)), bits(&w), "{name}");
        let m = 2;
        let x = random(&mut rng, m * k);
        let y = ours.matmul(&x, m, isa(), None);
        let bound = (k + 1) as f64 * f64::from(f32::EPSILON) / 2.0;
        for r in 0..m {
            for j in 0..n {
                let (mut exact, mut mag) = (0f64, 0f64);
                for i in 0..k {
                    let p = f64::from(x[r * k + i]) * f64::from(w[j * k + i]);
                    exact += p;
                    mag += p.abs();
                }
                let err = (f64::from(y[r * n + j]) - exact).abs();
                assert!(err <= bound * mag + 1e-30, "{name} ({r},{j})");
            }
        }
    }
    println!("{taken} matrices checked, formats {formats:?}");
    assert!(taken > 0);
}

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

/// `cargo test -p sonde-shard --release --lib cpu_matmul::tests::bench -- --ignored --nocapture`
#[test]
#[ignore]
fn bench() {
    let min = Duration::from_millis(300);
    println!(
        "threads: {}, kernel: {:?}",
        rayon::current_num_threads(),
        isa()
    );
    let shapes = [(576, 1536), (1536, 576), (576, 49152)];
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
        for (k, n) in shapes {
            let (q, ours, _) = matrix(dtype, n, k, 7);
            let qmm = QMatMul::from_qtensor(q).unwrap();
            for m in [1, 16, 32] {
                let mut rng = ChaCha8Rng::seed_from_u64(8);
                let x = Tensor::from_vec(random(&mut rng, m * k), (m, k), &Device::Cpu).unwrap();
                let flops = 2.0 * (m * n * k) as f64;
                let t_ours = time(min, || drop(ours.forward(&x).unwrap()));
                let t_candle = time(min, || drop(qmm.forward(&x).unwrap()));
                let xv = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                // Per core: every variant on one thread (the portable one only where it
                // is not a libm call per multiply-add, i.e. not on x86).
                let mut per_isa = String::new();
                for isa in isas() {
                    if matches!(isa, Isa::Portable) && cfg!(target_arch = "x86_64") {
                        continue;
                    }
                    let t = one_thread
                        .install(|| time(min / 2, || drop(ours.matmul(&xv, m, isa, None))));
                    per_isa += &format!(" {isa:?} {:5.1}", flops / t / 1e9);
                }
                println!(
                    "{dtype:?} m={m:2} k={k:4} n={n:5}: ours {:6.1} GFLOP/s {:8.1} µs | candle {:6.1} GFLOP/s {:8.1} µs | 1 thread:{per_isa}",
                    flops / t_ours / 1e9,
                    t_ours * 1e6,
                    flops / t_candle / 1e9,
                    t_candle * 1e6,
                );
            }
        }
    }
}

#[test]
fn dense_f32_rows_are_exact_and_batch_invariant() {
    let (m, k, n) = (17, 576, 40);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 31.0)
        .collect();
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 13 % 89) as f32 - 44.0) / 17.0)
        .collect();
    let wt = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu).unwrap();
    let ours = CpuQuantMatrix::from_dense(&wt).unwrap();
    assert_eq!(ours.dtype_name(), "f32");
    let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
    let all = ours.forward(&xt).unwrap().to_vec2::<f32>().unwrap();
    for r in 0..m {
        let alone = ours
            .forward(&xt.narrow(0, r, 1).unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for c in 0..n {
            assert_eq!(
                alone[0][c].to_bits(),
                all[r][c].to_bits(),
                "row {r} col {c}"
            );
            let exact: f64 = (0..k)
                .map(|i| x[r * k + i] as f64 * w[c * k + i] as f64)
                .sum();
            let scale: f64 = (0..k)
                .map(|i| (x[r * k + i] as f64 * w[c * k + i] as f64).abs())
                .sum();
            assert!(
                (all[r][c] as f64 - exact).abs() <= 1e-6 * scale,
                "row {r} col {c}"
            );
        }
    }
}
