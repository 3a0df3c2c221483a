//! Credentials and endpoints for downloads. `from_env` is the only place in model resolution
//! that reads the environment, so `main` reads it once and tests pass values explicitly.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How to reach Google Cloud Storage. With no credentials set, object_store does it the
/// Google way: the application-default-credentials file (`~/.config/gcloud/
/// application_default_credentials.json`), then the metadata server of the GCE/Vertex VM.
#[derive(Clone)]
pub struct GcsOptions {
    /// A service-account JSON file (`GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_SERVICE_ACCOUNT_PATH`,
    /// `SERVICE_ACCOUNT`). Also object_store's testing hook: a file with `gcs_base_url` and
    /// `disable_oauth: true` points the client at a local stand-in.
    pub service_account_path: Option<PathBuf>,
    /// The same, inline (`GOOGLE_SERVICE_ACCOUNT_KEY`).
    pub service_account_key: Option<String>,
    /// An application-default-credentials file (`GOOGLE_APPLICATION_CREDENTIALS`).
    pub application_credentials: Option<PathBuf>,
    /// A static OAuth token (`GOOGLE_BEARER_TOKEN`); not refreshed.
    pub bearer_token: Option<String>,
    /// Retries of a failed request or broken download stream (resumed with a Range).
    pub max_retries: usize,
    /// No retry starts after this long since the request began.
    pub retry_timeout: Duration,
    /// Bound on connecting; a download has no overall timeout (models are large) but a read
    /// that stalls for `read_timeout` fails and is retried.
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

impl Default for GcsOptions {
    fn default() -> Self {
        Self {
            service_account_path: None,
            service_account_key: None,
            application_credentials: None,
            bearer_token: None,
            // object_store's own defaults for retries.
            max_retries: 10,
            retry_timeout: Duration::from_secs(180),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(60),
        }
    }
}

impl GcsOptions {
    /// Reads the variables object_store's `from_env` would, so behaviour matches its docs.
    pub fn from_env() -> Self {
        let path = env("GOOGLE_SERVICE_ACCOUNT")
            .or_else(|| env("GOOGLE_SERVICE_ACCOUNT_PATH"))
            .or_else(|| env("SERVICE_ACCOUNT"));
        Self {
            service_account_path: path.map(PathBuf::from),
            service_account_key: env("GOOGLE_SERVICE_ACCOUNT_KEY"),
            application_credentials: env("GOOGLE_APPLICATION_CREDENTIALS").map(PathBuf::from),
            bearer_token: env("GOOGLE_BEARER_TOKEN"),
            ..Self::default()
        }
    }
}

// Secrets stay out of logs: `{:?}` of the config shows only whether they are set.
impl fmt::Debug for GcsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcsOptions")
            .field("service_account_path", &self.service_account_path)
            .field(
                "service_account_key",
                &self.service_account_key.as_ref().map(|_| "<set>"),
            )
            .field("application_credentials", &self.application_credentials)
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<set>"))
            .field("max_retries", &self.max_retries)
            .field("retry_timeout", &self.retry_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("read_timeout", &self.read_timeout)
            .finish()
    }
}

pub const DEFAULT_HUB_ENDPOINT: &str = "https://huggingface.co";

/// How to reach the Hugging Face Hub.
#[derive(Clone)]
pub struct HubOptions {
    /// `HF_ENDPOINT`; default `https://huggingface.co`.
    pub endpoint: String,
    /// `HF_TOKEN` (or the older `HUGGING_FACE_HUB_TOKEN`), for private and gated models.
    pub token: Option<String>,
    /// Bound on the first call to the Hub (the repo's file list), so an unreachable or
    /// black-holed Hub fails in seconds instead of hanging the launcher.
    pub timeout: Duration,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_HUB_ENDPOINT.to_string(),
            token: None,
            timeout: Duration::from_secs(30),
        }
    }
}

impl HubOptions {
    pub fn from_env() -> Self {
        let default = Self::default();
        Self {
            endpoint: env("HF_ENDPOINT").unwrap_or(default.endpoint),
            token: env("HF_TOKEN").or_else(|| env("HUGGING_FACE_HUB_TOKEN")),
            timeout: default.timeout,
        }
    }
}

impl fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubOptions")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A set, non-empty variable.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}
