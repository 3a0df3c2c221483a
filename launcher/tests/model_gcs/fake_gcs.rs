//! Test harness: `integration-tests/fake_gcs.py` over a temp bucket, plus helpers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The tests of this binary run one at a time: the first one reads the launcher's log
/// lines through a thread-scoped subscriber, and tracing's per-callsite interest cache,
/// filled by another test's thread at the same moment, can drop them (a flake seen in CI).
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

use sonde_launcher::model::{GcsOptions, HubOptions, ProgressStyle, ResolveConfig};

pub const GGUF_KEY: &str = "models/tiny.gguf";
pub const BIG: usize = 3_000_000;

/// The fake server over a temp folder `<root>/bucket/...`; killed on drop.
pub struct FakeGcs {
    child: Child,
    port: u16,
    creds: PathBuf,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeGcs {
    pub fn start() -> Self {
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

    pub fn object(&self, key: &str) -> PathBuf {
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
    pub fn gets(&self, key: &str) -> u64 {
        let stats: serde_json::Value =
            serde_json::from_str(&self.control("GET", "/_control/stats")).unwrap();
        stats["get"][format!("bucket/{key}")].as_u64().unwrap_or(0)
    }

    pub fn fail(&self, key: &str, after: usize) {
        self.control(
            "POST",
            &format!("/_control/fail?object={key}&after={after}"),
        );
    }

    pub fn heal(&self) {
        self.control("POST", "/_control/fail");
    }

    pub fn config(&self, uri: &str, cache: &Path) -> ResolveConfig {
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
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn write(path: &Path, data: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap();
}

/// Deterministic, incompressible-looking bytes.
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
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
pub fn leftovers(dir: &Path) -> Vec<String> {
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
pub struct Logs(Arc<Mutex<Vec<u8>>>);

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
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}
