#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `gs://` models through object_store's real GCS client, against
//! `integration-tests/fake_gcs.py` (a local stand-in for the GCS API) started by each test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sonde_launcher::model::{
    resolve, GcsOptions, HubOptions, ProgressStyle, ResolveConfig, ResolveError,
};

const GGUF_KEY: &str = "models/tiny.gguf";
const BIG: usize = 3_000_000;

/// The fake server over a temp folder `<root>/bucket/...`; killed on drop.
struct FakeGcs {
    child: Child,
    port: u16,
    creds: PathBuf,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeGcs {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let bucket = root.join("bucket");
        write(&bucket.join(GGUF_KEY), &bytes(BIG, 1));
        write(
            &bucket.join("models/hf/config.json"),
            br#"{"model_type":"llama"}"#,
        );
        write(
            &bucket.join("models/hf/model.safetensors"),
            &bytes(1_500_000, 2),
        );
        write(&bucket.join("models/hf/tokenizer.json"), b"{}");
        write(&bucket.join("models/hf/sub/extra.txt"), b"nested");
        write(&bucket.join("models/notamodel/readme.txt"), b"hello");
        let creds = dir.path().join("creds.json");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../integration-tests/fake_gcs.py");
        let mut child = Command::new("python3")
            .arg(script)
            .args([
                "--root".as_ref(),
                root.as_os_str(),
                "--credentials-out".as_ref(),
                creds.as_os_str(),
            ])
            .arg("--exit-on-stdin-eof") // if this test process dies, the server follows
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs fake_gcs.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .expect(&line);
        Self {
            child,
            port,
            creds,
            root,
            _dir: dir,
        }
    }

    fn object(&self, key: &str) -> PathBuf {
        self.root.join("bucket").join(key)
    }

    fn control(&self, method: &str, path: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer.split_once("\r\n\r\n").unwrap().1.to_string()
    }

    /// GETs of `bucket/<key>` the server has answered.
    fn gets(&self, key: &str) -> u64 {
        let stats: serde_json::Value =
            serde_json::from_str(&self.control("GET", "/_control/stats")).unwrap();
        stats["get"][format!("bucket/{key}")].as_u64().unwrap_or(0)
    }

    fn fail(&self, key: &str, after: usize) {
        self.control(
            "POST",
            &format!("/_control/fail?object={key}&after={after}"),
        );
    }

    fn heal(&self) {
        self.control("POST", "/_control/fail");
    }

    fn config(&self, uri: &str, cache: &Path) -> ResolveConfig {
        ResolveConfig {
            model_id: Some(uri.to_string()),
            revision: None,
            aip_storage_uri: None,
            cache_dir: cache.to_path_buf(),
            default_model: cache.join("no-default"),
            progress: ProgressStyle::Log,
            gcs: GcsOptions {
                service_account_path: Some(self.creds.clone()),
                max_retries: 2,
                retry_timeout: Duration::from_secs(5),
                ..GcsOptions::default()
            },
            hub: HubOptions::default(),
        }
    }
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        self.stop();
    }
}

impl FakeGcs {
    /// Stops the server but keeps its folder (and the credentials file pointing at it).
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write(path: &Path, data: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap();
}

/// Deterministic, incompressible-looking bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Hidden leftovers (`.x.partial`, `.x.old`) in a folder.
fn leftovers(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial") || n.ends_with(".old"))
        .collect()
}

/// Collects this thread's tracing lines (tokio tests run on one thread).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn gguf_object_is_downloaded_with_progress_then_reused() {
    let mut gcs = FakeGcs::start();
    let cache = tempfile::tempdir().unwrap();
    let cfg = gcs.config("gs://bucket/models/tiny.gguf", cache.path());
    let logs = Logs::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let model = resolve(&cfg).await.unwrap();
    let dest = cache.path().join("gcs/bucket/models/tiny.gguf");
    assert_eq!(model.path, dest);
    assert!(
        model.source.contains("gs://bucket/models/tiny.gguf"),
        "{}",
        model.source
    );
    assert!(
        std::fs::read(&dest).unwrap() == bytes(BIG, 1),
        "downloaded bytes differ"
    );
    assert_eq!(gcs.gets(GGUF_KEY), 1);
    let text = logs.text();
    assert!(
        text.contains("downloading gs://bucket/models/tiny.gguf: 3.0 MB"),
        "{text}"
    );
    assert!(
        text.contains("of 3.0 MB (100%)") && text.contains("MB/s"),
        "{text}"
    );

    // A second start reuses the complete download: no object is fetched again.
    assert_eq!(resolve(&cfg).await.unwrap().path, dest);
    assert_eq!(gcs.gets(GGUF_KEY), 1);
    assert!(logs.text().contains("reusing the complete download"));

