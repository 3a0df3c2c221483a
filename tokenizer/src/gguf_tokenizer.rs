//! Builds a `tokenizers::Tokenizer` from the vocabulary in GGUF metadata: byte-level BPE
//! (`gpt2`) with its pre-tokenizer split, or SentencePiece-style BPE with byte fallback
//! (`llama`). The result is the pipeline Hugging Face would have built from the model's
//! original `tokenizer.json`, so it can also be saved as one.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BpeBuilder, Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{AddedToken, DecoderWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::error::TokenizerError;
use crate::gguf_encoder::GgufEncoder;
use crate::gguf_vocab::{GgufVocab, TokenType};
use crate::model_tokenizer::{SpecialTokens, TokenizerParts};
use crate::pretokenizer::PreTokenizerKind;
use crate::spm_merges::merges_from_scores;
use crate::token_bytes::VocabEncoding;

/// `tokenizer.ggml.model` values this crate builds.
pub const SUPPORTED_MODELS: &str =
    "gpt2 (byte-level BPE), llama (SentencePiece BPE), gemma4 (BPE over UTF-8 with byte fallback)";

/// SentencePiece's word-boundary marker, which stands for a space.
pub(crate) const SPM_SPACE: &str = "\u{2581}";

/// Everything a `ModelTokenizer` needs, from the GGUF vocabulary.
pub(crate) fn parts(vocab: &GgufVocab) -> Result<TokenizerParts, TokenizerError> {
    let Pipeline {
        mut tokenizer,
        encoding,
        default_add_bos,
    } = match vocab.model.as_str() {
        "gpt2" => byte_level(vocab)?,
        "llama" => sentencepiece(vocab)?,
        "gemma4" => gemma4(vocab)?,
        other => {
            return Err(TokenizerError::UnsupportedModel {
                found: other.to_string(),
                supported: SUPPORTED_MODELS.to_string(),
            })
        }
    };
    add_special_tokens(&mut tokenizer, vocab)?;
    let add_bos = vocab.add_bos.unwrap_or(default_add_bos);
    let add_eos = vocab.add_eos.unwrap_or(false);
    set_post_processor(&mut tokenizer, vocab, add_bos, add_eos)?;

    let token_bytes = vocab
        .tokens
        .iter()
        .zip(&vocab.types)
        .map(|(token, ty)| match ty {
            // Added tokens are stored as their literal text.
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown => {
                token.as_bytes().to_vec()
            }
            // llama.cpp writes nothing for an unused token.
            TokenType::Unused => Vec::new(),
            _ => encoding.token_bytes(token),
        })
        .collect();
    let special = vocab
        .types
        .iter()
        .map(|ty| *ty == TokenType::Control)
        .collect();
    let text_of = |id: Option<u32>| {
        id.and_then(|id| vocab.tokens.get(id as usize))
            .cloned()
            .unwrap_or_default()
    };
    let mut eos: Vec<u32> = vocab.eos.into_iter().collect();
    eos.extend(vocab.eot.filter(|id| Some(*id) != vocab.eos));
    Ok(TokenizerParts {
        tokenizer,
        gguf: Some(GgufEncoder::new(vocab, add_bos, add_eos)),
        token_bytes,
        special,
        special_tokens: SpecialTokens {
            bos: vocab.bos,
            eos,
            add_bos,
        },
        chat_template: vocab.chat_template.clone(),
        bos_text: text_of(vocab.bos),
        eos_text: text_of(vocab.eos),
    })
}

/// A model-specific pipeline before its special tokens are added.
struct Pipeline {
    tokenizer: Tokenizer,
    encoding: VocabEncoding,
    /// llama.cpp's default when the file has no `add_bos_token`.
    default_add_bos: bool,
}

fn byte_level(vocab: &GgufVocab) -> Result<Pipeline, TokenizerError> {
    // A missing `pre` is what old converters wrote; llama.cpp then guesses a generic
    // split and warns that quality degrades. Sonde refuses instead of guessing.
    let pre_name = vocab.pre.as_deref().unwrap_or("(missing)");
    let kind = PreTokenizerKind::from_gguf_name(pre_name)?;
    let ids = token_ids(vocab);
    let merges = usable_merges(&vocab.merges, &ids);
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .ignore_merges(kind.ignore_merges())
        .build()?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(kind.build()?));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, false)));
    Ok(Pipeline {
        tokenizer,
        encoding: VocabEncoding::ByteLevel,
        // No BOS for byte-level vocabularies, except Llama 3's.
        default_add_bos: kind == PreTokenizerKind::Llama3,
    })
}

fn sentencepiece(vocab: &GgufVocab) -> Result<Pipeline, TokenizerError> {
    if vocab.scores.is_empty() {
        return Err(TokenizerError::Metadata {
            key: "tokenizer.ggml.scores".into(),
            problem: "missing; a SentencePiece (llama) vocabulary needs its scores".into(),
        });
    }
    let ids = token_ids(vocab);
    let merges = merges_from_scores(&vocab.tokens, &vocab.scores, &ids);
    let bpe = byte_fallback_bpe(vocab, ids, merges)
        .fuse_unk(true)
        .build()?;
    let mut tokenizer = Tokenizer::new(bpe);
    let mut normalizers = Vec::new();
    let mut decoders = byte_fallback_decoders()?;
    if vocab.add_space_prefix.unwrap_or(true) {
        normalizers.push(Prepend::new(SPM_SPACE.to_string()).into());
        // The prefix added on encode is removed on decode.
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    normalizers.push(Replace::new(" ", SPM_SPACE)?.into());
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)))?;
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(Pipeline {
        tokenizer,
        encoding: VocabEncoding::SentencePiece,
        default_add_bos: true,
    })
}

