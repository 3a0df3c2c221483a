use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::kernel::isa;
use super::*;
use crate::sampling::argmax;

/// A random `[n, k]` Q8_0 matrix with its greedy index (`None` on a CPU without the
/// kernel's instructions: then nothing here has anything to check).
fn matrix(n: usize, k: usize, seed: u64) -> Option<CpuQuantMatrix> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
    indexed(QTensor::quantize(&t, GgmlDType::Q8_0).unwrap())
}

/// A `[n, k]` Q8_0 matrix of random bytes: every quant, scales of every finite f16
/// (subnormal, zero, negative, up to 65504).
fn random_blocks(n: usize, k: usize, seed: u64) -> Option<CpuQuantMatrix> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut data: Vec<u8> = (0..n * k / 32 * 34).map(|_| rng.random()).collect();
    for b in data.chunks_exact_mut(34) {
        if b[1] & 0x7C == 0x7C {
            b[1] &= !0x40; // exponent 31 (inf / NaN) → 15
        }
    }
    let storage = QStorage::from_data(Cow::Owned(data), &Device::Cpu, GgmlDType::Q8_0).unwrap();
    indexed(QTensor::new(storage, (n, k)).unwrap())
}

fn indexed(q: QTensor) -> Option<CpuQuantMatrix> {
    let mut m = CpuQuantMatrix::from_qtensor(&q).unwrap();
    m.add_greedy_index();
    m.has_greedy_index().then_some(m)
}

/// Rows of inputs as a model's final hidden states look: mostly small, some dimensions
/// large (the "massive activations" of LLMs), a few exact zeros.
fn inputs(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..rows * k)
        .map(|i| match i % k {
            7 => rng.random_range(-60.0f32..60.0),
            100 => 0.0,
            _ => rng.random_range(-2.0f32..2.0) * rng.random_range(0.0f32..1.0),
        })
        .collect()
}

fn full_argmax(m: &CpuQuantMatrix, x: &[f32]) -> Vec<u32> {
    let logits = m.matmul(x, isa(), None);
    logits
        .chunks_exact(m.n)
        .map(|row| argmax(row).unwrap())
        .collect()
}

/// `[lo, hi]` of every column of every row as the kernel computes them: tile column
/// `g`'s 16 columns of row `r` at `(g m + r) 16 ..`.
struct Bounds {
    lo: Vec<f32>,
    hi: Vec<f32>,
    m: usize,
}

impl Bounds {
    fn lo(&self, g: usize, r: usize) -> &[f32] {
        &self.lo[(g * self.m + r) * TILE..][..TILE]
    }

    fn hi(&self, g: usize, r: usize) -> &[f32] {
        &self.hi[(g * self.m + r) * TILE..][..TILE]
    }
}

fn bounds_of(m: &CpuQuantMatrix, x: &[f32]) -> (Bounds, usize) {
    let Tiles::Q8_0(tiles) = &m.tiles else {
        panic!("not Q8_0")
    };
    let index = m.greedy.as_ref().unwrap();
    let q = quantize(x, m.k).unwrap();
    let (rows, nb) = (x.len() / m.k, q.nb);
    let mut b = Bounds {
        lo: Vec::new(),
        hi: Vec::new(),
        m: rows,
    };
    let (mut lo, mut hi) = ([[0f32; TILE]; GROUP], [[0f32; TILE]; GROUP]);
    for g in 0..m.n.div_ceil(TILE) {
        let column = Column {
            tiles: &tiles[g * nb..(g + 1) * nb],
            spread: &index.spread[g * nb..(g + 1) * nb],
            margin: margin(nb),
            next: &[],
        };
        for r0 in (0..rows).step_by(GROUP) {
            let group = r0..(r0 + GROUP).min(rows);
            let out = Out {
                lo: &mut lo,
                hi: &mut hi,
            };
            let rows_of = Rows {
                q: &q,
                range: group.clone(),
            };
            index.vnni.tile(column, rows_of, out);
            for i in 0..group.len() {
                b.lo.extend_from_slice(&lo[i]);
                b.hi.extend_from_slice(&hi[i]);
            }
        }
    }
    (b, rows)
}

