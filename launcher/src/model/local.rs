//! Checks that a local path is a model the shard can load, so a wrong path fails here with
//! a clear sentence instead of deep inside the shard.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::ResolveError;

/// Returns what the shard should load: the `.gguf` file itself, a folder with `config.json`,
/// or the only `.gguf` file inside a folder.
pub(crate) fn check(path: &Path) -> Result<PathBuf, ResolveError> {
    let meta = fs::metadata(path).map_err(|e| io_error(path, e))?;
    if meta.is_file() {
        if !is_gguf(path) {
            return Err(ResolveError::NotAModel {
                path: path.to_path_buf(),
            });
        }
        readable(path)?;
        return Ok(path.to_path_buf());
    }
    if !meta.is_dir() {
        return Err(ResolveError::NotAModel {
            path: path.to_path_buf(),
        });
    }
    let config = path.join("config.json");
    if config.is_file() {
        readable(&config)?;
        return Ok(path.to_path_buf());
    }
    let mut ggufs = Vec::new();
    for entry in fs::read_dir(path).map_err(|e| io_error(path, e))? {
        let entry = entry.map_err(|e| io_error(path, e))?;
        let file = entry.path();
        if is_gguf(&file) && file.is_file() {
            ggufs.push(file);
        }
    }
    ggufs.sort();
    match ggufs.as_slice() {
        [] => Err(ResolveError::NotAModel {
            path: path.to_path_buf(),
        }),
        [one] => {
            readable(one)?;
            Ok(one.clone())
        }
        several => Err(ResolveError::SeveralGguf {
            path: path.to_path_buf(),
            names: several
                .iter()
                .filter_map(|f| f.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

pub(crate) fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("gguf"))
}

/// Opening is the only honest readability test (permission bits lie for root, ACLs, NFS).
fn readable(path: &Path) -> Result<(), ResolveError> {
    File::open(path).map(drop).map_err(|e| io_error(path, e))
}

fn io_error(path: &Path, e: io::Error) -> ResolveError {
    match e.kind() {
        io::ErrorKind::NotFound => ResolveError::NotFound {
            path: path.to_path_buf(),
        },
        io::ErrorKind::PermissionDenied => ResolveError::NotReadable {
            path: path.to_path_buf(),
            cause: "permission denied".to_string(),
        },
        _ => ResolveError::NotReadable {
            path: path.to_path_buf(),
            cause: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn gguf_file_and_folders() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("m.gguf");
        fs::write(&gguf, b"GGUF").unwrap();
        assert_eq!(check(&gguf).unwrap(), gguf);
        // A folder with exactly one .gguf resolves to that file.
        assert_eq!(check(dir.path()).unwrap(), gguf);
        // Two is ambiguous.
        fs::write(dir.path().join("n.gguf"), b"GGUF").unwrap();
        let msg = check(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("m.gguf, n.gguf"), "{msg}");
        // config.json makes it a HF folder, whatever else is there.
        fs::write(dir.path().join("config.json"), b"{}").unwrap();
        assert_eq!(check(dir.path()).unwrap(), dir.path());
    }

    #[test]
    fn clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert_eq!(
            check(&missing).unwrap_err().to_string(),
            format!(
                "model path {} does not exist; pass an existing .gguf file or model folder",
                missing.display()
            )
        );
        let other = dir.path().join("weights.bin");
        fs::write(&other, b"x").unwrap();
        let msg = check(&other).unwrap_err().to_string();
        assert!(
            msg.contains("is neither a .gguf file nor a folder with config.json"),
            "{msg}"
        );
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        assert!(matches!(check(&empty), Err(ResolveError::NotAModel { .. })));
    }

    #[test]
    fn unreadable_file() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("m.gguf");
        fs::write(&gguf, b"GGUF").unwrap();
        fs::set_permissions(&gguf, fs::Permissions::from_mode(0o000)).unwrap();
        if File::open(&gguf).is_ok() {
            return; // root reads anything: nothing to test here
        }
        let msg = check(&gguf).unwrap_err().to_string();
        assert!(msg.contains("is not readable: permission denied"), "{msg}");
    }
}