/// Gemma 4: BPE merges over raw UTF-8 text with spaces written as `▁` (no byte-level
/// mapping), bytes outside the vocabulary as `<0xAB>` tokens, and no word split except
/// around newline runs, which are single tokens when the vocabulary has them.
fn gemma4(vocab: &GgufVocab) -> Result<Pipeline, TokenizerError> {
    let ids = token_ids(vocab);
    let merges = usable_merges(&vocab.merges, &ids);
    let bpe = byte_fallback_bpe(vocab, ids, merges)
        // Runs of newlines are vocabulary entries that no merge produces (SentencePiece
        // kept them as whole pieces); a word that is an entry is taken whole, as
        // llama.cpp does for them. Other entries are reachable by merges anyway.
        .ignore_merges(true)
        .build()?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_normalizer(Some(Replace::new(" ", SPM_SPACE)?))?;
    tokenizer.with_pre_tokenizer(Some(Split::new(
        SplitPattern::Regex("[^\\n]+|[\\n]+".to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )?));
    tokenizer.with_decoder(Some(DecoderSequence::new(byte_fallback_decoders()?)));
    Ok(Pipeline {
        tokenizer,
        encoding: VocabEncoding::SentencePiece,
        default_add_bos: true,
    })
}

/// BPE over UTF-8 pieces where a character outside the vocabulary becomes `<0xAB>` tokens.
fn byte_fallback_bpe(vocab: &GgufVocab, ids: Vocab, merges: Vec<(String, String)>) -> BpeBuilder {
    let builder = BPE::builder()
        .vocab_and_merges(ids, merges)
        .byte_fallback(true);
    match vocab.unk.and_then(|id| vocab.tokens.get(id as usize)) {
        Some(unk) => builder.unk_token(unk.clone()),
        None => builder,
    }
}

/// `▁` back to spaces, `<0xAB>` tokens back to bytes, joined into one string.
fn byte_fallback_decoders() -> Result<Vec<DecoderWrapper>, TokenizerError> {
    Ok(vec![
        Replace::new(SPM_SPACE, " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])
}

/// Token string → id. When a string occurs twice the later id wins, as in llama.cpp.
fn token_ids(vocab: &GgufVocab) -> Vocab {
    vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id as u32))
        .collect()
}

/// Merges whose parts or result are missing from the vocabulary can never fire; the
/// BPE builder rejects them, so they are dropped (llama.cpp ignores them the same way).
fn usable_merges(merges: &[(String, String)], ids: &Vocab) -> Vec<(String, String)> {
    merges
        .iter()
        .filter(|(a, b)| {
            ids.contains_key(a) && ids.contains_key(b) && ids.contains_key(&format!("{a}{b}"))
        })
        .cloned()
        .collect()
}

/// Control tokens become special added tokens; user-defined tokens are matched verbatim
/// in text too, but are ordinary text when decoding.
fn add_special_tokens(tokenizer: &mut Tokenizer, vocab: &GgufVocab) -> Result<(), TokenizerError> {
    let added = |wanted: TokenType, special: bool| -> Vec<AddedToken> {
        vocab
            .tokens
            .iter()
            .zip(&vocab.types)
            .filter(|(token, ty)| **ty == wanted && !token.is_empty())
            .map(|(token, _)| AddedToken::from(token.clone(), special).normalized(false))
            .collect()
    };
    tokenizer.add_special_tokens(added(TokenType::Control, true))?;
    tokenizer.add_tokens(added(TokenType::UserDefined, false))?;
    Ok(())
}

/// Adds BOS/EOS around an encoded text when `add_special_tokens` is asked for.
fn set_post_processor(
    tokenizer: &mut Tokenizer,
    vocab: &GgufVocab,
    add_bos: bool,
    add_eos: bool,
) -> Result<(), TokenizerError> {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Vec::new();
    // Template pieces name special tokens by key; the keys "bos"/"eos" are ours, so a
    // token text containing ':' or spaces cannot confuse the template parser.
    let mut add = |key: &str, id: Option<u32>| {
        if let Some(id) = id {
            let text = vocab.tokens[id as usize].clone();
            // One id and one text: `new` cannot fail.
            if let Ok(token) = SpecialToken::new(key.to_string(), vec![id], vec![text]) {
                specials.push(token);
                return true;
            }
        }
        false
    };
    let bos = add_bos && add("bos", vocab.bos);
    let eos = add_eos && add("eos", vocab.eos);
    if !bos && !eos {
        return Ok(());
    }
    for (seq, out) in [("$A", &mut single), ("$B", &mut pair)] {
        if bos {
            out.push("bos".to_string());
        }
        out.push(seq.to_string());
        if eos {
            out.push("eos".to_string());
        }
    }
    let pair = [single.clone(), pair].concat();
    let processor = TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair))
        .map_err(TokenizerError::Tokenizers)?
        .special_tokens(specials)
        .build()
        .map_err(|e| TokenizerError::Tokenizers(e.to_string()))?;
    tokenizer.with_post_processor(Some(processor));
    Ok(())
}
