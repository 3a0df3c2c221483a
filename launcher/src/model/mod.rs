//! Model resolution: turns `--model-id` / `AIP_STORAGE_URI` / the default model into a local
//! path the shard can load (a `.gguf` file, or a Hugging Face folder with `config.json`).
//!
//! Sources, in the order they are recognised (see `source.rs`): a local path; `gs://bucket/
//! prefix`, downloaded with object_store's GCS client into the cache; a Hugging Face Hub id,
//! downloaded with hf-hub. Downloads never leave anything at their final path until they are
//! complete (temp names + rename), so an interrupted start can never serve half a model.

mod error;
mod gcs;
mod gcs_files;
mod hub;
mod local;
mod options;
mod progress;
mod source;

use std::path::PathBuf;

pub use error::ResolveError;
pub use options::{GcsOptions, HubOptions};

use source::Source;

/// How download progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressStyle {
    /// An indicatif bar on stderr (when stderr is a terminal).
    Terminal,
    /// `tracing::info!` lines every 10% or 5 s (containers, log collectors).
    Log,
}

/// Everything resolution needs; `main` fills it once (environment read there, not here).
#[derive(Clone, Debug)]
pub struct ResolveConfig {
    /// `--model-id` / `MODEL_ID`.
    pub model_id: Option<String>,
    /// `--revision`: branch, tag or commit of a Hub model.
    pub revision: Option<String>,
    /// `AIP_STORAGE_URI`, set by Vertex AI to the model's `gs://` folder.
    pub aip_storage_uri: Option<String>,
    /// Where downloads go (`<cache_dir>/gcs/...`, `<cache_dir>/hub/...`).
    pub cache_dir: PathBuf,
    /// Served when neither `model_id` nor `aip_storage_uri` is set.
    pub default_model: PathBuf,
    pub progress: ProgressStyle,
    pub gcs: GcsOptions,
    pub hub: HubOptions,
}

/// A model ready to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedModel {
    /// A `.gguf` file, or a folder with `config.json` + `*.safetensors` + tokenizer files.
    pub path: PathBuf,
    /// Where it came from, for logs (e.g. `gs://b/m (downloaded to /cache/gcs/b/m)`).
    pub source: String,
}

/// Resolves the model: `model_id` wins over `aip_storage_uri`, which wins over
/// `default_model`. Local paths are checked (exists, readable, a model); `gs://` and Hub
/// models are downloaded into `cache_dir` (or reused when a complete copy is there).
pub async fn resolve(cfg: &ResolveConfig) -> Result<ResolvedModel, ResolveError> {
    // An empty variable (`MODEL_ID=`) means "not set", as it does for most tools.
    let given = non_empty(&cfg.model_id).or_else(|| non_empty(&cfg.aip_storage_uri));
    let Some(given) = given else {
        return resolve_default(cfg);
    };
    match source::parse(given)? {
        Source::Local(path) => {
            let path = local::check(&path)?;
            Ok(ResolvedModel {
                source: format!("local {}", path.display()),
                path,
            })
        }
        Source::Gcs(uri) => gcs::fetch(&uri, cfg).await,
        Source::Hub(id) => hub::fetch(&id, cfg).await,
    }
}

fn resolve_default(cfg: &ResolveConfig) -> Result<ResolvedModel, ResolveError> {
    // A missing default model has its own message: the fix is to run the fetch script (or
    // name a model), not to correct a path the user never typed.
    if !cfg.default_model.exists() {
        return Err(ResolveError::DefaultMissing {
            path: cfg.default_model.clone(),
        });
    }
    let path = local::check(&cfg.default_model)?;
    Ok(ResolvedModel {
        source: format!("default model {}", path.display()),
        path,
    })
}

fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn config(dir: &std::path::Path) -> ResolveConfig {
        ResolveConfig {
            model_id: None,
            revision: None,
            aip_storage_uri: None,
            cache_dir: dir.join("cache"),
            default_model: dir.join("default.gguf"),
            progress: ProgressStyle::Log,
            gcs: GcsOptions::default(),
            hub: HubOptions::default(),
        }
    }

    #[tokio::test]
    async fn precedence_model_id_then_aip_then_default() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.gguf", "b.gguf", "default.gguf"] {
            std::fs::write(dir.path().join(name), b"GGUF").unwrap();
        }
        let mut cfg = config(dir.path());
        assert_eq!(
            resolve(&cfg).await.unwrap().path,
            dir.path().join("default.gguf")
        );
        cfg.aip_storage_uri = Some(dir.path().join("b.gguf").display().to_string());
        assert_eq!(resolve(&cfg).await.unwrap().path, dir.path().join("b.gguf"));
        cfg.model_id = Some(dir.path().join("a.gguf").display().to_string());
        assert_eq!(resolve(&cfg).await.unwrap().path, dir.path().join("a.gguf"));
        // An empty MODEL_ID falls through to AIP_STORAGE_URI.
        cfg.model_id = Some(String::new());
        assert_eq!(resolve(&cfg).await.unwrap().path, dir.path().join("b.gguf"));
    }

    #[tokio::test]
    async fn missing_default_model_says_to_fetch_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve(&config(dir.path())).await.unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("default.gguf") && msg.contains("--model-id"),
            "{msg}"
        );
    }
}
