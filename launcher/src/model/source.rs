//! What kind of model string the user gave: a local path, a `gs://` URI or a Hub id.

use std::path::{Path, PathBuf};

use super::ResolveError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Local(PathBuf),
    Gcs(GcsUri),
    Hub(HubId),
}

/// `gs://bucket/prefix`, prefix without leading or trailing `/` (empty: the whole bucket).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GcsUri {
    pub bucket: String,
    pub prefix: String,
}

impl GcsUri {
    /// As the user would write it, for messages.
    pub fn display(&self) -> String {
        format!("gs://{}/{}", self.bucket, self.prefix)
    }

    /// `<cache>/gcs/<bucket>/<prefix>`: the final path of the file or folder.
    pub fn destination(&self, cache_dir: &Path) -> PathBuf {
        let mut dest = cache_dir.join("gcs").join(&self.bucket);
        dest.extend(self.prefix.split('/').filter(|s| !s.is_empty()));
        dest
    }
}

/// `owner/repo` (or `repo`), or `owner/repo/path/to/file.gguf` for one GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HubId {
    pub repo: String,
    pub file: Option<String>,
}

impl HubId {
    pub fn display(&self) -> String {
        match &self.file {
            Some(file) => format!("{}/{}", self.repo, file),
            None => self.repo.clone(),
        }
    }
}

pub(crate) fn parse(given: &str) -> Result<Source, ResolveError> {
    let invalid = |reason: &str| ResolveError::InvalidSource {
        model: given.to_string(),
        reason: reason.to_string(),
    };
    if let Some(rest) = given.strip_prefix("gs://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid(
                "a gs:// URI needs a bucket, as in gs://bucket/folder",
            ));
        }
        let prefix = prefix.trim_matches('/');
        // `..` would escape the cache folder; GCS keys with it are not models anyway.
        if prefix.split('/').any(|s| s == "." || s == "..") {
            return Err(invalid("a gs:// URI may not contain . or .. segments"));
        }
        return Ok(Source::Gcs(GcsUri {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        }));
    }
    if given.contains("://") {
        return Err(invalid(
            "only local paths, gs://bucket/prefix and Hugging Face Hub ids are supported",
        ));
    }
    // Anything written like a path is a path: it never goes to the Hub, so a typo in a
    // local path fails with "does not exist" instead of a confusing Hub error.
    if looks_like_path(given) {
        return Ok(Source::Local(expand_home(given)));
    }
    // A relative path that exists wins over a Hub id of the same spelling (as in TGI).
    if Path::new(given).exists() {
        return Ok(Source::Local(PathBuf::from(given)));
    }
    match hub_id(given) {
        Some(id) => Ok(Source::Hub(id)),
        // Not a valid Hub id (e.g. `model.gguf`, `a b`): treat it as the missing local path
        // it most likely is.
        None => Ok(Source::Local(PathBuf::from(given))),
    }
}

fn looks_like_path(s: &str) -> bool {
    s.starts_with('/')
        || s.starts_with("./")
        || s.starts_with("../")
        || s.starts_with('~')
        || s == "."
        || s == ".."
}

fn expand_home(s: &str) -> PathBuf {
    match (s.strip_prefix("~/"), std::env::home_dir()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ if s == "~" => std::env::home_dir().unwrap_or_else(|| PathBuf::from(s)),
        _ => PathBuf::from(s),
    }
}

/// Hub ids are `name` or `owner/name` of `[A-Za-z0-9._-]`; three or more segments ending in
/// `.gguf` name one file in the repo `owner/name`.
fn hub_id(s: &str) -> Option<HubId> {
    let segments: Vec<&str> = s.split('/').collect();
    let valid = |seg: &str| {
        !seg.is_empty()
            && seg != "."
            && seg != ".."
            && seg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    if !segments.iter().all(|seg| valid(seg)) {
        return None;
    }
    let is_gguf = s.to_ascii_lowercase().ends_with(".gguf");
    match segments.len() {
        1 | 2 if !is_gguf => Some(HubId {
            repo: s.to_string(),
            file: None,
        }),
        n if n >= 3 && is_gguf => Some(HubId {
            repo: segments[..2].join("/"),
            file: Some(segments[2..].join("/")),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn gcs(bucket: &str, prefix: &str) -> Source {
        Source::Gcs(GcsUri {
            bucket: bucket.into(),
            prefix: prefix.into(),
        })
    }

    #[test]
    fn gs_uris() {
        assert_eq!(
            parse("gs://b/models/smol").unwrap(),
            gcs("b", "models/smol")
        );
        assert_eq!(
            parse("gs://b/models/smol/").unwrap(),
            gcs("b", "models/smol")
        );
        assert_eq!(parse("gs://b").unwrap(), gcs("b", ""));
        assert_eq!(parse("gs://b/m.gguf").unwrap(), gcs("b", "m.gguf"));
        assert!(parse("gs:///x").is_err());
        assert!(parse("gs://b/../etc").is_err());
        let dest = GcsUri {
            bucket: "b".into(),
            prefix: "a/m.gguf".into(),
        }
        .destination(Path::new("/c"));
        assert_eq!(dest, PathBuf::from("/c/gcs/b/a/m.gguf"));
    }

    #[test]
    fn other_schemes_are_refused() {
        let msg = parse("s3://b/m").unwrap_err().to_string();
        assert!(msg.contains("s3://b/m") && msg.contains("gs://"), "{msg}");
    }

    #[test]
    fn paths_never_go_to_the_hub() {
        for p in [
            "/abs/owner/repo",
            "./owner/repo",
            "../x",
            "~/models/m",
            ".",
            "model.gguf",
            "a/b.gguf",
            "a b",
        ] {
            assert!(matches!(parse(p).unwrap(), Source::Local(_)), "{p}");
        }
        let home = std::env::home_dir().unwrap();
        assert_eq!(
            parse("~/m.gguf").unwrap(),
            Source::Local(home.join("m.gguf"))
        );
    }

    #[test]
    fn existing_relative_folder_is_local() {
        // `src` exists relative to the crate folder, where tests run.
        assert_eq!(parse("src").unwrap(), Source::Local(PathBuf::from("src")));
    }

    #[test]
    fn hub_ids() {
        let hub = |repo: &str, file: Option<&str>| {
            Source::Hub(HubId {
                repo: repo.into(),
                file: file.map(Into::into),
            })
        };
        assert_eq!(parse("gpt2").unwrap(), hub("gpt2", None));
        assert_eq!(
            parse("HuggingFaceTB/SmolLM2-135M").unwrap(),
            hub("HuggingFaceTB/SmolLM2-135M", None)
        );
        assert_eq!(
            parse("bartowski/SmolLM2-GGUF/SmolLM2-Q4_K_M.gguf").unwrap(),
            hub("bartowski/SmolLM2-GGUF", Some("SmolLM2-Q4_K_M.gguf"))
        );
        assert_eq!(
            parse("o/r/sub/m.GGUF").unwrap(),
            hub("o/r", Some("sub/m.GGUF"))
        );
        // Three segments not naming a .gguf are not a Hub id.
        assert!(matches!(
            parse("o/r/config.json").unwrap(),
            Source::Local(_)
        ));
    }
}
