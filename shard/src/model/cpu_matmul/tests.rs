use super::*;
use kernel::Isa;
#[cfg(target_arch = "x86_64")]
use simd::{Avx2, Avx512};
use tasks::Split;

use std::borrow::Cow;

use candle_core::quantized::QStorage;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod bench;
mod real;

/// Every format served.
const FORMATS: [GgmlDType; 11] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
];

fn random(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `t`'s values, flattened.
fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// A random `[n, k]` matrix quantized to `dtype`: (candle's tensor, ours, dequantized).
fn matrix(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> (QTensor, CpuQuantMatrix, Vec<f32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let t = Tensor::from_vec(random(&mut rng, n * k), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, dtype).unwrap();
    let ours = CpuQuantMatrix::from_qtensor(&q).unwrap();
    let w = values(&q.dequantize(&Device::Cpu).unwrap());
    (q, ours, w)
}

/// Where a block of `dtype` keeps f16 scales (byte offsets).
fn f16_fields(dtype: GgmlDType) -> &'static [usize] {
    match dtype {
        GgmlDType::Q4_0 | GgmlDType::Q5_0 | GgmlDType::Q8_0 => &[0],
        GgmlDType::Q4_1 | GgmlDType::Q5_1 | GgmlDType::Q4K | GgmlDType::Q5K => &[0, 2],
        GgmlDType::Q6K => &[208],
        _ => &[],
    }
}

/// An `[n, k]` tensor of `dtype` made of random bytes: every bit pattern of the quants
/// and packed scales, negative and zero scales (signed zeros); f16 scales kept finite (a
/// NaN scale's payload is not a weight). Dense formats take any bits, NaN and infinity
/// included.
fn random_blocks(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> QTensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (block, size) = (dtype.block_size(), dtype.type_size());
    let mut data: Vec<u8> = (0..n * k / block * size).map(|_| rng.random()).collect();
    for b in data.chunks_exact_mut(size) {
        for &at in f16_fields(dtype) {
            if b[at + 1] & 0x7C == 0x7C {
                b[at + 1] &= !0x40; // exponent 31 (inf / NaN) → 15
            }
        }
    }
    let storage = QStorage::from_data(Cow::Owned(data), &Device::Cpu, dtype).unwrap();
    QTensor::new(storage, (n, k)).unwrap()
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

/// All `n` rows of `m` as `isa`'s kernel dequantizes them.
fn dequantize_with(m: &CpuQuantMatrix, isa: Isa) -> Vec<f32> {
    let (n, k) = m.dims();
    let mut out = vec![0f32; n * k];
    for (i, row) in out.chunks_exact_mut(k).enumerate() {
        m.tiles.row(i, row, isa);
    }
    out
}

/// Asserts `got` and `want` are the same bits, naming the first difference.
fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}, element {i}: {a} vs {b}");
    }
}

#[test]
fn tiles_hold_the_blocks_bytes_and_no_more() {
    use blocks::*;
    fn bytes<T: Tile>() -> (usize, usize) {
        (std::mem::size_of::<T>(), TILE * T::RAW_BYTES)
    }
    for (name, (tile, blocks)) in [
        ("q4_0", bytes::<Q4_0>()),
        ("q4_1", bytes::<Q4_1>()),
        ("q5_0", bytes::<Q5_0>()),
        ("q5_1", bytes::<Q5_1>()),
        ("q8_0", bytes::<Q8_0>()),
        ("q4_k", bytes::<Q4K>()),
        ("q5_k", bytes::<Q5K>()),
        ("q6_k", bytes::<Q6K>()),
        ("f32", bytes::<F32>()),
        ("f16", bytes::<F16>()),
        ("bf16", bytes::<Bf16>()),
    ] {
        assert_eq!(tile, blocks, "{name}");
    }
}

#[test]
fn dequantization_matches_candle_bit_for_bit() {
    let (n, k) = (37, 512); // n not a multiple of 16: a padded tile too
    for (f, dtype) in FORMATS.into_iter().enumerate() {
        let quantized = matrix(dtype, n, k, 1 + f as u64).0;
        let raw = random_blocks(dtype, n, k, 100 + f as u64);
        for (source, q) in [("quantized", quantized), ("random bytes", raw)] {
            let ours = CpuQuantMatrix::from_qtensor(&q).unwrap();
            let w = values(&q.dequantize(&Device::Cpu).unwrap());
            for isa in isas() {
                let got = dequantize_with(&ours, isa);
                assert_same_bits(&got, &w, &format!("{dtype:?} {source} {isa:?}"));
            }
        }
    }
}

