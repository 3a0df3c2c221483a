//! GGUF files the forward pass cannot serve exactly are refused at load with one line
//! naming the file and the tensor or key at fault: never served silently wrong. Each case
//! is the real default model rewritten with one change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::quantized::{ggml_file, gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::*;
use sonde_proto::WeightQuant;
use sonde_shard::error::{LoadError, Unapplied};
use sonde_shard::loader::{self, LoadOptions};

type Metadata = Vec<(String, gguf_file::Value)>;
type Tensors = Vec<(String, QTensor)>;

/// The default model's metadata and tensors, read once.
fn original() -> &'static (Metadata, Tensors) {
    static ORIGINAL: OnceLock<(Metadata, Tensors)> = OnceLock::new();
    ORIGINAL.get_or_init(|| {
        let path = gguf_path();
        let mut reader = BufReader::new(
            File::open(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-data)", path.display())),
        );
        let content = gguf_file::Content::read(&mut reader).unwrap();
        let mut metadata: Metadata = content
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        metadata.sort_by(|a, b| a.0.cmp(&b.0));
        let mut names: Vec<&String> = content.tensor_infos.keys().collect();
        names.sort();
        let tensors = names
            .into_iter()
            .map(|n| {
                (
                    n.clone(),
                    content.tensor(&mut reader, n, &Device::Cpu).unwrap(),
                )
            })
            .collect();
        (metadata, tensors)
    })
}

/// Writes the default model with `edit` applied to a temporary file.
fn variant(name: &str, edit: impl FnOnce(&mut Metadata, &mut Tensors)) -> PathBuf {
    let (metadata, tensors) = original();
    let mut metadata = metadata.clone();
    let mut tensors: Tensors = tensors
        .iter()
        .map(|(n, t)| (n.clone(), clone_qtensor(t)))
        .collect();
    edit(&mut metadata, &mut tensors);
    let path =
        std::env::temp_dir().join(format!("sonde-refuse-{}-{name}.gguf", std::process::id()));
    let mut f = std::io::BufWriter::new(File::create(&path).unwrap());
    let md: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut f, &md, &ts).unwrap();
    drop(f);
    path
}

/// The same blocks in a new QTensor.
fn clone_qtensor(t: &QTensor) -> QTensor {
    let data = t.data().unwrap();
    ggml_file::qtensor_from_ggml(t.dtype(), &data, t.shape().dims().to_vec(), &Device::Cpu).unwrap()
}

fn set(metadata: &mut Metadata, key: &str, value: gguf_file::Value) {
    metadata.retain(|(k, _)| k != key);
    metadata.push((key.to_string(), value));
}

fn load_err(path: &Path) -> LoadError {
    let err = loader::load(path, &LoadOptions::cpu(WeightQuant::default()))
        .err()
        .expect("the file was served");
    let text = err.to_string();
    assert!(!text.contains('\n'), "not one line: {text}");
    assert!(
        text.contains(&path.display().to_string()),
        "no file name: {text}"
    );
    std::fs::remove_file(path).unwrap();
    err
}

#[test]
fn a_tensor_the_pass_does_not_apply_is_refused() {
    let path = variant("sinks", |_, t| {
        let sinks = Tensor::zeros(9, candle_core::DType::F32, &Device::Cpu).unwrap();
        t.push((
            "blk.0.attn_sinks.weight".into(),
            QTensor::quantize(&sinks, GgmlDType::F32).unwrap(),
        ));
    });
    let err = load_err(&path);
    assert!(
        matches!(&err, LoadError::NotApplied { what: Unapplied::Tensor(tensor), architecture, .. }
            if tensor == "blk.0.attn_sinks.weight" && architecture == "llama"),
        "{err}"
    );
}

