//! The pre-tokenizer split named by `tokenizer.ggml.pre`, rebuilt as the `tokenizers`
//! pipeline of the model's original `tokenizer.json`.
//!
//! llama.cpp's reference vectors were produced by the Hugging Face tokenizers of the
//! original models, so each split below uses that tokenizer's own regexes and steps (the
//! same onig regex engine Hugging Face uses), not llama.cpp's hand-adapted copies.
//! A name that is not in this table is an error: a byte-level BPE vocabulary run with the
//! wrong split still produces plausible tokens, just not the ones the model was trained on.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::TokenizerError;

/// The families of splits Sonde knows, each defined once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2's own regex (also MPT, OLMo, Phi-2).
    Gpt2,
    /// GPT-2's regex after isolating every digit (StarCoder, Refact, SmolLM, Command-R).
    StarCoder,
    /// Qwen2: case-insensitive contractions, single digits.
    Qwen2,
    /// Qwen3.5: Qwen2 with combining marks kept on their letters.
    Qwen35,
    /// Llama 3: digits in groups of up to three; whole-word vocabulary hits skip merges.
    Llama3,
    DeepseekLlm,
    DeepseekCoder,
    Falcon,
}

/// `tokenizer.ggml.pre` names accepted, and the split each one means.
const NAMES: &[(&str, PreTokenizerKind)] = &[
    ("gpt-2", PreTokenizerKind::Gpt2),
    ("mpt", PreTokenizerKind::Gpt2),
    ("olmo", PreTokenizerKind::Gpt2),
    ("phi-2", PreTokenizerKind::Gpt2),
    ("starcoder", PreTokenizerKind::StarCoder),
    ("refact", PreTokenizerKind::StarCoder),
    ("smollm", PreTokenizerKind::StarCoder),
    ("command-r", PreTokenizerKind::StarCoder),
    ("qwen2", PreTokenizerKind::Qwen2),
    ("deepseek-r1-qwen", PreTokenizerKind::Qwen2),
    ("stablelm2", PreTokenizerKind::Qwen2),
    ("qwen35", PreTokenizerKind::Qwen35),
    ("llama-bpe", PreTokenizerKind::Llama3),
    ("llama3", PreTokenizerKind::Llama3),
    ("llama-v3", PreTokenizerKind::Llama3),
    ("dbrx", PreTokenizerKind::Llama3),
    ("smaug-bpe", PreTokenizerKind::Llama3),
    ("deepseek-llm", PreTokenizerKind::DeepseekLlm),
    ("deepseek-coder", PreTokenizerKind::DeepseekCoder),
    ("falcon", PreTokenizerKind::Falcon),
];

/// GPT-2's contraction/letter/number/punctuation/space pattern (what `ByteLevel` with
/// `use_regex` applies).
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek LLM splits letters of the Latin, Greek, Cyrillic, … scripts, ASCII and
/// full-width punctuation, trailing space, CJK runs and digit runs, one after another.
/// Non-ASCII characters are written as `\x{..}` escapes: several of them (U+1F7D, U+212A, …)
/// have canonical equivalents that an editor normalising to NFC would silently swap in,
/// turning ranges empty.
const DEEPSEEK_LLM_RES: &[&str] = &[
    r"[\r\n]",
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}+",
];
const DEEPSEEK_CODER_RES: &[&str] = &[
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}",
];
/// Falcon isolates runs of punctuation (ASCII symbols included), then GPT-2's pattern,
/// then cuts digit runs into threes.
const FALCON_RES: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, r"[0-9][0-9][0-9]"];

impl PreTokenizerKind {
    /// Looks up a `tokenizer.ggml.pre` name.
    pub fn from_gguf_name(name: &str) -> Result<Self, TokenizerError> {
        NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, kind)| *kind)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
                found: name.to_string(),
                supported: supported_names(),
            })
    }

    /// Whether a word that is already a vocabulary entry is emitted whole, without
    /// running merges (Llama 3's `ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        self == PreTokenizerKind::Llama3
    }

    /// The pre-tokenizer: the model's splits, then GPT-2's byte-to-unicode mapping.
    /// Offsets are not trimmed, so a token's span covers its leading space.
    pub fn build(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let byte_level_only = || ByteLevel::new(false, false, false).into();
        let steps: Vec<PreTokenizerWrapper> = match self {
            PreTokenizerKind::Gpt2 => return Ok(ByteLevel::new(false, false, true).into()),
            PreTokenizerKind::StarCoder => vec![
                Digits::new(true).into(),
                ByteLevel::new(false, false, true).into(),
            ],
            PreTokenizerKind::Qwen2 => vec![isolate(QWEN2_RE)?, byte_level_only()],
            PreTokenizerKind::Qwen35 => vec![isolate(QWEN35_RE)?, byte_level_only()],
            PreTokenizerKind::Llama3 => vec![isolate(LLAMA3_RE)?, byte_level_only()],
            PreTokenizerKind::DeepseekLlm => isolate_all(DEEPSEEK_LLM_RES, byte_level_only())?,
            PreTokenizerKind::DeepseekCoder => isolate_all(DEEPSEEK_CODER_RES, byte_level_only())?,
            PreTokenizerKind::Falcon => isolate_all(FALCON_RES, byte_level_only())?,
        };
        Ok(Sequence::new(steps).into())
    }
}

/// All accepted names, for error messages and docs.
pub fn supported_names() -> String {
    NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// A split that keeps both the matches and the text between them as pieces.
fn isolate(pattern: &str) -> Result<PreTokenizerWrapper, TokenizerError> {
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )?;
    Ok(split.into())
}

fn isolate_all(
    patterns: &[&str],
    last: PreTokenizerWrapper,
) -> Result<Vec<PreTokenizerWrapper>, TokenizerError> {
    let mut steps = patterns
        .iter()
        .map(|p| isolate(p))
        .collect::<Result<Vec<_>, _>>()?;
    steps.push(last);
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn pieces(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let mut pre = PreTokenizedString::from(text);
        kind.build().unwrap().pre_tokenize(&mut pre).unwrap();
        pre.get_splits(OffsetReferential::Original, OffsetType::Char)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect()
    }

    #[test]
    fn every_kind_builds() {
        for (name, kind) in NAMES {
            assert!(kind.build().is_ok(), "{name}");
        }
    }

    #[test]
    fn digits_split_the_way_each_family_does() {
        assert_eq!(pieces(PreTokenizerKind::Gpt2, "x 12345"), ["x", "Ġ12345"]);
        assert_eq!(
            pieces(PreTokenizerKind::StarCoder, "12345"),
            ["1", "2", "3", "4", "5"]
        );
        assert_eq!(pieces(PreTokenizerKind::Llama3, "12345"), ["123", "45"]);
        assert_eq!(pieces(PreTokenizerKind::Qwen2, "123"), ["1", "2", "3"]);
    }

    #[test]
    fn unknown_name_lists_the_supported_ones() {
        let err = PreTokenizerKind::from_gguf_name("mystery").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("`mystery`"), "{msg}");
        assert!(msg.contains("smollm") && msg.contains("llama-bpe"), "{msg}");
    }
}
