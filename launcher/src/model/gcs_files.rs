//! Writing a `gs://` download so that nothing at the final path ever looks like a model
//! until it is complete: each object streams into `.<name>.partial` beside its final name,
//! is fsynced and renamed; a folder is built in a `.<name>.partial` sibling folder and
//! renamed into place last. A manifest (sizes, etags) records a completed download, so the
//! next start reuses it, and a copy without one is downloaded again.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use object_store::gcp::GoogleCloudStorage;
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::error::chain;
use super::gcs::{access_error, Plan, Remote};
use super::progress::Reporter;
use super::{ProgressStyle, ResolveError};

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub source: String,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ManifestFile {
    pub path: String,
    pub size: u64,
    pub etag: Option<String>,
}

/// Why one download failed, mapped to a `ResolveError` with the URI by `download`.
enum Failure {
    Store(object_store::Error),
    Io(PathBuf, io::Error),
    Short { key: String, got: u64, want: u64 },
}

pub(crate) async fn download(
    store: &GoogleCloudStorage,
    plan: &Plan,
    dest: &Path,
    style: ProgressStyle,
) -> Result<(), ResolveError> {
    let temp = sibling(dest, "partial");
    let total = plan.objects.iter().map(|o| o.size).sum();
    let mut progress = Reporter::start(style, &plan.uri, total);
    match write_all(store, plan, dest, &mut progress).await {
        Ok(()) => {
            progress.finish();
            Ok(())
        }
        Err(failure) => {
            progress.abandon();
            // Best effort: a leftover is removed by the next attempt anyway.
            let _ = remove_any(&temp);
            Err(to_error(&plan.uri, failure))
        }
    }
}

async fn write_all(
    store: &GoogleCloudStorage,
    plan: &Plan,
    dest: &Path,
    progress: &mut Reporter,
) -> Result<(), Failure> {
    let parent = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| Failure::Io(parent.to_path_buf(), e))?;
    let temp = sibling(dest, "partial");
    // A partial file or folder left by an interrupted run: start over.
    remove_any(&temp).map_err(|e| Failure::Io(temp.clone(), e))?;
    let manifest = serde_json::to_vec_pretty(&plan.manifest()).unwrap_or_default();
    if plan.single {
        let [object] = plan.objects.as_slice() else {
            return Err(Failure::Io(
                dest.to_path_buf(),
                io::Error::other("one object expected"),
            ));
        };
        // Drop the old manifest first: a crash after the new file lands but before its
        // manifest is written then means "download again", never "reuse stale".
        let marker = manifest_path(dest, true);
        remove_any(&marker).map_err(|e| Failure::Io(marker.clone(), e))?;
        if dest.is_dir() {
            remove_any(dest).map_err(|e| Failure::Io(dest.to_path_buf(), e))?;
        }
        fetch_object(store, object, dest, progress).await?;
        write_atomic(&marker, &manifest)?;
        return sync_dir(parent);
    }
    fs::create_dir_all(&temp).map_err(|e| Failure::Io(temp.clone(), e))?;
    for object in &plan.objects {
        let target = temp.join(&object.rel);
        if let Some(dir) = target.parent() {
            fs::create_dir_all(dir).map_err(|e| Failure::Io(dir.to_path_buf(), e))?;
        }
        fetch_object(store, object, &target, progress).await?;
    }
    write_atomic(&manifest_path(&temp, false), &manifest)?;
    swap_into_place(&temp, dest).map_err(|e| Failure::Io(dest.to_path_buf(), e))?;
    sync_dir(parent)
}

/// Streams one object chunk by chunk into `.<name>.partial`, then fsync + rename.
async fn fetch_object(
    store: &GoogleCloudStorage,
    object: &Remote,
    target: &Path,
    progress: &mut Reporter,
) -> Result<(), Failure> {
    let partial = sibling(target, "partial");
    let io = |e| Failure::Io(partial.clone(), e);
    let mut file = tokio::fs::File::create(&partial).await.map_err(io)?;
    let mut stream = store
        .get(&object.key)
        .await
        .map_err(Failure::Store)?
        .into_stream();
    let mut got = 0u64;
    while let Some(chunk) = stream.try_next().await.map_err(Failure::Store)? {
        file.write_all(&chunk).await.map_err(io)?;
        got += chunk.len() as u64;
        progress.advance(chunk.len() as u64);
    }
    if got != object.size {
        return Err(Failure::Short {
            key: object.key.to_string(),
            got,
            want: object.size,
        });
    }
    file.sync_all().await.map_err(io)?;
    drop(file);
    tokio::fs::rename(&partial, target).await.map_err(io)
}

/// A complete download of this plan is at `dest`: same files, sizes and etags recorded,
/// and the files on disk have those sizes.
pub(crate) fn is_complete(dest: &Path, plan: &Plan) -> bool {
    read_manifest(dest, plan.single)
        .is_some_and(|m| m == plan.manifest() && files_match(dest, &m, plan.single))
}

/// Some complete earlier download is at `dest` (used when GCS cannot be asked).
pub(crate) fn complete_copy(dest: &Path) -> bool {
    [true, false]
        .into_iter()
        .any(|single| read_manifest(dest, single).is_some_and(|m| files_match(dest, &m, single)))
}

fn read_manifest(dest: &Path, single: bool) -> Option<Manifest> {
    let bytes = fs::read(manifest_path(dest, single)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn files_match(dest: &Path, manifest: &Manifest, single: bool) -> bool {
    manifest.files.iter().all(|f| {
        let path = if single {
            dest.to_path_buf()
        } else {
            dest.join(&f.path)
        };
        fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == f.size)
    })
}

/// A folder's manifest travels inside it (so the rename moves both at once); a single
/// file's sits beside it.
fn manifest_path(dest: &Path, single: bool) -> PathBuf {
    if single {
        sibling(dest, "sonde-manifest.json")
    } else {
        dest.join(".sonde-manifest.json")
    }
}

/// `dir/name` -> `dir/.name.<suffix>`: same folder (so rename is atomic), hidden.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{suffix}"))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let temp = sibling(path, "partial");
    let write = || -> io::Result<()> {
        let mut file = fs::File::create(&temp)?;
        io::Write::write_all(&mut file, bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    };
    write().map_err(|e| Failure::Io(path.to_path_buf(), e))
}

/// Replaces whatever is at `dest` (an outdated or unmarked copy) with the new folder.
fn swap_into_place(temp: &Path, dest: &Path) -> io::Result<()> {
    if fs::symlink_metadata(dest).is_ok() {
        let old = sibling(dest, "old");
        remove_any(&old)?;
        fs::rename(dest, &old)?;
        fs::rename(temp, dest)?;
        return remove_any(&old);
    }
    fs::rename(temp, dest)
}

fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes the renames durable (a power cut must not undo them after we report success).
fn sync_dir(dir: &Path) -> Result<(), Failure> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Failure::Io(dir.to_path_buf(), e))
}

fn to_error(uri: &str, failure: Failure) -> ResolveError {
    match failure {
        Failure::Store(e @ object_store::Error::NotFound { .. }) => access_error(uri, e),
        Failure::Store(e) => ResolveError::GcsDownload {
            uri: uri.to_string(),
            cause: chain(&e),
        },
        Failure::Short { key, got, want } => ResolveError::GcsDownload {
            uri: uri.to_string(),
            cause: format!("{key} ended after {got} of {want} bytes"),
        },
        Failure::Io(path, e) => ResolveError::CacheWrite {
            model: uri.to_string(),
            path,
            cause: e.to_string(),
        },
    }
}