    // With GCS unreachable, the complete earlier download still serves.
    gcs.stop();
    assert_eq!(resolve(&cfg).await.unwrap().path, dest);
    assert!(logs
        .text()
        .contains("serving the earlier complete download"));
}

#[tokio::test]
async fn folder_is_downloaded_keeping_relative_paths_and_refreshed_when_changed() {
    let gcs = FakeGcs::start();
    let cache = tempfile::tempdir().unwrap();
    let cfg = gcs.config("gs://bucket/models/hf/", cache.path());
    let model = resolve(&cfg).await.unwrap();
    let dest = cache.path().join("gcs/bucket/models/hf");
    assert_eq!(model.path, dest);
    for rel in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "sub/extra.txt",
    ] {
        let want = std::fs::read(gcs.object(&format!("models/hf/{rel}"))).unwrap();
        assert!(
            std::fs::read(dest.join(rel)).unwrap() == want,
            "{rel} differs"
        );
    }
    assert!(dest.join(".sonde-manifest.json").is_file());
    assert_eq!(gcs.gets("models/hf/model.safetensors"), 1);
    resolve(&cfg).await.unwrap();
    assert_eq!(
        gcs.gets("models/hf/model.safetensors"),
        1,
        "a complete download is reused"
    );

    // The bucket's copy changed size: download again, replacing the old folder.
    write(
        &gcs.object("models/hf/model.safetensors"),
        &bytes(700_000, 3),
    );
    resolve(&cfg).await.unwrap();
    assert_eq!(gcs.gets("models/hf/model.safetensors"), 2);
    assert!(std::fs::read(dest.join("model.safetensors")).unwrap() == bytes(700_000, 3));
    assert!(leftovers(dest.parent().unwrap()).is_empty());
}

#[tokio::test]
async fn interrupted_file_download_leaves_nothing_and_retry_succeeds() {
    let gcs = FakeGcs::start();
    let cache = tempfile::tempdir().unwrap();
    let cfg = gcs.config("gs://bucket/models/tiny.gguf", cache.path());
    let dest = cache.path().join("gcs/bucket/models/tiny.gguf");
    gcs.fail(GGUF_KEY, 1_000_000);
    let err = resolve(&cfg).await.unwrap_err();
    assert!(matches!(err, ResolveError::GcsDownload { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("download of gs://bucket/models/tiny.gguf failed"),
        "{err}"
    );
    assert!(!dest.exists(), "nothing may be left at the final path");
    assert!(leftovers(dest.parent().unwrap()).is_empty());
    assert!(
        gcs.gets(GGUF_KEY) >= 2,
        "object_store resumed the broken stream before giving up"
    );

    // A run killed mid-download leaves a partial file: the next run starts over cleanly.
    write(&dest.with_file_name(".tiny.gguf.partial"), b"half a model");
    gcs.heal();
    assert_eq!(resolve(&cfg).await.unwrap().path, dest);
    assert!(std::fs::read(&dest).unwrap() == bytes(BIG, 1));
    assert!(leftovers(dest.parent().unwrap()).is_empty());
}

#[tokio::test]
async fn interrupted_folder_download_leaves_nothing_and_retry_succeeds() {
    let gcs = FakeGcs::start();
    let cache = tempfile::tempdir().unwrap();
    let cfg = gcs.config("gs://bucket/models/hf", cache.path());
    let dest = cache.path().join("gcs/bucket/models/hf");
    gcs.fail("models/hf/model.safetensors", 500_000);
    let err = resolve(&cfg).await.unwrap_err();
    assert!(err.to_string().contains("gs://bucket/models/hf"), "{err}");
    assert!(!dest.exists(), "nothing may be left at the final path");
    assert!(leftovers(dest.parent().unwrap()).is_empty());
    gcs.heal();
    assert_eq!(resolve(&cfg).await.unwrap().path, dest);
    assert!(dest.join("sub/extra.txt").is_file());
}

#[tokio::test]
async fn missing_or_unusable_objects_are_clear_errors() {
    let gcs = FakeGcs::start();
    let cache = tempfile::tempdir().unwrap();
    for uri in [
        "gs://bucket/models/nope.gguf",
        "gs://bucket/models/nothing-here",
    ] {
        let err = resolve(&gcs.config(uri, cache.path())).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{uri} does not exist; check the URI and that the credentials can read the bucket"
            )
        );
    }
    let err = resolve(&gcs.config("gs://bucket/models/notamodel", cache.path()))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("gs://bucket/models/notamodel holds neither config.json"),
        "{err}"
    );
    assert_eq!(
        gcs.gets("models/notamodel/readme.txt"),
        0,
        "refused before downloading"
    );
    assert!(!cache.path().join("gcs/bucket/models/nope.gguf").exists());
}
