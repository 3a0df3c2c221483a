//! Special tokens written in text, split out before the model sees it, exactly as
//! llama.cpp does for a GGUF vocabulary (`llama_vocab::impl::tokenizer_st_partition`).
//!
//! llama.cpp takes the control, user-defined and unknown tokens longest first and lets
//! each split every stretch of text still unclaimed at each of its occurrences, left to
//! right. That is not Hugging Face's leftmost-longest match: with tokens `ab` and `bcd`,
//! llama.cpp splits `abcd` as `a` + `bcd`, Hugging Face as `ab` + `cd`. Without
//! `parse_special`, control and unknown tokens are left as text; user-defined ones (runs
//! of spaces or newlines, HTML tags in Gemma) are split out all the same.
//!
//! Finding every occurrence of 6,000 tokens one token at a time (llama.cpp's loop) is slow
//! in long prompts; this finds all occurrences in one pass over a byte trie, then accepts
//! them in llama.cpp's order (token rank, then position) wherever they do not overlap an
//! occurrence accepted before: the same result.

use std::collections::BTreeMap;
use std::ops::Range;

/// A token that text can spell.
#[derive(Debug, Clone)]
pub(crate) struct SpecialText {
    pub id: u32,
    pub text: String,
    /// Left as text when special tokens are not parsed (llama.cpp's control and unknown
    /// tokens); otherwise always split out (user-defined).
    pub control: bool,
}

/// One piece of a text: plain text to tokenize, or a special token it spelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(Range<usize>),
    Token { id: u32, span: Range<usize> },
}

#[derive(Debug, Default, Clone)]
struct Node {
    /// Children by next byte, sorted.
    children: Vec<(u8, u32)>,
    /// The rank of the token ending here.
    rank: Option<u32>,
}

#[derive(Debug, Clone)]
pub(crate) struct SpecialSplitter {
    nodes: Vec<Node>,
    /// By rank: longest text first, ties by id (llama.cpp sorts by length only, in an
    /// unspecified order for ties; two tokens of one length rarely overlap in a text).
    tokens: Vec<SpecialText>,
}

impl SpecialSplitter {
    pub(crate) fn new(mut tokens: Vec<SpecialText>) -> Self {
        tokens.retain(|t| !t.text.is_empty());
        tokens.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        let mut nodes = vec![Node::default()];
        for (rank, token) in tokens.iter().enumerate() {
            let mut at = 0usize;
            for &byte in token.text.as_bytes() {
                at = match nodes[at].children.binary_search_by_key(&byte, |&(b, _)| b) {
                    Ok(i) => nodes[at].children[i].1 as usize,
                    Err(i) => {
                        let next = nodes.len();
                        nodes[at].children.insert(i, (byte, next as u32));
                        nodes.push(Node::default());
                        next
                    }
                };
            }
            // A duplicate text keeps its first (longest-ranked, lowest id) token; llama.cpp
            // would split at the first of the two it happens to try.
            nodes[at].rank.get_or_insert(rank as u32);
        }
        Self { nodes, tokens }
    }

    /// Splits `text` into plain text and special tokens, in order.
    pub(crate) fn split(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let bytes = text.as_bytes();
        // Every occurrence of every token, as (rank, start).
        let mut found: Vec<(u32, usize)> = Vec::new();
        for start in 0..bytes.len() {
            // Token texts are UTF-8, so they start on a character boundary.
            if !text.is_char_boundary(start) {
                continue;
            }
            let mut at = 0usize;
            for &byte in &bytes[start..] {
                let node = &self.nodes[at];
                match node.children.binary_search_by_key(&byte, |&(b, _)| b) {
                    Ok(i) => at = node.children[i].1 as usize,
                    Err(_) => break,
                }
                if let Some(rank) = self.nodes[at].rank {
                    if parse_special || !self.tokens[rank as usize].control {
                        found.push((rank, start));
                    }
                }
            }
        }
        if found.is_empty() {
            return vec![Fragment::Text(0..text.len())];
        }
        found.sort_unstable();
        // Accepted occurrences by start: start → (end, id).
        let mut taken: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        for (rank, start) in found {
            let token = &self.tokens[rank as usize];
            let end = start + token.text.len();
            let clear_before = taken
                .range(..=start)
                .next_back()
                .is_none_or(|(_, &(prev_end, _))| prev_end <= start);
            let clear_after = taken.range(start..end).next().is_none();
            if clear_before && clear_after {
                taken.insert(start, (end, token.id));
            }
        }
        let mut fragments = Vec::with_capacity(2 * taken.len() + 1);
        let mut pos = 0;
        for (start, (end, id)) in taken {
            if pos < start {
                fragments.push(Fragment::Text(pos..start));
            }
            fragments.push(Fragment::Token {
                id,
                span: start..end,
            });
            pos = end;
        }
        if pos < text.len() {
            fragments.push(Fragment::Text(pos..text.len()));
        }
        fragments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splitter(tokens: &[(u32, &str, bool)]) -> SpecialSplitter {
        SpecialSplitter::new(
            tokens
                .iter()
                .map(|&(id, text, control)| SpecialText {
                    id,
                    text: text.to_string(),
                    control,
                })
                .collect(),
        )
    }

    fn show(s: &SpecialSplitter, text: &str, parse_special: bool) -> Vec<String> {
        s.split(text, parse_special)
            .into_iter()
            .map(|f| match f {
                Fragment::Text(r) => text[r].to_string(),
                Fragment::Token { id, .. } => format!("#{id}"),
            })
            .collect()
    }

    #[test]
    fn longest_token_first_not_leftmost() {
        let s = splitter(&[(1, "ab", false), (2, "bcd", false)]);
        assert_eq!(show(&s, "abcd", true), ["a", "#2"]);
        assert_eq!(show(&s, "abxbcd", true), ["#1", "x", "#2"]);
    }

    #[test]
    fn runs_split_greedily_from_the_left() {
        let s = splitter(&[(2, "  ", false), (3, "   ", false)]);
        assert_eq!(show(&s, "a     b", true), ["a", "#3", "#2", "b"]);
        assert_eq!(show(&s, "    ", true), ["#3", " "]);
    }

    #[test]
    fn control_tokens_stay_text_without_parse_special() {
        let s = splitter(&[(5, "<eos>", true), (6, "<b>", false)]);
        assert_eq!(show(&s, "x<eos><b>", true), ["x", "#5", "#6"]);
        assert_eq!(show(&s, "x<eos><b>", false), ["x<eos>", "#6"]);
        assert!(s.split("", true).is_empty());
    }

    #[test]
    fn spans_cover_the_text_in_order() {
        let s = splitter(&[(7, "é", false)]);
        let text = "aébé";
        let frags = s.split(text, true);
        assert_eq!(
            frags,
            [
                Fragment::Text(0..1),
                Fragment::Token { id: 7, span: 1..3 },
                Fragment::Text(3..4),
                Fragment::Token { id: 7, span: 4..6 },
            ]
        );
    }
}
