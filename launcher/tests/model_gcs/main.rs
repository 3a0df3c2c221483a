#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `gs://` models through object_store's real GCS client, against
//! `integration-tests/fake_gcs.py` (a local stand-in for the GCS API) started by each test.

mod fake_gcs;

use fake_gcs::{bytes, leftovers, one_at_a_time, write, FakeGcs, Logs, BIG, GGUF_KEY};
use sonde_launcher::model::{resolve, ResolveError};

#[tokio::test]
async fn gguf_object_is_downloaded_with_progress_then_reused() {
    let _serial = one_at_a_time().await;
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
    // Callsites another test registered before this subscriber existed keep a stale
    // interest until rebuilt.
    tracing::callsite::rebuild_interest_cache();

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
    let _serial = one_at_a_time().await;
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
    let _serial = one_at_a_time().await;
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
    let _serial = one_at_a_time().await;
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
    let _serial = one_at_a_time().await;
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
