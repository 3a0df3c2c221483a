//! Sonde's tokenizer layer, shared by the router (text ↔ ids, chat templates, streaming
//! text) and the shard (special tokens).
//!
//! A model's tokenizer comes either from GGUF metadata (`tokenizer.ggml.*`, rebuilt as
//! the Hugging Face pipeline the model was trained with) or from a Hugging Face folder
//! (`tokenizer.json` and friends). Either way the result is a [`ModelTokenizer`]:
//! encode/decode through the `tokenizers` crate, the raw bytes of every token, special
//! tokens, and the chat template compiled with minijinja.

mod chat;
mod error;
pub mod gguf;
mod gguf_encoder;
mod gguf_tokenizer;
mod gguf_vocab;
mod hf;
mod model_tokenizer;
mod pretokenizer;
mod special_split;
mod spm_merges;
mod stream;
mod token_bytes;

pub use chat::{ChatInputs, ChatTemplate};
pub use error::TokenizerError;
pub use gguf_tokenizer::SUPPORTED_MODELS;
pub use model_tokenizer::{ModelTokenizer, SpecialTokens, TokenSpan};
pub use pretokenizer::supported_names as supported_pre_tokenizers;
pub use stream::StreamDecoder;
pub use token_bytes::VocabEncoding;