/// `[lo, hi]` of row `r`, column `col`, in plain scalar code: the kernel's operations in
/// its order, from the integers up.
fn scalar_ends(m: &CpuQuantMatrix, q: &Quantized, r: usize, col: usize) -> [f32; 2] {
    let (g, c) = (col / TILE, col % TILE);
    let Tiles::Q8_0(tiles) = &m.tiles else {
        panic!("not Q8_0")
    };
    let nb = q.nb;
    let (mut res, mut spread) = (0f32, 0f32);
    for b in 0..nb {
        let tile = &tiles[g * nb + b];
        let spread_of = m.greedy.as_ref().unwrap().spread[g * nb + b][c];
        let mut sum = 0i32;
        for chunk in 0..CHUNKS {
            let bytes = q.bytes[(r * nb + b) * CHUNKS + chunk].to_le_bytes();
            let j = 2 * chunk;
            for (t, (pair, high)) in [(j, 0), (j, TILE), (j + 1, 0), (j + 1, TILE)]
                .into_iter()
                .enumerate()
            {
                let quant = i32::from(tile.quant_bytes_all()[pair][high + c] as i8);
                sum += i32::from(bytes[t] as i8) * quant;
            }
        }
        let d = f16::from_bits(tile.scale_bits()[c]).to_f32();
        let at = r * nb + b;
        res = (sum as f32).mul_add(d * q.scale[at], res);
        spread = spread_of.mul_add(q.half[at], spread);
    }
    kernel::ends_scalar(res, spread, margin(nb))
}

#[test]
fn the_kernel_computes_the_scalar_bounds_bit_for_bit() {
    for (n, k, rows) in [(40, 64, 3), (64, 576, 9), (17, 32, 1)] {
        let Some(m) = random_blocks(n, k, 7 + n as u64) else {
            return; // no VNNI here: no index to check
        };
        let x = inputs(rows, k, 11);
        let (b, _) = bounds_of(&m, &x);
        let q = quantize(&x, k).unwrap();
        for r in 0..rows {
            for col in 0..n {
                let (g, c) = (col / TILE, col % TILE);
                let [lo, hi] = scalar_ends(&m, &q, r, col);
                assert_eq!(b.lo(g, r)[c].to_bits(), lo.to_bits(), "lo {r} {col}");
                assert_eq!(b.hi(g, r)[c].to_bits(), hi.to_bits(), "hi {r} {col}");
            }
        }
    }
}

/// The bounds' whole point: every logit of the exact product lies within its `[lo, hi]`,
/// here on random and adversarial blocks and on inputs from 1e-38 to 1e30.
#[test]
fn every_exact_logit_lies_within_its_bounds() {
    let scales = [1.0f32, 1e-38, 1e-20, 1e-3, 1e4, 1e30];
    for (case, &scale) in scales.iter().enumerate() {
        for random_bytes in [false, true] {
            let (n, k) = (200, 256);
            let seed = case as u64;
            let m = if random_bytes {
                random_blocks(n, k, seed)
            } else {
                matrix(n, k, seed)
            };
            let Some(m) = m else {
                return;
            };
            let x: Vec<f32> = inputs(5, k, seed).iter().map(|v| v * scale).collect();
            let exact = m.matmul(&x, isa(), None);
            let (b, rows) = bounds_of(&m, &x);
            for r in 0..rows {
                for col in 0..n {
                    let (g, c) = (col / TILE, col % TILE);
                    let l = exact[r * n + col];
                    if !l.is_finite() {
                        continue; // an overflowing logit: the caller falls back
                    }
                    let (lo, hi) = (b.lo(g, r)[c], b.hi(g, r)[c]);
                    assert!(lo <= l && l <= hi, "scale {scale}: {lo} <= {l} <= {hi}");
                }
            }
        }
    }
}

#[test]
fn greedy_tokens_are_the_full_rows_argmax() {
    for (n, k, rows, seed) in [(1000, 64, 17, 1), (4096, 576, 16, 2), (333, 96, 1, 3)] {
        let Some(m) = matrix(n, k, seed) else {
            return;
        };
        let x = inputs(rows, k, seed + 100);
        assert_eq!(m.greedy_tokens(&x), Some(full_argmax(&m, &x)), "{n}x{k}");
    }
}

