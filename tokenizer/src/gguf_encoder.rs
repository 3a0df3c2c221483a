//! Encoding and decoding for a GGUF vocabulary the way llama.cpp does it.
//!
//! The `tokenizers` pipeline built from the metadata is kept for what it is exact at (the
//! normalizer, the pre-tokenizer split and the BPE model, run on plain text), but llama.cpp
//! decides two things differently from Hugging Face, and Sonde follows llama.cpp for GGUF
//! files:
//!
//! * which special tokens written in the text are split out, and where (`special_split`:
//!   longest token first rather than leftmost-longest; with `parse_special` off, control
//!   tokens stay text while user-defined ones still split; the unknown token counts as
//!   special; and a few token texts llama.cpp treats as control whatever the file says);
//! * the text of ids: the tokens' bytes joined and read as UTF-8, each maximal invalid
//!   sequence one U+FFFD (Hugging Face's byte-fallback decoder writes one per byte token).

use tokenizers::{
    Model, NormalizedString, Normalizer, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer,
};

use crate::error::TokenizerError;
use crate::gguf_vocab::{GgufVocab, TokenType};
use crate::model_tokenizer::TokenSpan;
use crate::special_split::{Fragment, SpecialSplitter, SpecialText};

/// How `encode` treats special tokens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EncodeOptions {
    /// Add BOS/EOS as the file says.
    pub add_special: bool,
    /// Match special tokens written in the text (`<|im_start|>`), as llama.cpp's
    /// `parse_special = true`; false reads them as the characters they spell.
    pub parse_special: bool,
}

/// Token texts that llama.cpp makes control tokens whatever their type in the file (its
/// "auto-detect special tokens by text" in `llama_vocab::impl::load`: the end-of-turn,
/// end-of-message, fill-in-the-middle and end-of-generation lists). Gemma 3's user-defined
/// HTML tag `</s>` is one, so without `parse_special` llama.cpp leaves it as text.
///
/// llama.cpp also stops generating at many of these and prints none of them without
/// `special`; Sonde's `is_special` and end-of-sequence ids keep the file's types.
const CONTROL_BY_TEXT: &[&str] = &[
    // end of turn / message
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
    "<|eom_id|>",
    // fill in the middle
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
    // end of generation
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "</s>",
    "[EOS]",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "[e~[",
];

/// Token texts llama.cpp makes user-defined whatever the file says (gpt-oss's).
const USER_DEFINED_BY_TEXT: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

#[derive(Debug, Clone)]
pub(crate) struct GgufEncoder {
    splitter: SpecialSplitter,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// SentencePiece's `add_space_prefix`: the space put before the text on encode comes
    /// off the decoded text again.
    strip_space_prefix: bool,
}

impl GgufEncoder {
    pub(crate) fn new(vocab: &GgufVocab, add_bos: bool, add_eos: bool) -> Self {
        let specials = vocab
            .tokens
            .iter()
            .zip(&vocab.types)
            .enumerate()
            .filter_map(|(id, (text, &ty))| {
                let control = if USER_DEFINED_BY_TEXT.contains(&text.as_str()) {
                    false
                } else if CONTROL_BY_TEXT.contains(&text.as_str()) {
                    true
                } else {
                    match ty {
                        TokenType::Control | TokenType::Unknown => true,
                        TokenType::UserDefined => false,
                        _ => return None,
                    }
                };
                Some(SpecialText {
                    id: id as u32,
                    text: text.clone(),
                    control,
                })
            })
            .collect();
        Self {
            splitter: SpecialSplitter::new(specials),
            bos: vocab.bos,
            eos: vocab.eos,
            add_bos,
            add_eos,
            strip_space_prefix: vocab.model == "llama" && vocab.add_space_prefix.unwrap_or(true),
        }
    }

    /// The tokens of `text` with their byte spans (empty for BOS/EOS).
    pub(crate) fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        opts: EncodeOptions,
    ) -> Result<Vec<TokenSpan>, TokenizerError> {
        let EncodeOptions {
            add_special,
            parse_special,
        } = opts;
        let mut out = Vec::new();
        let mut push = |id: Option<u32>, span: (usize, usize)| {
            if let Some(id) = id {
                out.push(TokenSpan {
                    id,
                    start: span.0,
                    stop: span.1,
                });
            }
        };
        if add_special && self.add_bos {
            push(self.bos, (0, 0));
        }
        for fragment in self.splitter.split(text, parse_special) {
            match fragment {
                Fragment::Token { id, span } => push(Some(id), (span.start, span.end)),
                Fragment::Text(range) => {
                    let start = range.start;
                    for span in encode_plain(tokenizer, &text[range], start)? {
                        push(Some(span.id), (span.start, span.stop));
                    }
                }
            }
        }
        if add_special && self.add_eos {
            push(self.eos, (0, 0));
        }
        Ok(out)
    }

    /// The text of `ids` from their bytes, as llama.cpp's detokenizer writes it.
    pub(crate) fn decode<'a>(&self, pieces: impl Iterator<Item = &'a [u8]>) -> String {
        let mut bytes: Vec<u8> = pieces.flatten().copied().collect();
        if self.strip_space_prefix && bytes.first() == Some(&b' ') {
            bytes.remove(0);
        }
        match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        }
    }
}

/// Plain text (no special tokens in it) through the pipeline's normalizer, pre-tokenizer
/// and model, as `Tokenizer::encode` runs each stretch between added tokens; ids with
/// byte offsets into `text` shifted by `offset`.
fn encode_plain(
    tokenizer: &Tokenizer,
    text: &str,
    offset: usize,
) -> Result<Vec<TokenSpan>, TokenizerError> {
    let mut normalized = NormalizedString::from(text);
    if let Some(normalizer) = tokenizer.get_normalizer() {
        normalizer.normalize(&mut normalized)?;
    }
    let mut pretokenized = PreTokenizedString::from(normalized);
    if let Some(pre_tokenizer) = tokenizer.get_pre_tokenizer() {
        pre_tokenizer.pre_tokenize(&mut pretokenized)?;
    }
    let model = tokenizer.get_model();
    pretokenized.tokenize(|piece| model.tokenize(piece.get()))?;
    let encoding = pretokenized.into_encoding(None, 0, OffsetType::Byte)?;
    Ok(encoding
        .get_ids()
        .iter()
        .zip(encoding.get_offsets())
        .map(|(&id, &(start, stop))| TokenSpan {
            id,
            start: offset + start,
            stop: offset + stop,
        })
        .collect())
}
