#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hub models fail fast and clearly when the Hub cannot be reached or refuses the id. (A real
//! download needs the real Hub, which tests cannot reach.)

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use sonde_launcher::model::{
    resolve, GcsOptions, HubOptions, ProgressStyle, ResolveConfig, ResolveError,
};

fn config(endpoint: &str, dir: &std::path::Path) -> ResolveConfig {
    ResolveConfig {
        model_id: Some("someone/some-model".to_string()),
        revision: None,
        aip_storage_uri: None,
        cache_dir: dir.to_path_buf(),
        default_model: dir.join("none"),
        progress: ProgressStyle::Log,
        gcs: GcsOptions::default(),
        hub: HubOptions {
            endpoint: endpoint.to_string(),
            token: None,
            timeout: Duration::from_secs(2),
        },
    }
}

#[tokio::test]
async fn closed_port_is_unreachable_quickly() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let err = resolve(&config(&endpoint, dir.path())).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let msg = err.to_string();
    assert!(
        matches!(err, ResolveError::HubUnreachable { .. }),
        "{err:?}"
    );
    assert!(
        msg.starts_with(&format!(
            "could not reach the Hugging Face Hub at {endpoint} to fetch someone/some-model: "
        )),
        "{msg}"
    );
    assert!(
        msg.ends_with("; pass a local path or a gs:// URI, or set HF_ENDPOINT"),
        "{msg}"
    );
    assert!(
        msg.to_lowercase().contains("refused"),
        "the cause is named: {msg}"
    );
}

#[tokio::test]
async fn silent_hub_times_out() {
    // Accepts connections and never answers: only our bound ends the wait.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let err = resolve(&config(&format!("http://127.0.0.1:{port}"), dir.path()))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(err.to_string().contains("no answer within 2s"), "{err}");
    drop(listener);
}

#[tokio::test]
async fn unknown_repo_is_refused_not_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // One answer: 404 for the repo's file list, as the Hub gives for an unknown id.
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        let request = String::from_utf8_lossy(&buf[..n]).into_owned();
        s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .unwrap();
        request
    });
    let dir = tempfile::tempdir().unwrap();
    let err = resolve(&config(&format!("http://127.0.0.1:{port}"), dir.path()))
        .await
        .unwrap_err();
    assert!(matches!(err, ResolveError::HubRefused { .. }), "{err:?}");
    assert!(err.to_string().contains("404"), "{err}");
    assert!(server
        .join()
        .unwrap()
        .starts_with("GET /api/models/someone/some-model"));
}
