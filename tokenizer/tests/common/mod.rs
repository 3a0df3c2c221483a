//! Helpers shared by the integration tests.

use sonde_tokenizer::ModelTokenizer;

/// The bytes of `ids`, token by token.
pub fn concat_token_bytes(tokenizer: &ModelTokenizer, ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&id| tokenizer.token_bytes(id).unwrap().to_vec())
        .collect()
}
