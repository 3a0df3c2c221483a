//! Incremental detokenization for streaming.
//!
//! Tokens arrive one at a time and a character may be split across several of them (an
//! emoji is often four byte tokens). `StreamDecoder` buffers the bytes of an incomplete
//! character and releases text only when it is whole, so the concatenation of everything
//! it emits equals the lossy UTF-8 decoding of all the bytes, and no chunk ever carries a
//! half character or a spurious U+FFFD.

/// Turns a stream of byte chunks into complete UTF-8 text.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token's bytes; returns the text that became complete (often empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(valid) => {
                    out.push_str(valid);
                    start = self.pending.len();
                    break;
                }
                Err(err) => {
                    let valid_end = start + err.valid_up_to();
                    // The slice is valid UTF-8 up to `valid_end` by construction.
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid_end]));
                    match err.error_len() {
                        // Bytes that can never start or continue a character: replace
                        // them now, as a lossy decode of the whole text would.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid_end + bad;
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            start = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Whether bytes of an unfinished character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: bytes of a character that never completed become U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(chunks: &[&[u8]]) -> Vec<String> {
        let mut decoder = StreamDecoder::new();
        let mut out: Vec<String> = chunks.iter().map(|c| decoder.push(c)).collect();
        out.push(decoder.finish());
        out
    }

    #[test]
    fn ascii_passes_straight_through() {
        assert_eq!(stream(&[b"Hel", b"lo"]), ["Hel", "lo", ""]);
    }

    #[test]
    fn two_byte_character_split_across_tokens_comes_out_once() {
        let e = "é".as_bytes();
        assert_eq!(
            stream(&[b"caf", &e[..1], &e[1..], b"!"]),
            ["caf", "", "é", "!", ""]
        );
    }

    #[test]
    fn emoji_split_into_four_byte_tokens() {
        let grin = "😁".as_bytes();
        assert_eq!(grin.len(), 4);
        let chunks: Vec<&[u8]> = vec![b" ", &grin[..1], &grin[1..2], &grin[2..3], &grin[3..]];
        assert_eq!(stream(&chunks), [" ", "", "", "", "😁", ""]);
    }

    #[test]
    fn cjk_character_split_with_text_on_both_sides() {
        let wo = "我".as_bytes();
        let mut first = b"x".to_vec();
        first.extend_from_slice(&wo[..2]);
        let mut second = wo[2..].to_vec();
        second.extend_from_slice(b"y");
        assert_eq!(stream(&[&first, &second]), ["x", "我y", ""]);
    }

    #[test]
    fn two_emoji_sharing_a_token_boundary() {
        let s = "🦀🎉".as_bytes();
        assert_eq!(stream(&[&s[..6], &s[6..]]), ["🦀", "🎉", ""]);
    }

    #[test]
    fn invalid_bytes_become_one_replacement_each_and_do_not_block() {
        // 0xFF can never be part of UTF-8; the stream goes on after it.
        assert_eq!(stream(&[b"a\xff", b"b"]), ["a\u{FFFD}", "b", ""]);
        // A lead byte followed by a non-continuation byte.
        assert_eq!(stream(&[b"\xe6", b"b"]), ["", "\u{FFFD}b", ""]);
    }

    #[test]
    fn unfinished_character_at_the_end_is_flushed_as_replacement() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&"😁".as_bytes()[..2]), "");
        assert!(d.has_pending());
        assert_eq!(d.finish(), "\u{FFFD}");
        assert!(!d.has_pending());
    }

    #[test]
    fn concatenation_equals_lossy_decoding_of_all_bytes() {
        let text = "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～ é\u{301}";
        let mut bytes = text.as_bytes().to_vec();
        bytes.insert(7, 0xC3); // a stray lead byte in the middle
        for chunk in 1..=5 {
            let mut d = StreamDecoder::new();
            let mut got: String = bytes.chunks(chunk).map(|c| d.push(c)).collect();
            got.push_str(&d.finish());
            assert_eq!(got, String::from_utf8_lossy(&bytes), "chunk size {chunk}");
        }
    }
}