#[test]
fn metadata_that_changes_the_maths_is_refused_unless_applied() {
    let yarn = variant("yarn", |m, _| {
        set(
            m,
            "llama.rope.scaling.type",
            gguf_file::Value::String("yarn".into()),
        );
        set(m, "llama.rope.scaling.factor", gguf_file::Value::F32(4.0));
    });
    let err = load_err(&yarn);
    assert!(
        matches!(&err, LoadError::Metadata { key, .. } if key == "llama.rope.scaling.type"),
        "{err}"
    );
    assert!(err.to_string().contains("\"yarn\""), "{err}");

    let window = variant("window", |m, _| {
        set(
            m,
            "llama.attention.sliding_window",
            gguf_file::Value::U32(128),
        );
    });
    let err = load_err(&window);
    assert!(
        matches!(&err, LoadError::NotApplied { what: Unapplied::Metadata(key), .. } if key == "llama.attention.sliding_window"),
        "{err}"
    );

    let moe = variant("moe", |m, _| {
        set(m, "llama.expert_count", gguf_file::Value::U32(8))
    });
    let err = load_err(&moe);
    assert!(err.to_string().contains("mixture-of-experts"), "{err}");

    let arch = variant("mamba", |m, _| {
        set(
            m,
            "general.architecture",
            gguf_file::Value::String("mamba".into()),
        )
    });
    let err = load_err(&arch);
    assert!(
        matches!(&err, LoadError::UnsupportedArchitecture { found, .. } if found == "mamba"),
        "{err}"
    );
}

#[test]
fn a_block_format_without_an_exact_kernel_is_refused() {
    let path = variant("q3k", |_, t| {
        let (_, down) = t
            .iter_mut()
            .find(|(n, _)| n == "blk.0.ffn_down.weight")
            .unwrap();
        *down = QTensor::quantize(&down.dequantize(&Device::Cpu).unwrap(), GgmlDType::Q3K).unwrap();
    });
    let err = load_err(&path);
    assert!(
        matches!(&err, LoadError::UnsupportedFormat { tensor, format, .. }
            if tensor == "blk.0.ffn_down.weight" && format == "q3_k"),
        "{err}"
    );
}

#[test]
fn missing_and_misshapen_tensors_are_refused() {
    let missing = variant("missing", |_, t| {
        t.retain(|(n, _)| n != "blk.3.ffn_up.weight")
    });
    let err = load_err(&missing);
    assert!(
        matches!(&err, LoadError::MissingTensor { tensor, .. } if tensor == "blk.3.ffn_up.weight"),
        "{err}"
    );

    let shape = variant("shape", |_, t| {
        let (_, q) = t
            .iter_mut()
            .find(|(n, _)| n == "blk.0.attn_q.weight")
            .unwrap();
        let rows = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .narrow(0, 0, 512)
            .unwrap();
        // A fresh buffer: candle's quantize reads a narrowed tensor's whole storage.
        let w = Tensor::from_vec(
            rows.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            (512, 576),
            &Device::Cpu,
        )
        .unwrap();
        *q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
    });
    let err = load_err(&shape);
    assert!(
        matches!(&err, LoadError::TensorShape { tensor, expected, found, .. }
            if tensor == "blk.0.attn_q.weight" && expected == &[576, 576] && found == &[512, 576]),
        "{err}"
    );
}

#[test]
fn truncated_and_foreign_files_are_refused_in_seconds() {
    let path = std::env::temp_dir().join(format!("sonde-refuse-{}-cut.gguf", std::process::id()));
    let bytes = std::fs::read(gguf_path()).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let started = std::time::Instant::now();
    let err = load_err(&path);
    assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    assert!(
        matches!(&err, LoadError::Corrupt { .. }) && err.to_string().contains("truncated"),
        "{err}"
    );

    let path = std::env::temp_dir().join(format!("sonde-refuse-{}-text.gguf", std::process::id()));
    std::fs::write(&path, b"this is not a model").unwrap();
    let err = load_err(&path);
    assert!(matches!(&err, LoadError::Corrupt { .. }), "{err}");
}

/// The bad files of `scripts/make_test_models.py` (written in Python from the real model, so
/// not by the same code as the variants above) are refused naming what is wrong.
#[test]
fn test_model_bad_files_are_refused_by_name() {
    let cases = [
        ("bad-extra-tensor", "blk.0.attn_sinks.weight"),
        ("bad-rope-yarn", "yarn"),
        ("bad-truncated", "truncated"),
        ("bad-attn-q-shape", "blk.0.attn_q.weight"),
    ];
    for (name, needle) in cases {
        let path = sonde_testdata::path(&format!("models/test/{name}.gguf"));
        assert!(
            path.is_file(),
            "{} is missing: run scripts/test",
            path.display()
        );
        let err = loader::load(&path, &LoadOptions::cpu(WeightQuant::default()))
            .err()
            .unwrap_or_else(|| panic!("{name} was served"));
        let text = err.to_string();
        assert!(!text.contains('\n'), "{name}: not one line: {text}");
        assert!(text.contains(&path.display().to_string()), "{name}: {text}");
        assert!(
            text.contains(needle),
            "{name}: {text} does not name {needle}"
        );
    }
}
