//! `ModelTokenizer`: one model's tokenizer, special tokens, token bytes and chat
//! template, loaded from a GGUF file or a Hugging Face folder.

use std::path::Path;

use tokenizers::Tokenizer;

use crate::chat::{ChatInputs, ChatTemplate};
use crate::error::TokenizerError;
use crate::gguf::GgufMetadata;
use crate::gguf_tokenizer;
use crate::gguf_vocab::GgufVocab;
use crate::hf;
use crate::stream::StreamDecoder;
use crate::token_bytes::{TokenBytes, VocabEncoding};

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
    bytes: TokenBytes,
    special: Vec<bool>,
    special_tokens: SpecialTokens,
    /// A template that failed to compile is kept as its error, so the model still serves
    /// raw prompts and every chat request gets the reason.
    chat_template: Option<Result<ChatTemplate, String>>,
}

impl ModelTokenizer {
    /// Loads from a `.gguf` file, reading only its metadata.
    pub fn from_gguf_file(path: &Path) -> Result<Self, TokenizerError> {
        Self::from_gguf_metadata(&GgufMetadata::read_file(path)?)
    }

    pub fn from_gguf_metadata(meta: &GgufMetadata) -> Result<Self, TokenizerError> {
        let vocab = GgufVocab::from_metadata(meta)?;
        let built = gguf_tokenizer::build(&vocab)?;
        let is_added = |id: usize| {
            use crate::gguf_vocab::TokenType::{Control, UserDefined};
            matches!(vocab.types[id], Control | UserDefined)
        };
        let bytes = vocab
            .tokens
            .iter()
            .enumerate()
            .map(|(id, token)| match is_added(id) {
                true => token.as_bytes().to_vec(),
                false => built.encoding.token_bytes(token),
            })
            .collect();
        let special = vocab
            .types
            .iter()
            .map(|ty| *ty == crate::gguf_vocab::TokenType::Control)
            .collect();
        let text_of = |id: Option<u32>| {
            id.and_then(|id| vocab.tokens.get(id as usize))
                .cloned()
                .unwrap_or_default()
        };
        let mut eos: Vec<u32> = vocab.eos.into_iter().chain(vocab.eot).collect();
        eos.dedup();
        let chat_template = vocab.chat_template.as_deref().map(|source| {
            ChatTemplate::new(source, &text_of(vocab.bos), &text_of(vocab.eos))
                .map_err(|e| e.to_string())
        });
        Ok(Self {
            tokenizer: built.tokenizer,
            bytes: TokenBytes::new(bytes),
            special,
            special_tokens: SpecialTokens {
                bos: vocab.bos,
                eos,
                add_bos: built.add_bos,
            },
            chat_template,
        })
    }

    /// Loads from a Hugging Face model folder (`tokenizer.json` required).
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let files = hf::read_dir(dir)?;
        let tokenizer = files.tokenizer;
        let size = tokenizer.get_vocab_size(true);
        let added = tokenizer.get_added_tokens_decoder();
        let mut special = vec![false; size];
        for (id, token) in &added {
            if let Some(slot) = special.get_mut(*id as usize) {
                *slot = token.special;
            }
        }
        let encoding = vocab_encoding(&tokenizer);
        let bytes = (0..size as u32)
            .map(|id| {
                if let Some(token) = added.get(&id) {
                    return token.content.as_bytes().to_vec();
                }
                match (encoding, tokenizer.id_to_token(id)) {
                    (Some(enc), Some(token)) => enc.token_bytes(&token),
                    // An unfamiliar decoder (WordPiece, …): ask it about the token alone.
                    _ => tokenizer
                        .decode(&[id], false)
                        .unwrap_or_default()
                        .into_bytes(),
                }
            })
            .collect();
        let id_of = |text: &Option<String>| text.as_deref().and_then(|t| tokenizer.token_to_id(t));
        let bos = id_of(&files.bos_token).or(files.bos_token_id);
        let mut eos: Vec<u32> = id_of(&files.eos_token).into_iter().collect();
        for id in files.eos_token_ids {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        // The post-processor decides what `add_special_tokens` adds; ask it.
        let add_bos = bos.is_some()
            && tokenizer
                .encode("a", true)
                .map(|e| e.get_ids().first().copied() == bos)
                .unwrap_or(false);
        let text_of = |id: Option<u32>, text: &Option<String>| {
            text.clone()
                .or_else(|| id.and_then(|id| tokenizer.id_to_token(id)))
                .unwrap_or_default()
        };
        let chat_template = files.chat_template.as_deref().map(|source| {
            ChatTemplate::new(
                source,
                &text_of(bos, &files.bos_token),
                &text_of(eos.first().copied(), &files.eos_token),
            )
            .map_err(|e| e.to_string())
        });
        Ok(Self {
            bytes: TokenBytes::new(bytes),
            special,
            special_tokens: SpecialTokens { bos, eos, add_bos },
            chat_template,
            tokenizer,
        })
    }

    /// Token ids of `text`. Special tokens written in the text are matched (as TGI and
    /// llama.cpp's server do); `add_special_tokens` adds BOS/EOS as the model wants.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        Ok(self
            .tokenizer
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
        let encoding = self.tokenizer.encode(text, add_special_tokens)?;
        Ok(encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .map(|(&id, &(start, stop))| TokenSpan { id, start, stop })
            .collect())
    }

    /// The text of `ids`, as the model's decoder writes it.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
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

/// Which byte encoding a Hugging Face pipeline's vocabulary uses, from its decoder.
fn vocab_encoding(tokenizer: &Tokenizer) -> Option<VocabEncoding> {
    let decoder = serde_json::to_value(tokenizer.get_decoder()?).ok()?;
    let text = decoder.to_string();
    if text.contains("\"ByteLevel\"") {
        Some(VocabEncoding::ByteLevel)
    } else if text.contains("\"ByteFallback\"") || text.contains("\"Metaspace\"") {
        Some(VocabEncoding::SentencePiece)
    } else {
        None
    }
}
