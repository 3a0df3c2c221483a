//! The real models' matrices: every 2-D tensor of both GGUF files is taken, its weights
//! are candle's bit for bit on every kernel variant, and products are within the f32
//! bound of the f64 reference.

use super::*;

use std::collections::BTreeSet;

use candle_core::quantized::gguf_file;

fn model_path(file: &str) -> std::path::PathBuf {
    sonde_testdata::path(&format!("models/{file}"))
}

/// At most this many rows of a matrix are compared one by one (spread over it), so that
/// a 262144-row embedding table stays quick; smaller matrices are compared whole.
const ROWS_CHECKED: usize = 600;

/// Checks every 2-D tensor of `file`; returns the formats seen.
fn check_file(file: &str) -> BTreeSet<&'static str> {
    let path = model_path(file);
    let mut reader = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut names: Vec<_> = content.tensor_infos.keys().cloned().collect();
    names.sort();
    let mut formats = BTreeSet::new();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for name in names {
        let q = content.tensor(&mut reader, &name, &Device::Cpu).unwrap();
        if q.rank() != 2 {
            continue;
        }
        let ours = CpuQuantMatrix::from_qtensor(&q)
            .unwrap_or_else(|| panic!("{file}: {name} ({:?}) refused", q.dtype()));
        formats.insert(ours.dtype_name());
        let (n, k) = ours.dims();
        let w = values(&q.dequantize(&Device::Cpu).unwrap());
        let step = n.div_ceil(ROWS_CHECKED);
        let rows: Vec<usize> = (0..n).step_by(step).chain([n - 1]).collect();
        let mut row = vec![0f32; k];
        for isa in isas() {
            for &i in &rows {
                ours.tiles.row(i, &mut row, isa);
                let what = format!("{file}: {name} row {i} {isa:?}");
                assert_same_bits(&row, &w[i * k..(i + 1) * k], &what);
            }
        }
        // Two activation rows against the checked columns.
        let m = 2;
        let x = random(&mut rng, m * k);
        let y = &ours.matmul(&x, isa(), None);
        let picked: Vec<f32> = (0..m)
            .flat_map(|r| rows.iter().map(move |&j| y[r * n + j]))
            .collect();
        let b = offsets(&ours);
        let pick = |v: &[f32]| -> Vec<f32> {
            rows.iter()
                .flat_map(|&j| v[j * k..(j + 1) * k].iter().copied())
                .collect()
        };
        check_against_f64(&x, (&pick(&w), &pick(&b)), &picked, (m, rows.len(), k));
    }
    println!("{file}: formats {formats:?}");
    formats
}

#[test]
fn real_smollm2_matrices() {
    let formats = check_file("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        formats.contains("q4_1") && formats.contains("q8_0"),
        "{formats:?}"
    );
}

#[test]
fn real_gemma3_matrices() {
    let formats = check_file("gemma-3-270m-q4_k_m.gguf");
    for f in ["q5_0", "q4_k", "q6_k", "q8_0"] {
        assert!(formats.contains(f), "no {f} tensor in {formats:?}");
    }
}
