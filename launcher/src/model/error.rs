//! Why a model could not be resolved. Each message is one sentence that names the model and
//! says what to do, because it is the last line an operator sees before the container exits.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("model path {} does not exist; pass an existing .gguf file or model folder", path.display())]
    NotFound { path: PathBuf },

    #[error("model file {} is not readable: {cause}; fix its permissions or pass another model", path.display())]
    NotReadable { path: PathBuf, cause: String },

    #[error("{} is neither a .gguf file nor a folder with config.json; pass one of those", path.display())]
    NotAModel { path: PathBuf },

    #[error("folder {} holds several .gguf files ({names}); pass the one to serve", path.display())]
    SeveralGguf { path: PathBuf, names: String },

    #[error("the default model {} is missing; run scripts/fetch-data or pass --model-id", path.display())]
    DefaultMissing { path: PathBuf },

    #[error("model {model:?} is not usable: {reason}")]
    InvalidSource { model: String, reason: String },

    #[error("{uri} does not exist; check the URI and that the credentials can read the bucket")]
    GcsNotFound { uri: String },

    #[error("{uri} holds neither config.json nor exactly one .gguf file; point it at a model folder or a .gguf object")]
    GcsNotAModel { uri: String },

    #[error("could not set up the GCS client for {uri}: {cause}; check GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT")]
    GcsSetup { uri: String, cause: String },

    #[error("could not read {uri}: {cause}; check the network and that the credentials (GOOGLE_APPLICATION_CREDENTIALS, or the metadata server's service account) can read the bucket")]
    GcsAccess { uri: String, cause: String },

    #[error("download of {uri} failed: {cause}; nothing was left at the final path, so running again retries it")]
    GcsDownload { uri: String, cause: String },

    #[error("could not write the download of {model} under {}: {cause}; check that the model cache folder (--model-cache-dir) is writable and has room", path.display())]
    CacheWrite {
        model: String,
        path: PathBuf,
        cause: String,
    },

    #[error("could not reach the Hugging Face Hub at {endpoint} to fetch {id}: {cause}; pass a local path or a gs:// URI, or set HF_ENDPOINT")]
    HubUnreachable {
        endpoint: String,
        id: String,
        cause: String,
    },

    #[error("the Hugging Face Hub at {endpoint} refused {id}: {cause}; check the id and --revision, or set HF_TOKEN for a private or gated model")]
    HubRefused {
        endpoint: String,
        id: String,
        cause: String,
    },

    #[error("Hub model {id} has neither config.json with *.safetensors weights nor exactly one .gguf file; name the file to serve as {id}/<file>.gguf")]
    HubNotAModel { id: String },

    #[error("could not download {file} of Hub model {id}: {cause}; running again retries it")]
    HubDownload {
        id: String,
        file: String,
        cause: String,
    },
}

/// An error with its sources, on one line: reqwest's and object_store's own messages ("error
/// sending request", "request or response body error") hide the cause ("Connection refused",
/// "end of file before message body") in the source chain.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Some errors repeat their source in their own message; say it once.
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts
        .join(": ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