#[test]
fn row_into_is_to_float_of_that_row() {
    let (n, k) = (21, 256);
    for (f, dtype) in FORMATS.into_iter().enumerate() {
        let q = random_blocks(dtype, n, k, 200 + f as u64);
        let ours = CpuQuantMatrix::from_qtensor(&q).unwrap();
        let w = values(&q.dequantize(&Device::Cpu).unwrap());
        let mut row = vec![0f32; k];
        for i in [0, 1, 15, 16, 20] {
            ours.row_into(i, &mut row).unwrap();
            assert_same_bits(&row, &w[i * k..(i + 1) * k], &format!("{dtype:?} row {i}"));
        }
        assert!(ours.row_into(n, &mut row).is_err());
        assert!(ours.row_into(0, &mut row[1..]).is_err());
    }
}

/// Σ x·w in f64, and the magnitude the rounding error is bounded by: Σ |x| (|w - b| + 2
/// |b|), `b` the weight's offset. The kernel sums `x · q` and `x` apart and scales them by
/// `a` and `b` (`w = a q + b`), so each of those terms carries its own rounding; without
/// an offset this is Σ |x·w|.
fn reference(x: &[f32], w: &[f32], b: &[f32]) -> (f64, f64) {
    x.iter()
        .zip(w)
        .zip(b)
        .fold((0.0, 0.0), |(sum, mag), ((&x, &w), &b)| {
            let (x, w, b) = (f64::from(x), f64::from(w), f64::from(b));
            (sum + x * w, mag + x.abs() * ((w - b).abs() + 2.0 * b.abs()))
        })
}

/// All `n` rows of `m`'s offsets.
fn offsets(m: &CpuQuantMatrix) -> Vec<f32> {
    let (n, k) = m.dims();
    let mut out = vec![0f32; n * k];
    for (i, row) in out.chunks_exact_mut(k).enumerate() {
        m.tiles.row_offsets(i, row);
    }
    out
}

/// Asserts every output of `y = x @ w^T` (`m` rows, `n` columns, offsets `b`) is within
/// the error bound of the kernel's sums relative to the magnitude of [`reference`]: `k`
/// sequential fmas, the per-part sums of `x` (16 terms) and the scaling of each part's
/// two sums into the output (4 per part of 16 inputs at most), and the final f64 → f32
/// rounding; returns the worst relative error.
fn check_against_f64(
    x: &[f32],
    (w, b): (&[f32], &[f32]),
    y: &[f32],
    (m, n, k): (usize, usize, usize),
) -> f64 {
    let bound = (k + 16 + 4 * k / 16 + 1) as f64 * f64::from(f32::EPSILON) / 2.0;
    let mut worst = 0f64;
    for r in 0..m {
        for j in 0..n {
            let row = |v: &[f32]| v[j * k..(j + 1) * k].to_vec();
            let (exact, mag) = reference(&x[r * k..(r + 1) * k], &row(w), &row(b));
            let err = (f64::from(y[r * n + j]) - exact).abs();
            assert!(
                err <= bound * mag + 1e-30,
                "m={m} k={k} n={n} ({r},{j}): {} vs {exact} (magnitude {mag})",
                y[r * n + j]
            );
            worst = worst.max(err / mag.max(1e-30));
        }
    }
    worst
}

#[test]
fn matches_f64_reference() {
    let mut worst = 0f64;
    for (f, dtype) in FORMATS.into_iter().enumerate() {
        let ks: &[usize] = match dtype.block_size() {
            256 => &[256, 768, 1536],
            _ => &[32, 576, 1536],
        };
        for &k in ks {
            for n in [1, 7, 133] {
                let (_, ours, w) = matrix(dtype, n, k, 10 + f as u64);
                assert_eq!(ours.dims(), (n, k));
                let b = offsets(&ours);
                for m in [1, 3, 17, 32] {
                    let mut rng = ChaCha8Rng::seed_from_u64((m * 1000 + k + n) as u64);
                    let x = random(&mut rng, m * k);
                    let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
                    let y = ours.forward(&xt).unwrap();
                    assert_eq!(y.dims(), &[m, n]);
                    worst = worst.max(check_against_f64(&x, (&w, &b), &values(&y), (m, n, k)));
                }
            }
        }
    }
    println!("worst error relative to the magnitude: {worst:.3e}");
}

