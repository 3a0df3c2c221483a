//! BPE merges for a SentencePiece vocabulary that only carries scores.
//!
//! SentencePiece BPE repeatedly joins the adjacent pair whose concatenation is the
//! highest-scoring vocabulary piece. A BPE model reproduces that when every split of every
//! piece into two vocabulary pieces is a merge, ranked by the piece's score. This is the
//! construction of Hugging Face's `SentencePieceExtractor` (which produced the reference
//! tokenizers the tests compare against), including its tie order: equal scores keep
//! vocabulary order, and the splits of one piece are ordered by the ids of their parts.

use tokenizers::models::bpe::Vocab;

pub(crate) fn merges_from_scores(
    tokens: &[String],
    scores: &[f32],
    ids: &Vocab,
) -> Vec<(String, String)> {
    let mut merges: Vec<(f32, u32, u32, &str, &str)> = Vec::new();
    for (token, &score) in tokens.iter().zip(scores) {
        let mut local = Vec::new();
        for (split, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(split);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                local.push((score, l, r, left, right));
            }
        }
        local.sort_by_key(|&(_, l, r, _, _)| (l, r));
        merges.extend(local);
    }
    // Stable sort: ties keep the order built above.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_are_ranked_by_the_score_of_their_result() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let ids = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges = merges_from_scores(&tokens, &scores, &ids);
        let names: Vec<String> = merges.iter().map(|(l, r)| format!("{l}+{r}")).collect();
        // "bc" outranks "ab"; "abc" has two splits, ordered by the ids of their parts.
        assert_eq!(names, ["b+c", "a+b", "a+bc", "ab+c"]);
    }
}
