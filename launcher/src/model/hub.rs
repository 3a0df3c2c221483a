//! Hugging Face Hub models, through hf-hub's tokio client: a repo's `config.json`, tokenizer
//! files and `*.safetensors`, or one `.gguf` file (`owner/repo/file.gguf`). hf-hub writes
//! each file to a temp blob and renames it, and we return the snapshot folder only after
//! every file is there, so an interrupted download is never served.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hf_hub::api::tokio::{ApiBuilder, ApiError, Progress};
use hf_hub::api::RepoInfo;
use hf_hub::{Cache, Repo, RepoType};

use super::error::chain;
use super::progress::Reporter;
use super::source::HubId;
use super::{local, ProgressStyle, ResolveConfig, ResolveError, ResolvedModel};

/// Small files a HF folder needs besides config.json and the weights, when the repo has them.
const EXTRA_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "model.safetensors.index.json",
];

pub(crate) async fn fetch(id: &HubId, cfg: &ResolveConfig) -> Result<ResolvedModel, ResolveError> {
    let shown = id.display();
    let endpoint = cfg.hub.endpoint.trim_end_matches('/').to_string();
    let fail = Failures {
        endpoint: &endpoint,
        id: &shown,
    };
    let cache = Cache::new(cfg.cache_dir.join("hub"));
    let api = ApiBuilder::from_cache(cache.clone())
        .with_endpoint(endpoint.clone())
        .with_token(cfg.hub.token.clone())
        .with_progress(false) // ours, below: a bar on a terminal, log lines otherwise
        .build()
        .map_err(|e| fail.classify(e))?;
    let repo = match &cfg.revision {
        Some(rev) => Repo::with_revision(id.repo.clone(), RepoType::Model, rev.clone()),
        None => Repo::model(id.repo.clone()),
    };
    let api_repo = api.repo(repo.clone());
    // The file list is the first contact: bounded, so an unreachable Hub fails in seconds.
    let info = tokio::time::timeout(cfg.hub.timeout, api_repo.info())
        .await
        .map_err(|_| fail.unreachable(format!("no answer within {:?}", cfg.hub.timeout)))?
        .map_err(|e| fail.classify(e))?;
    let files = choose_files(id, &info)?;
    // Files of this commit already in the cache are not fetched again.
    let snapshot = cache.repo(repo).pointer_path(&info.sha);
    let mut paths = Vec::with_capacity(files.len());
    for file in &files {
        let cached = snapshot.join(file);
        if cached.is_file() {
            paths.push(cached);
            continue;
        }
        let progress = HubProgress::new(cfg.progress, &shown);
        let got = api_repo
            .download_with_progress(file, progress.clone())
            .await;
        progress.done(got.is_ok());
        paths.push(got.map_err(|e| ResolveError::HubDownload {
            id: shown.clone(),
            file: file.clone(),
            cause: chain(&e),
        })?);
    }
    // One GGUF: that file. A HF folder: the snapshot folder config.json was linked into.
    let path = match (&id.file, paths.first()) {
        (None, Some(config)) if files.len() > 1 => config.parent().map(PathBuf::from),
        (_, first) => first.cloned(),
    }
    .ok_or_else(|| ResolveError::HubNotAModel { id: shown.clone() })?;
    Ok(ResolvedModel {
        path: local::check(&path)?,
        source: format!("Hub model {shown} at {}", info.sha),
    })
}

/// `config.json` first (its folder is the model), then tokenizer files and weights; or the
/// one GGUF file.
fn choose_files(id: &HubId, info: &RepoInfo) -> Result<Vec<String>, ResolveError> {
    let names: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    if let Some(file) = &id.file {
        if !names.contains(&file.as_str()) {
            return Err(ResolveError::HubNotAModel { id: id.display() });
        }
        return Ok(vec![file.clone()]);
    }
    let top: Vec<&str> = names.iter().copied().filter(|n| !n.contains('/')).collect();
    let weights: Vec<&str> = top
        .iter()
        .copied()
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    if top.contains(&"config.json") && !weights.is_empty() {
        let mut files = vec!["config.json".to_string()];
        files.extend(
            EXTRA_FILES
                .iter()
                .filter(|f| top.contains(f))
                .map(|f| f.to_string()),
        );
        files.extend(weights.iter().map(|w| w.to_string()));
        return Ok(files);
    }
    let ggufs: Vec<&str> = top
        .iter()
        .copied()
        .filter(|n| local::is_gguf(std::path::Path::new(n)))
        .collect();
    match ggufs.as_slice() {
        [one] => Ok(vec![one.to_string()]),
        _ => Err(ResolveError::HubNotAModel { id: id.display() }),
    }
}