/// Blocks of random bytes (offsets far from the scales, so `a · Σ q x` and `b · Σ x`
/// cancel) stay within the same bound.
#[test]
fn random_blocks_match_f64_reference() {
    for (f, dtype) in FORMATS.into_iter().enumerate() {
        if dtype.block_size() == 1 {
            continue; // dense: their own test
        }
        let (n, k) = (37, 2 * dtype.block_size().max(256));
        let q = random_blocks(dtype, n, k, 40 + f as u64);
        let ours = CpuQuantMatrix::from_qtensor(&q).unwrap();
        let w = values(&q.dequantize(&Device::Cpu).unwrap());
        let b = offsets(&ours);
        for m in [1, 7] {
            let mut rng = ChaCha8Rng::seed_from_u64(m as u64);
            let x = random(&mut rng, m * k);
            check_against_f64(&x, (&w, &b), &ours.matmul(&x, isa(), None), (m, n, k));
        }
    }
}

#[test]
fn a_row_is_bitwise_the_same_alone_or_in_any_batch() {
    let (n, k) = (101, 512); // n not a multiple of any column group: padded groups too
    for (f, dtype) in FORMATS.into_iter().enumerate() {
        let (_, ours, _) = matrix(dtype, n, k, 20 + f as u64);
        let mut rng = ChaCha8Rng::seed_from_u64(99);
        let probe = random(&mut rng, k);
        let alone = ours.matmul(&probe, isa(), None);
        let via_forward = values(
            &ours
                .forward(&Tensor::from_vec(probe.clone(), (1, k), &Device::Cpu).unwrap())
                .unwrap(),
        );
        assert_eq!(bits(&alone), bits(&via_forward));

        // Every tier of rows (8, 4, 2, 1 at a time) holds the probe in some case.
        for m in [1, 2, 3, 5, 7, 11, 14, 17, 32, 130] {
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
                        let y = ours.matmul(&x, isa, cols);
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

/// The kernel that puts rows in the vector lanes (`kernel::lanes`; AVX-512 gives it the
/// groups of 16 rows), made to take the first rows of a product, whole groups or not, on
/// every kernel variant, for every format, from the packed tiles and the wide copy: each
/// row's outputs are its bits alone, and so are those of the rows the other kernels take
/// after it. 576 inputs end in a short chunk of tiles for the formats of 32-input blocks,
/// and 260 rows are two pieces for every format (the kernel widens each step's chunk
/// while it multiplies the one before).
#[test]
fn the_lanes_kernel_gives_each_row_its_bits_alone() {
    let cases: [(usize, &[usize]); 2] = [(512, &[1, 5, 16, 17, 33, 260]), (576, &[17, 260])];
    for (f, dtype) in FORMATS.into_iter().enumerate() {
        for (k, ms) in cases {
            if k % dtype.block_size() != 0 {
                continue;
            }
            lanes_case(dtype, k, ms, 40 + f as u64);
        }
    }
}

/// [`the_lanes_kernel_gives_each_row_its_bits_alone`] for one format, `k` and row counts.
fn lanes_case(dtype: GgmlDType, k: usize, ms: &[usize], seed: u64) {
    let n = 37; // not a multiple of 16: the last tile stands past it
    let (_, packed, _) = matrix(dtype, n, k, seed);
    let mut wide = packed.clone();
    wide.add_wide_copy();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for &m in ms {
        let x = random(&mut rng, m * k);
        for isa in isas() {
            let alone: Vec<Vec<f32>> = x
                .chunks_exact(k)
                .map(|row| {
                    packed.matmul_split(
                        row,
                        isa,
                        Split {
                            in_lanes: Some(0),
                            ..Split::default()
                        },
                    )
                })
                .collect();
            for in_lanes in [m, m / 2, 16] {
                for (which, mat) in [("packed", &packed), ("wide", &wide)] {
                    for cols in [None, Some(16)] {
                        let split = Split {
                            cols,
                            in_lanes: Some(in_lanes),
                        };
                        let y = mat.matmul_split(&x, isa, split);
                        for (r, alone) in alone.iter().enumerate() {
                            assert_same_bits(
                                    &y[r * n..(r + 1) * n],
                                    alone,
                                    &format!("{dtype:?} {which} m={m} in lanes {in_lanes} row {r} {isa:?} cols={cols:?}"),
                                );
                        }
                    }
                }
            }
        }
    }
}

/// Rows in lanes (`input::LaneRows`) are the rows turned around: each group of 16 rows
/// (the last with fewer, its other lanes zero) holds input `i` of its rows in one vector,
/// and so with their run sums, whose rows here end in a block of fewer than 16 (576
/// inputs, 36 sums).
#[test]
fn rows_in_lanes_are_the_rows_turned_around() {
    let k = 576;
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for rows in [3, 16, 21, 33] {
        let x = random(&mut rng, rows * k);
        let sums = random(&mut rng, rows * k / LANES);
        let held = input::LaneRows::new(&x, &sums, k, rows);
        let lanes = held.lanes();
        for (what, got, v, len) in [("x", lanes.x, &x, k), ("sums", lanes.sums, &sums, k / 16)] {
            assert_eq!(got.len(), rows.div_ceil(LANES) * len, "{what} rows={rows}");
            for (g, group) in got.chunks_exact(len).enumerate() {
                for (i, line) in group.iter().enumerate() {
                    for (lane, value) in line.0.iter().enumerate() {
                        let r = g * LANES + lane;
                        let want = if r < rows { v[r * len + i] } else { 0.0 };
                        assert_eq!(
                            value.to_bits(),
                            want.to_bits(),
                            "{what} rows={rows} row {r} input {i}"
                        );
                    }
                }
            }
        }
    }
}

/// The wide copy of the 4- and 5-bit formats (`blocks::wide`), on blocks of random bytes
/// (every quant, negative and zero scales): products of `WIDE_MIN_ROWS` rows or more read
/// it (these row counts take every group size of the kernels' sweeps), and each row's
/// outputs are the bits of that row alone (read from the packed tiles), on every kernel
/// variant; built from the raw blocks, its weights are candle's too.
#[test]
fn the_wide_copy_gives_the_packed_tiles_bits() {
    use blocks::{tiles, Tile, TileColumns, Wide, Q4_0, Q4_1, Q5_0, Q5_1};
    use simd::Portable;
    let (n, k) = (37, 256);
    for (f, dtype) in [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
    ]
    .into_iter()
    .enumerate()
    {
        let q = random_blocks(dtype, n, k, 70 + f as u64);
        let packed = CpuQuantMatrix::from_qtensor(&q).unwrap();
        let mut wide = packed.clone();
        assert!(wide.wide_copy_bytes() > 0, "{dtype:?}");
        wide.add_wide_copy();
        assert_eq!(wide.wide_copy_bytes(), 0, "{dtype:?}: one copy");
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for m in [10, 13, 14, 15, 16, 40] {
            assert!(m >= WIDE_MIN_ROWS);
            let x = random(&mut rng, m * k);
            for isa in isas() {
                let batch = wide.matmul(&x, isa, None);
                for (r, row) in x.chunks_exact(k).enumerate() {
                    let alone = packed.matmul(row, isa, None);
                    assert_same_bits(
                        &batch[r * n..(r + 1) * n],
                        &alone,
                        &format!("{dtype:?} m={m} row {r} {isa:?}"),
                    );
                }
            }
        }

        // Built from the raw blocks, lane by lane: the weights candle dequantizes.
        let data = q.data().unwrap();
        let want = values(&q.dequantize(&Device::Cpu).unwrap());
        let got = match dtype {
            GgmlDType::Q4_0 => weights(&tiles::<Wide<Q4_0>>(&data, n, k / 32).unwrap(), n, k),
            GgmlDType::Q4_1 => weights(&tiles::<Wide<Q4_1>>(&data, n, k / 32).unwrap(), n, k),
            GgmlDType::Q5_0 => weights(&tiles::<Wide<Q5_0>>(&data, n, k / 32).unwrap(), n, k),
            _ => weights(&tiles::<Wide<Q5_1>>(&data, n, k / 32).unwrap(), n, k),
        };
        assert_same_bits(&got, &want, &format!("{dtype:?} wide weights"));
    }

    /// The `[n, k]` weights the tiles hold, row by row.
    fn weights<T: Tile>(t: &[T], n: usize, k: usize) -> Vec<f32> {
        let columns = TileColumns::all(t, k / T::INPUTS);
        let mut out = vec![0f32; n * k];
        for (i, row) in out.chunks_exact_mut(k).enumerate() {
            blocks::row(Portable, columns.group(i / TILE, 1), i % TILE, row);
        }
        out
    }
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
    let same = |a: &Tensor, b: &Tensor| assert_eq!(bits(&values(a)), bits(&values(b)));
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
fn only_served_formats_and_2d_block_multiples_are_taken() {
    let t = |shape: &[usize]| {
        let len = shape.iter().product();
        Tensor::from_vec(vec![0.5f32; len], shape, &Device::Cpu).unwrap()
    };
    let q = |shape: &[usize], dtype| QTensor::quantize(&t(shape), dtype).unwrap();
    let names = [
        "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "f32", "f16", "bf16",
    ];
    for (dtype, name) in FORMATS.into_iter().zip(names) {
        assert!(CpuQuantMatrix::supports(dtype), "{dtype:?}");
        assert!(CpuQuantMatrix::SERVED.contains(name));
        let block = dtype.block_size().max(32);
        let m = CpuQuantMatrix::from_qtensor(&q(&[3, 2 * block], dtype)).unwrap();
        assert_eq!((m.dims(), m.dtype_name()), ((3, 2 * block), name));
        assert!(CpuQuantMatrix::from_qtensor(&q(&[2, 3, block], dtype)).is_none());
        assert!(CpuQuantMatrix::from_qtensor(&q(&[block], dtype)).is_none());
        if dtype.block_size() == 1 {
            // Dense rows must be whole blocks of 32 too.
            assert!(CpuQuantMatrix::from_qtensor(&q(&[2, 48], dtype)).is_none());
        }
    }
    for dtype in [
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q8K,
        GgmlDType::Q8_1,
    ] {
        assert!(!CpuQuantMatrix::supports(dtype), "{dtype:?}");
        assert!(CpuQuantMatrix::from_qtensor(&q(&[2, 256], dtype)).is_none());
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let m = CpuQuantMatrix::from_dense(&t(&[2, 64]).to_dtype(dtype).unwrap()).unwrap();
        assert_eq!(m.dims(), (2, 64));
        assert!(CpuQuantMatrix::from_dense(&t(&[2, 40]).to_dtype(dtype).unwrap()).is_none());
    }
    assert!(CpuQuantMatrix::from_dense(&t(&[2, 64]).to_dtype(DType::F64).unwrap()).is_none());
    assert!(CpuQuantMatrix::from_dense(&t(&[2, 2, 64])).is_none());
}

/// Dense f32 / f16 / bf16 tensors (as from safetensors): the rows are candle's values bit
/// for bit (NaN and infinity included), the products exact and batch-invariant.
#[test]
fn dense_rows_are_exact_and_batch_invariant() {
    let (m, k, n) = (17, 576, 40);
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut w = random(&mut rng, n * k);
    let x = random(&mut rng, m * k);
    let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
    for (dtype, name) in [
        (DType::F32, "f32"),
        (DType::F16, "f16"),
        (DType::BF16, "bf16"),
    ] {
        let wt = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let ours = CpuQuantMatrix::from_dense(&wt).unwrap();
        assert_eq!(ours.dtype_name(), name);
        let wf = values(&wt.to_dtype(DType::F32).unwrap());
        for isa in isas() {
            assert_same_bits(
                &dequantize_with(&ours, isa),
                &wf,
                &format!("{name} {isa:?}"),
            );
        }
        let all = values(&ours.forward(&xt).unwrap());
        for r in 0..m {
            let alone = values(&ours.forward(&xt.narrow(0, r, 1).unwrap()).unwrap());
            assert_eq!(
                bits(&alone),
                bits(&all[r * n..(r + 1) * n]),
                "{name} row {r}"
            );
        }
        check_against_f64(&x, (&wf, &vec![0.0; n * k]), &all, (m, n, k));
    }
    // Special values (including signalling NaNs) survive as candle converts them.
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        1e-40,
        f32::MAX,
    ];
    for (i, v) in special.iter().enumerate() {
        w[i * 7] = *v;
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut wt = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        if dtype != DType::F32 {
            // A signalling NaN at element 1: the exponent all ones, the top mantissa bit clear.
            let mut h: Vec<u16> = match dtype {
                DType::F16 => wt
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<half::f16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
                _ => wt
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<half::bf16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
            };
            h[1] = if dtype == DType::F16 { 0x7C01 } else { 0x7F81 };
            wt = match dtype {
                DType::F16 => Tensor::from_vec(
                    h.into_iter().map(half::f16::from_bits).collect(),
                    (n, k),
                    &Device::Cpu,
                ),
                _ => Tensor::from_vec(
                    h.into_iter().map(half::bf16::from_bits).collect(),
                    (n, k),
                    &Device::Cpu,
                ),
            }
            .unwrap();
        }
        let ours = CpuQuantMatrix::from_dense(&wt).unwrap();
        let wf = values(&wt.to_dtype(DType::F32).unwrap());
        for isa in isas() {
            assert_same_bits(
                &dequantize_with(&ours, isa),
                &wf,
                &format!("{dtype:?} special {isa:?}"),
            );
        }
    }
}
