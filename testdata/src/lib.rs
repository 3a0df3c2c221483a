//! Where the tests find the models and references `scripts/test` fetches and builds:
//! `$SONDE_DATA_DIR`, else the workspace's `data/`. A test whose data is missing fails,
//! naming the file and the command that makes it; it never skips itself.

use std::path::{Path, PathBuf};

/// The default model, the one most tests run on.
pub const SMOLLM2_GGUF: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The data folder.
pub fn data_dir() -> PathBuf {
    std::env::var_os("SONDE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../data"))
}

/// `relative` under the data folder, which must exist.
///
/// # Panics
/// When it does not: the test then fails with the path and how to make it.
pub fn path(relative: &str) -> PathBuf {
    let path = data_dir().join(relative);
    assert!(
        path.exists(),
        "test data {} is missing: run scripts/test (it fetches and builds every fixture), \
         or set SONDE_DATA_DIR to a folder that has it",
        path.display()
    );
    path
}

/// The default model's GGUF.
pub fn smollm2_gguf() -> PathBuf {
    path(SMOLLM2_GGUF)
}
