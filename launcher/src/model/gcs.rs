//! `gs://bucket/prefix` models: what to download (one `.gguf` object, or every object under
//! the prefix as a folder), with object_store's GCS client. The file work lives in
//! `gcs_files.rs`.

use futures::TryStreamExt;
use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};

use super::error::chain;
use super::gcs_files::{self, Manifest, ManifestFile};
use super::source::GcsUri;
use super::{local, GcsOptions, ResolveConfig, ResolveError, ResolvedModel};

/// The objects to download and where each goes relative to the destination.
pub(crate) struct Plan {
    pub uri: String,
    /// One `.gguf` object, downloaded as a file (else a folder).
    pub single: bool,
    pub objects: Vec<Remote>,
}

pub(crate) struct Remote {
    pub key: ObjectPath,
    /// Path under the destination folder (for `single`, the file's name).
    pub rel: String,
    pub size: u64,
    pub etag: Option<String>,
}

impl Plan {
    /// What a completed download of this plan records.
    pub fn manifest(&self) -> Manifest {
        Manifest {
            source: self.uri.clone(),
            files: self
                .objects
                .iter()
                .map(|o| ManifestFile {
                    path: o.rel.clone(),
                    size: o.size,
                    etag: o.etag.clone(),
                })
                .collect(),
        }
    }
}

pub(crate) async fn fetch(
    uri: &GcsUri,
    cfg: &ResolveConfig,
) -> Result<ResolvedModel, ResolveError> {
    let shown = uri.display();
    let store = build_store(uri, &cfg.gcs)?;
    let dest = uri.destination(&cfg.cache_dir);
    let plan = match plan(&store, uri).await {
        Ok(plan) => plan,
        // GCS unreachable (network, credentials) but a complete earlier download is here:
        // serve it rather than fail a restart, and say so.
        Err(err @ ResolveError::GcsAccess { .. }) if gcs_files::complete_copy(&dest) => {
            tracing::warn!(
                "{err} (serving the earlier complete download in {})",
                dest.display()
            );
            return resolved(&shown, &dest);
        }
        Err(err) => return Err(err),
    };
    if gcs_files::is_complete(&dest, &plan) {
        tracing::info!(
            "{shown}: reusing the complete download in {}",
            dest.display()
        );
    } else {
        gcs_files::download(&store, &plan, &dest, cfg.progress).await?;
    }
    resolved(&shown, &dest)
}

fn resolved(shown: &str, dest: &std::path::Path) -> Result<ResolvedModel, ResolveError> {
    Ok(ResolvedModel {
        path: local::check(dest)?,
        source: format!("{shown} (downloaded to {})", dest.display()),
    })
}

fn build_store(uri: &GcsUri, o: &GcsOptions) -> Result<GoogleCloudStorage, ResolveError> {
    // No overall request timeout: a multi-GB object takes minutes. A stalled read fails
    // after `read_timeout` and object_store resumes the body with a Range request.
    let client = ClientOptions::new()
        .with_allow_http(true) // object_store's default; only a configured base URL is http
        .with_timeout_disabled()
        .with_connect_timeout(o.connect_timeout)
        .with_read_timeout(o.read_timeout);
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: o.max_retries,
        retry_timeout: o.retry_timeout,
    };
    let mut builder = GoogleCloudStorageBuilder::new()
        .with_bucket_name(&uri.bucket)
        .with_client_options(client)
        .with_retry(retry);
    // Unset credentials leave object_store to the Google way: application default
    // credentials, then the metadata server.
    if let Some(path) = &o.service_account_path {
        builder = builder.with_service_account_path(path.display().to_string());
    }
    if let Some(key) = &o.service_account_key {
        builder = builder.with_service_account_key(key);
    }
    if let Some(path) = &o.application_credentials {
        builder = builder.with_application_credentials(path.display().to_string());
    }
    if let Some(token) = &o.bearer_token {
        builder = builder.with_bearer_token(token);
    }
    builder.build().map_err(|e| ResolveError::GcsSetup {
        uri: uri.display(),
        cause: e.to_string(),
    })
}

async fn plan(store: &GoogleCloudStorage, uri: &GcsUri) -> Result<Plan, ResolveError> {
    let shown = uri.display();
    let invalid = |e: object_store::path::Error| ResolveError::InvalidSource {
        model: shown.clone(),
        reason: e.to_string(),
    };
    if local::is_gguf(std::path::Path::new(&uri.prefix)) {
        let key = ObjectPath::parse(&uri.prefix).map_err(invalid)?;
        let meta = store
            .head(&key)
            .await
            .map_err(|e| access_error(&shown, e))?;
        let rel = key.filename().unwrap_or(uri.prefix.as_str()).to_string();
        return Ok(Plan {
            uri: shown,
            single: true,
            objects: vec![remote(meta, rel)],
        });
    }
    let prefix = match uri.prefix.as_str() {
        "" => None,
        p => Some(ObjectPath::parse(p).map_err(invalid)?),
    };
    let metas: Vec<_> = store
        .list(prefix.as_ref())
        .try_collect()
        .await
        .map_err(|e| access_error(&shown, e))?;
    let strip = prefix.as_ref().map(|p| format!("{p}/")).unwrap_or_default();
    let mut objects: Vec<Remote> = metas
        .into_iter()
        .filter_map(|meta| {
            let rel = meta.location.as_ref().strip_prefix(&strip)?.to_string();
            Some(remote(meta, rel))
        })
        .collect();
    objects.sort_by(|a, b| a.rel.cmp(&b.rel));
    if objects.is_empty() {
        return Err(ResolveError::GcsNotFound { uri: shown });
    }
    // Refuse a folder that is no model before downloading gigabytes of it.
    let top: Vec<&str> = objects
        .iter()
        .map(|o| o.rel.as_str())
        .filter(|r| !r.contains('/'))
        .collect();
    let ggufs = top
        .iter()
        .filter(|r| local::is_gguf(std::path::Path::new(r)))
        .count();
    if !top.contains(&"config.json") && ggufs != 1 {
        return Err(ResolveError::GcsNotAModel { uri: shown });
    }
    Ok(Plan {
        uri: shown,
        single: false,
        objects,
    })
}

fn remote(meta: object_store::ObjectMeta, rel: String) -> Remote {
    Remote {
        key: meta.location,
        rel,
        size: meta.size,
        etag: meta.e_tag,
    }
}

/// A missing object names the URI; anything else is about reaching or reading the bucket.
pub(crate) fn access_error(uri: &str, e: object_store::Error) -> ResolveError {
    match e {
        object_store::Error::NotFound { .. } => ResolveError::GcsNotFound {
            uri: uri.to_string(),
        },
        other => ResolveError::GcsAccess {
            uri: uri.to_string(),
            cause: chain(&other),
        },
    }
}