struct Failures<'a> {
    endpoint: &'a str,
    id: &'a str,
}

impl Failures<'_> {
    fn unreachable(&self, cause: String) -> ResolveError {
        ResolveError::HubUnreachable {
            endpoint: self.endpoint.to_string(),
            id: self.id.to_string(),
            cause,
        }
    }

    /// No connection (refused, DNS, TLS, timeout) is "unreachable"; an HTTP answer (404,
    /// 401 for a gated repo) or a body that is not the Hub's is "refused".
    fn classify(&self, e: ApiError) -> ResolveError {
        let reached = match &e {
            ApiError::RequestError(r) => r.status().is_some() || r.is_decode(),
            _ => true,
        };
        if !reached {
            return self.unreachable(chain(&e));
        }
        ResolveError::HubRefused {
            endpoint: self.endpoint.to_string(),
            id: self.id.to_string(),
            cause: chain(&e),
        }
    }
}

/// hf-hub's progress hook, shared by the tasks that download one file's chunks.
#[derive(Clone)]
struct HubProgress {
    style: ProgressStyle,
    label: String,
    reporter: Arc<Mutex<Option<Reporter>>>,
}

impl HubProgress {
    fn new(style: ProgressStyle, label: &str) -> Self {
        Self {
            style,
            label: label.to_string(),
            reporter: Arc::new(Mutex::new(None)),
        }
    }

    /// Ends a reporter the download left open (it failed before `finish`).
    fn done(&self, ok: bool) {
        let open = self.reporter.lock().ok().and_then(|mut r| r.take());
        match (open, ok) {
            (Some(r), true) => r.finish(),
            (Some(r), false) => r.abandon(),
            (None, _) => {}
        }
    }
}

impl Progress for HubProgress {
    async fn init(&mut self, size: usize, filename: &str) {
        let label = format!("{} {filename}", self.label);
        if let Ok(mut r) = self.reporter.lock() {
            *r = Some(Reporter::start(self.style, &label, size as u64));
        }
    }

    async fn update(&mut self, size: usize) {
        if let Ok(mut r) = self.reporter.lock() {
            if let Some(r) = r.as_mut() {
                r.advance(size as u64);
            }
        }
    }

    async fn finish(&mut self) {
        self.done(true);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn info(files: &[&str]) -> RepoInfo {
        let siblings: Vec<_> = files
            .iter()
            .map(|f| serde_json::json!({ "rfilename": f }))
            .collect();
        serde_json::from_value(serde_json::json!({ "siblings": siblings, "sha": "abc" })).unwrap()
    }

    fn repo(file: Option<&str>) -> HubId {
        HubId {
            repo: "o/r".into(),
            file: file.map(Into::into),
        }
    }

    #[test]
    fn picks_hf_folder_files() {
        let i = info(&[
            "README.md",
            "config.json",
            "tokenizer.json",
            "model-1.safetensors",
            "model-2.safetensors",
            "onnx/model.safetensors",
            "pytorch_model.bin",
            "generation_config.json",
        ]);
        assert_eq!(
            choose_files(&repo(None), &i).unwrap(),
            [
                "config.json",
                "tokenizer.json",
                "generation_config.json",
                "model-1.safetensors",
                "model-2.safetensors"
            ]
        );
    }

    #[test]
    fn picks_gguf() {
        assert_eq!(
            choose_files(&repo(None), &info(&["a.gguf", "README.md"])).unwrap(),
            ["a.gguf"]
        );
        assert!(choose_files(&repo(None), &info(&["a.gguf", "b.gguf"])).is_err());
        assert_eq!(
            choose_files(&repo(Some("b.gguf")), &info(&["a.gguf", "b.gguf"])).unwrap(),
            ["b.gguf"]
        );
        let msg = choose_files(&repo(Some("c.gguf")), &info(&["a.gguf"]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("o/r/c.gguf"), "{msg}");
        // config.json without safetensors weights is not servable.
        assert!(choose_files(&repo(None), &info(&["config.json", "pytorch_model.bin"])).is_err());
    }
}
