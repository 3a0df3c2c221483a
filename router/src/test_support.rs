//! What the router's unit tests share.

use std::sync::{Arc, OnceLock};

use sonde_tokenizer::ModelTokenizer;

/// The default model's tokenizer, loaded once per test binary.
pub fn smollm2_tokenizer() -> Arc<ModelTokenizer> {
    static TOKENIZER: OnceLock<Arc<ModelTokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = sonde_testdata::smollm2_gguf();
            let tokenizer = ModelTokenizer::from_gguf_file(&path);
            Arc::new(tokenizer.unwrap_or_else(|e| panic!("the SmolLM2 tokenizer: {e}")))
        })
        .clone()
}
