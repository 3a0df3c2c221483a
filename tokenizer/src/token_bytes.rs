//! The raw bytes each token stands for.
//!
//! Streaming needs them (a character can be split across byte tokens, so text is only
//! emitted once its bytes are complete) and so does OpenAI's `bytes` field. A vocabulary
//! string is not those bytes: byte-level BPE maps each byte to a printable character,
//! SentencePiece writes spaces as `▁` and single bytes as `<0xAB>`.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::gguf_tokenizer::SPM_SPACE;

/// How a vocabulary writes the bytes of its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabEncoding {
    /// GPT-2's byte-to-unicode mapping.
    ByteLevel,
    /// Raw UTF-8 with `▁` for spaces and `<0xAB>` byte tokens.
    SentencePiece,
}

impl VocabEncoding {
    /// The bytes of one (non-added) vocabulary entry.
    pub fn token_bytes(self, token: &str) -> Vec<u8> {
        match self {
            VocabEncoding::ByteLevel => byte_level_decode(token),
            VocabEncoding::SentencePiece => sentencepiece_decode(token),
        }
    }
}

/// One entry per token id.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenBytes {
    table: Vec<Vec<u8>>,
}

impl TokenBytes {
    pub(crate) fn new(table: Vec<Vec<u8>>) -> Self {
        Self { table }
    }

    pub fn get(&self, id: u32) -> Option<&[u8]> {
        self.table.get(id as usize).map(Vec::as_slice)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }
}

/// GPT-2's table: printable ASCII and Latin-1 bytes stand for themselves, the other 68
/// bytes are shifted to U+0100.. so that every byte has a visible character.
fn unicode_to_byte() -> &'static HashMap<char, u8> {
    static MAP: OnceLock<HashMap<char, u8>> = OnceLock::new();
    MAP.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut shifted = 0u32;
        (0..=255u8)
            .map(|b| {
                let c = if printable(b) {
                    char::from(b)
                } else {
                    shifted += 1;
                    char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
                };
                (c, b)
            })
            .collect()
    })
}

fn byte_level_decode(token: &str) -> Vec<u8> {
    let map = unicode_to_byte();
    let mut out = Vec::with_capacity(token.len());
    for c in token.chars() {
        match map.get(&c) {
            Some(&b) => out.push(b),
            // Not a byte-level character (a literal token text): keep its UTF-8.
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

fn sentencepiece_decode(token: &str) -> Vec<u8> {
    if let Some(byte) = parse_byte_token(token) {
        return vec![byte];
    }
    token.replace(SPM_SPACE, " ").into_bytes()
}

/// `<0xAB>` → 0xAB.
fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_maps_shifted_characters_back_to_bytes() {
        assert_eq!(byte_level_decode("Ġworld"), b" world");
        assert_eq!(byte_level_decode("Ċ"), b"\n");
        // "é" is two bytes, each shown as a Latin-1 character.
        assert_eq!(byte_level_decode("Ã©"), "é".as_bytes());
        assert_eq!(unicode_to_byte().len(), 256);
    }

    #[test]
    fn sentencepiece_spaces_and_byte_tokens() {
        assert_eq!(sentencepiece_decode("▁Hello"), b" Hello");
        assert_eq!(sentencepiece_decode("<0x0A>"), b"\n");
        assert_eq!(sentencepiece_decode("<0xF0>"), [0xF0]);
        assert_eq!(sentencepiece_decode("<0xZZ>"), b"<0xZZ>");
    }
}