/// Rows that point at one column (the input is that column's weights) make it and a
/// copy of it the largest, tied: the smaller id wins, as in the full row.
#[test]
fn a_tie_goes_to_the_smaller_id() {
    let (n, k) = (300, 64);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let (first, copy) = (37, 251);
    let row: Vec<f32> = w[first * k..(first + 1) * k].to_vec();
    w[copy * k..(copy + 1) * k].copy_from_slice(&row);
    let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
    let Some(m) = indexed(QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()) else {
        return;
    };
    let full = m.matmul(&row, isa(), None);
    assert_eq!(full[first].to_bits(), full[copy].to_bits());
    assert_eq!(m.greedy_tokens(&row), Some(vec![first as u32]));
}

#[test]
fn a_row_with_a_non_finite_input_is_left_to_the_full_product() {
    let Some(m) = matrix(64, 64, 9) else {
        return;
    };
    let mut x = inputs(2, 64, 9);
    x[70] = f32::NAN;
    assert_eq!(m.greedy_tokens(&x), None);
    x[70] = f32::INFINITY;
    assert_eq!(m.greedy_tokens(&x), None);
}

#[test]
fn rounded_inputs_stay_within_their_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for exp in [-45i32, -38, -30, -10, 0, 10, 30, 38] {
        let x: Vec<f32> = (0..256)
            .map(|_| rng.random_range(-1.0f32..1.0) * 2f32.powi(exp))
            .collect();
        let q = quantize(&x, 64).unwrap();
        for (i, &v) in x.iter().enumerate() {
            let (b, j) = (i / BLOCK, i % BLOCK);
            let chunk = (j % 16) / 2;
            let t = if j < 16 { 2 * (j % 2) } else { 2 * (j % 2) + 1 };
            let byte = q.bytes[b * CHUNKS + chunk].to_le_bytes()[t];
            let r = f64::from(byte as i8);
            let err = (f64::from(v) - f64::from(q.scale[b]) * r).abs();
            assert!(err <= f64::from(q.half[b]), "2^{exp}: {v} off by {err}");
        }
    }
}

/// Timing by hand: `cargo test -p sonde-shard --release --lib greedy::tests::bench --
/// --ignored --nocapture`. SmolLM2's output layer (49,152 × 576), the full product
/// against the greedy tokens, by rows (the median of 9).
#[test]
#[ignore]
fn bench() {
    use std::time::Instant;
    let Some(m) = matrix(49152, 576, 1) else {
        return;
    };
    for rows in [1, 2, 4, 8, 16] {
        let x = inputs(rows, 576, 2);
        let time = |f: &mut dyn FnMut()| {
            let mut t: Vec<f64> = (0..9)
                .map(|_| {
                    let start = Instant::now();
                    f();
                    start.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            t.sort_by(f64::total_cmp);
            t[4]
        };
        let full = time(&mut || drop(m.matmul(&x, isa(), None)));
        let greedy = time(&mut || drop(m.greedy_tokens(&x)));
        let Tiles::Q8_0(tiles) = &m.tiles else {
            return;
        };
        let index = m.greedy.as_ref().unwrap();
        let quantized = time(&mut || drop(quantize(&x, 576)));
        let q = quantize(&x, 576).unwrap();
        let found = time(&mut || drop(m.candidates(index, tiles, &q)));
        println!("quantize {quantized:.3} ms, candidates {found:.3} ms");
        let (b, _) = bounds_of(&m, &x);
        let floor = |r: usize| {
            (0..m.n.div_ceil(TILE))
                .flat_map(|g| b.lo(g, r).to_vec())
                .fold(f32::NEG_INFINITY, f32::max)
        };
        let tiles: usize = (0..rows)
            .map(|r| {
                let f = floor(r);
                (0..m.n.div_ceil(TILE))
                    .filter(|&g| b.hi(g, r).iter().any(|&h| h >= f))
                    .count()
            })
            .sum();
        println!(
            "{rows:2} rows: full {full:.3} ms, greedy {greedy:.3} ms ({:.2}x), {:.1} tiles a row",
            full / greedy,
            tiles as f64 / rows as f64
        );
    }
}
