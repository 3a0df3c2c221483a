//! Helpers shared by the integration tests.

use std::path::PathBuf;

use sonde_tokenizer::ModelTokenizer;

/// Where `scripts/test` puts fetched data and references (`SONDE_DATA_DIR`, else `data/`).
pub fn data_dir() -> PathBuf {
    std::env::var_os("SONDE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data"))
}

/// The bytes of `ids`, token by token.
pub fn concat_token_bytes(tokenizer: &ModelTokenizer, ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&id| tokenizer.token_bytes(id).unwrap().to_vec())
        .collect()
}
