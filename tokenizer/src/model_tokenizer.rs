//! `ModelTokenizer`: one model's tokenizer, special tokens, token bytes and chat
//! template, loaded from a GGUF file or a Hugging Face folder.

use std::path::Path;
use std::sync::OnceLock;

use tokenizers::Tokenizer;

use crate::chat::{ChatInputs, ChatTemplate};
use crate::error::TokenizerError;
use crate::gguf::GgufMetadata;
use crate::gguf_encoder::{EncodeOptions, GgufEncoder};
use crate::gguf_tokenizer;
use crate::gguf_vocab::GgufVocab;
use crate::hf;
use crate::stream::StreamDecoder;
use crate::token_bytes::TokenBytes;

/// A token with its byte span in the encoded text (`/tokenize`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSpan {
    pub id: u32,
    /// Byte offsets into the input. Tokens that each hold part of one character (byte
    /// tokens of an emoji) all carry that character's span; BOS/EOS added around the
    /// text have an empty one.
    pub start: usize,
    pub stop: usize,
}

/// Special-token facts the router and the shard need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    /// Every token that ends generation (EOS, and e.g. an end-of-turn token).
    pub eos: Vec<u32>,
    /// Whether `encode(.., add_special_tokens = true)` puts BOS in front.
    pub add_bos: bool,
}

#[derive(Debug)]
pub struct ModelTokenizer {
    tokenizer: Tokenizer,
    /// For a GGUF vocabulary: llama.cpp's special-token split and decoding around the
    /// pipeline's model. `None` for a Hugging Face folder, whose `tokenizer.json` says how.
    gguf: Option<GgufEncoder>,
    /// A Hugging Face folder's pipeline with special tokens left as text, built on first use.
    literal: OnceLock<Tokenizer>,
    bytes: TokenBytes,
    special: Vec<bool>,
    special_tokens: SpecialTokens,
    /// A template that failed to compile is kept as its error, so the model still serves
    /// raw prompts and every chat request gets the reason.
    chat_template: Option<Result<ChatTemplate, String>>,
}

/// What a source (GGUF metadata, a Hugging Face folder) provides.
pub(crate) struct TokenizerParts {
    pub tokenizer: Tokenizer,
    pub gguf: Option<GgufEncoder>,
    /// The bytes of each token id.
    pub token_bytes: Vec<Vec<u8>>,
    /// Whether each token id is special.
    pub special: Vec<bool>,
    pub special_tokens: SpecialTokens,
    pub chat_template: Option<String>,
    /// The texts a template sees as `bos_token` / `eos_token`.
    pub bos_text: String,
    pub eos_text: String,
}

impl ModelTokenizer {
    /// Loads from a `.gguf` file, reading only its metadata.
    pub fn from_gguf_file(path: &Path) -> Result<Self, TokenizerError> {
        Self::from_gguf_metadata(&GgufMetadata::read_file(path)?)
    }

    pub fn from_gguf_metadata(meta: &GgufMetadata) -> Result<Self, TokenizerError> {
        Ok(Self::from_parts(gguf_tokenizer::parts(
            &GgufVocab::from_metadata(meta)?,
        )?))
    }

    /// Loads from a Hugging Face model folder (`tokenizer.json` required).
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        Ok(Self::from_parts(hf::parts(dir)?))
    }

    fn from_parts(parts: TokenizerParts) -> Self {
        let chat_template = parts.chat_template.map(|source| {
            ChatTemplate::new(&source, &parts.bos_text, &parts.eos_text).map_err(|e| e.to_string())
        });
        Self {
            tokenizer: parts.tokenizer,
            gguf: parts.gguf,
            literal: OnceLock::new(),
            bytes: TokenBytes::new(parts.token_bytes),
            special: parts.special,
            special_tokens: parts.special_tokens,
            chat_template,
        }
    }

    /// Token ids of `text`. Special tokens written in the text are matched (as TGI and
    /// llama.cpp's server do); `add_special_tokens` adds BOS/EOS as the model wants.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_ids(text, add_special_tokens, true)
    }

    /// Like `encode`, but special (control) tokens written in the text are encoded as the
    /// text they spell, as llama.cpp's `parse_special = false` does: `<start_of_turn>` in a
    /// user's message is not the model's turn marker. User-defined tokens (Gemma's runs of
    /// spaces, HTML tags) still match, as they do in llama.cpp and Hugging Face.
    pub fn encode_literal(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_ids(text, add_special_tokens, false)
    }

    fn encode_ids(
        &self,
        text: &str,
        add_special_tokens: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if let Some(gguf) = &self.gguf {
            let opts = EncodeOptions {
                add_special: add_special_tokens,
                parse_special,
            };
            let spans = gguf.encode(&self.tokenizer, text, opts)?;
            return Ok(spans.into_iter().map(|s| s.id).collect());
        }
        let tokenizer = if parse_special {
            &self.tokenizer
        } else {
            self.literal.get_or_init(|| {
                let mut literal = self.tokenizer.clone();
                literal.set_encode_special_tokens(true);
                literal
            })
        };
        Ok(tokenizer
            .encode_fast(text, add_special_tokens)?
            .get_ids()
            .to_vec())
    }

    /// Like `encode`, with each token's byte span in `text`.
    pub fn encode_with_offsets(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenSpan>, TokenizerError> {
        if let Some(gguf) = &self.gguf {
            let opts = EncodeOptions {
                add_special: add_special_tokens,
                parse_special: true,
            };
            return gguf.encode(&self.tokenizer, text, opts);
        }
        let encoding = self.tokenizer.encode(text, add_special_tokens)?;
        Ok(encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .map(|(&id, &(start, stop))| TokenSpan { id, start, stop })
            .collect())
    }

    /// The text of `ids`, as the model's decoder writes it (for a GGUF vocabulary, as
    /// llama.cpp's detokenizer does: the tokens' bytes, invalid UTF-8 replaced by U+FFFD).
    /// Ids outside the vocabulary are left out.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        if let Some(gguf) = &self.gguf {
            let pieces = ids
                .iter()
                .filter(|&&id| !(skip_special_tokens && self.is_special(id)))
                .filter_map(|&id| self.bytes.get(id));
            return Ok(gguf.decode(pieces));
        }
        Ok(self.tokenizer.decode(ids, skip_special_tokens)?)
    }

    /// The raw bytes of one token (OpenAI's `bytes`); `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id)
    }

    /// One token's text on its own; a token holding part of a character shows U+FFFD.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.token_bytes(id)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// Whether `id` is a special (control) token, left out of text when asked to.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }

    /// A decoder for one streamed generation.
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder::new()
    }

    pub fn chat_template(&self) -> Result<&ChatTemplate, TokenizerError> {
        match &self.chat_template {
            None => Err(TokenizerError::NoChatTemplate),
            Some(Ok(template)) => Ok(template),
            Some(Err(msg)) => Err(TokenizerError::Template(format!(
                "the model's chat template does not compile: {msg}"
            ))),
        }
    }

    /// Renders a conversation into prompt text with the model's template.
    pub fn apply_chat_template(&self, inputs: &ChatInputs<'_>) -> Result<String, TokenizerError> {
        self.chat_template()?.render(inputs)
    }

    /// The underlying `tokenizers` pipeline (e.g. to save as `tokenizer.json`).
    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }
}
