//! The one order every ranking uses, and the selections built on it.

use std::cmp::Ordering;

use super::Scratch;

/// Orders `(id, value)` pairs best first: greater value first, equal values by smaller id.
///
/// Greedy choice, top-N, rank, top-k and top-p must agree on ties or the reported scores
/// would contradict the chosen token, so they all go through this one order. It is total
/// and never panics: NaN ranks below every number, -inf included (a broken logit is never
/// chosen or reported as a top alternative), and NaNs tie among themselves. Unlike
/// `f32::total_cmp`, -0.0 and +0.0 are equal, matching the numeric "strictly greater" of
/// the rank definition.
#[inline]
pub fn best_first(a_id: u32, a: f32, b_id: u32, b: f32) -> Ordering {
    let by_value = match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        // Neither is NaN, so partial_cmp always answers.
        (false, false) => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
    };
    by_value.then(a_id.cmp(&b_id))
}

/// Packs `(id, value)` into a u64 whose descending order is exactly [`best_first`]'s.
///
/// Selection and sorting over 49k entries then compare plain integers instead of
/// chasing ids into the row and branching on NaN, several times faster. The high half
/// maps the float's bits to an unsigned key that grows with the value (NaN lowest, both
/// zeros alike); the low half is the id inverted, so that among equal values the smaller
/// id has the greater key.
#[inline]
pub(crate) fn sort_key(id: u32, x: f32) -> u64 {
    let v = if x.is_nan() {
        0
    } else if x == 0.0 {
        0x8000_0000
    } else {
        let bits = x.to_bits();
        if bits >> 31 == 1 {
            !bits
        } else {
            bits | 0x8000_0000
        }
    };
    (u64::from(v) << 32) | u64::from(u32::MAX - id)
}

/// The id packed by [`sort_key`].
#[inline]
pub(crate) fn key_id(key: u64) -> u32 {
    u32::MAX - key as u32
}

/// Replaces `keys` with the [`sort_key`]s of `values`.
pub(crate) fn fill_keys(keys: &mut Vec<u64>, values: &[f32]) {
    keys.clear();
    keys.extend(
        values
            .iter()
            .enumerate()
            .map(|(id, &x)| sort_key(id as u32, x)),
    );
}

/// Descending order of keys: best first.
#[inline]
pub(crate) fn key_desc(a: &u64, b: &u64) -> Ordering {
    b.cmp(a)
}

/// The best token of a row (ties to the smaller id); `None` only for an empty row.
pub fn argmax(values: &[f32]) -> Option<u32> {
    let (&first, rest) = values.split_first()?;
    let (mut best_id, mut best) = (0, first);
    for (i, &x) in rest.iter().enumerate() {
        // Strictly greater, so ties keep the earlier (smaller) id; a NaN best yields to
        // any number.
        if x > best || (best.is_nan() && !x.is_nan()) {
            best_id = i + 1;
            best = x;
        }
    }
    Some(best_id as u32)
}

/// 1-based rank of `id` in `values`: 1 + the tokens with a strictly greater value + the
/// tokens with an equal value and a smaller id, in [`best_first`]'s order. `None` when
/// `id` is outside the row.
///
/// A counting pass, O(V), rather than a sort: only one token's rank is wanted.
pub fn rank(values: &[f32], id: u32) -> Option<u32> {
    let v = *values.get(id as usize)?;
    let (before, _) = values.split_at(id as usize);
    let better = if v.is_nan() {
        values.iter().filter(|x| !x.is_nan()).count() + before.iter().filter(|x| x.is_nan()).count()
    } else {
        // Comparisons with NaN are false, so NaNs never count.
        values.iter().filter(|&&x| x > v).count() + before.iter().filter(|&&x| x == v).count()
    };
    Some(better as u32 + 1)
}

/// The `n` best `(id, value)` pairs, best first (ties to the smaller id); all of them when
/// the row is shorter than `n`.
///
/// Exactly `n` entries even when values tie across the n-th place: the selection is by the
/// total order, not by a value threshold. Partial selection then a sort of the head costs
/// O(V) + O(n log n), against O(V log V) for sorting a 49k vocabulary every step.
pub fn top_n(values: &[f32], n: usize, scratch: &mut Scratch) -> Vec<(u32, f32)> {
    top_n_keys(values, n, &mut scratch.keys)
}

pub(crate) fn top_n_keys(values: &[f32], n: usize, keys: &mut Vec<u64>) -> Vec<(u32, f32)> {
    let n = n.min(values.len());
    if n == 0 {
        return Vec::new();
    }
    fill_keys(keys, values);
    if n < keys.len() {
        keys.select_nth_unstable_by(n - 1, key_desc);
    }
    let head = &mut keys[..n];
    head.sort_unstable_by(key_desc);
    head.iter()
        .map(|&k| {
            let id = key_id(k);
            (id, values[id as usize])
        })
        .collect()
}

/// Hands `items` to `visit` in the order `cmp`, sorting only as far as `visit` reads;
/// stops when `visit` returns false. Returns how many items were visited: on return
/// `items[..visited]` are the visited ones, in order.
///
/// Nucleus and typical sampling usually stop after a few dozen tokens; sorting the whole
/// vocabulary for them every step would dominate the step. The items are sorted in chunks
/// that double in size (select the next chunk, then sort it), so an early stop costs O(V)
/// and a walk over everything still costs O(V log V).
pub(crate) fn walk_sorted<T, C, F>(items: &mut [T], cmp: C, mut visit: F) -> usize
where
    T: Copy,
    C: Fn(&T, &T) -> Ordering,
    F: FnMut(T) -> bool,
{
    let mut start = 0;
    let mut chunk = 64;
    while start < items.len() {
        let rest = &mut items[start..];
        let take = chunk.min(rest.len());
        if take < rest.len() {
            rest.select_nth_unstable_by(take - 1, &cmp);
        }
        let head = &mut rest[..take];
        head.sort_unstable_by(&cmp);
        for (i, &item) in head.iter().enumerate() {
            if !visit(item) {
                return start + i;
            }
        }
        start += take;
        chunk *= 2;
    }
    start
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::test_util::logits;

    /// Reference: sort every (id, value) pair, by a comparator written out longhand.
    fn full_sort(values: &[f32]) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v))
            .collect();
        all.sort_by(|a, b| {
            let key = |v: f32| {
                if v.is_nan() {
                    f64::NEG_INFINITY
                } else {
                    f64::from(v)
                }
            };
            match key(b.1).partial_cmp(&key(a.1)).unwrap() {
                Ordering::Equal => {
                    // NaN below -inf.
                    (a.1.is_nan(), a.0).cmp(&(b.1.is_nan(), b.0))
                }
                o => o,
            }
        });
        all
    }

    #[test]
    fn top_n_is_exactly_n_with_ties_across_the_boundary() {
        // Three tokens tie at the top; a "keep everything >= the 2nd value" threshold would
        // return three, and an unstable sort could put id 4 before id 2.
        let v = [1.0, 3.0, 3.0, 2.0, 3.0];
        let mut ids = Scratch::new();
        assert_eq!(top_n(&v, 2, &mut ids), vec![(1, 3.0), (2, 3.0)]);
        assert_eq!(top_n(&v, 3, &mut ids), vec![(1, 3.0), (2, 3.0), (4, 3.0)]);
        assert_eq!(
            top_n(&v, 4, &mut ids),
            vec![(1, 3.0), (2, 3.0), (4, 3.0), (3, 2.0)]
        );
        assert_eq!(top_n(&v, 0, &mut ids), vec![]);
        // Longer than the row: the whole row, sorted.
        assert_eq!(top_n(&v, 9, &mut ids).len(), 5);
    }

    #[test]
    fn top_n_matches_a_full_sort() {
        let mut ids = Scratch::new();
        for seed in 0..4 {
            // Coarse rounding gives many ties.
            let mut v = logits(seed, 5000, 8.0, 0.25);
            v[17] = f32::NAN;
            v[18] = f32::NEG_INFINITY;
            v[19] = -0.0;
            v[20] = 0.0;
            let reference = full_sort(&v);
            for n in [1, 2, 7, 64, 100, 4999, 5000] {
                let got = top_n(&v, n, &mut ids);
                assert_eq!(got.len(), n);
                let want: Vec<(u32, f32)> = reference[..n].to_vec();
                assert_eq!(
                    got.iter().map(|p| p.0).collect::<Vec<_>>(),
                    want.iter().map(|p| p.0).collect::<Vec<_>>(),
                    "seed {seed} n {n}"
                );
            }
        }
    }

    #[test]
    fn nan_ranks_last_and_signed_zeros_tie() {
        let v = [f32::NAN, f32::NEG_INFINITY, 0.0, -0.0];
        let mut ids = Scratch::new();
        let got: Vec<u32> = top_n(&v, 4, &mut ids).iter().map(|p| p.0).collect();
        assert_eq!(got, vec![2, 3, 1, 0]);
        assert_eq!(argmax(&[f32::NAN, -1.0]), Some(1));
        assert_eq!(argmax(&[-0.0, 0.0]), Some(0));
        assert_eq!(argmax(&[f32::NAN, f32::NAN, f32::NEG_INFINITY]), Some(2));
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), Some(0));
        assert_eq!(argmax(&[f32::NEG_INFINITY, 2.0, f32::NAN, 2.0]), Some(1));
    }

    #[test]
    fn sort_keys_order_exactly_like_best_first() {
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::NEG_INFINITY,
            f32::MIN,
            -1.5,
            -f32::MIN_POSITIVE,
            -1e-45,
            -0.0,
            0.0,
            1e-45,
            f32::MIN_POSITIVE,
            1.5,
            f32::MAX,
            f32::INFINITY,
        ];
        for (i, &a) in specials.iter().enumerate() {
            for (j, &b) in specials.iter().enumerate() {
                for (ia, ib) in [(3u32, 5u32), (5, 3), (4, 4), (0, u32::MAX)] {
                    let want = best_first(ia, a, ib, b);
                    let got = key_desc(&sort_key(ia, a), &sort_key(ib, b));
                    assert_eq!(got, want, "{i}:{a} id {ia} vs {j}:{b} id {ib}");
                }
            }
            assert_eq!(key_id(sort_key(17, a)), 17);
        }
    }

    #[test]
    fn rank_counts_greater_values_then_smaller_ids_among_equals() {
        let v = [2.0, 5.0, 5.0, 1.0, 5.0];
        assert_eq!(rank(&v, 1), Some(1));
        assert_eq!(rank(&v, 2), Some(2));
        assert_eq!(rank(&v, 4), Some(3));
        assert_eq!(rank(&v, 0), Some(4));
        assert_eq!(rank(&v, 3), Some(5));
        assert_eq!(rank(&v, 5), None);
        // NaN is below everything; NaNs tie among themselves.
        let v = [f32::NAN, 1.0, f32::NEG_INFINITY, f32::NAN, -0.0, 0.0];
        assert_eq!(rank(&v, 1), Some(1));
        assert_eq!(rank(&v, 4), Some(2));
        assert_eq!(rank(&v, 5), Some(3));
        assert_eq!(rank(&v, 2), Some(4));
        assert_eq!(rank(&v, 0), Some(5));
        assert_eq!(rank(&v, 3), Some(6));
        // Rank agrees with the top-N order.
        let w = logits(7, 3000, 4.0, 0.5);
        let mut ids = Scratch::new();
        for (pos, (id, _)) in top_n(&w, 3000, &mut ids).into_iter().enumerate() {
            assert_eq!(rank(&w, id), Some(pos as u32 + 1));
        }
    }

    #[test]
    fn argmax_ties_to_smaller_id() {
        assert_eq!(argmax(&[1.0, 4.0, 2.0, 4.0]), Some(1));
        assert_eq!(argmax(&[]), None);
        let w = logits(3, 2000, 4.0, 0.5);
        assert_eq!(argmax(&w), Some(full_sort(&w)[0].0));
    }

    #[test]
    fn walk_sorted_visits_in_order_and_stops() {
        let v = logits(11, 3000, 4.0, 0.125);
        let reference: Vec<u32> = full_sort(&v).iter().map(|p| p.0).collect();

        let mut keys = Vec::new();
        fill_keys(&mut keys, &v);
        let mut seen = Vec::new();
        let n = walk_sorted(&mut keys, key_desc, |key| {
            seen.push(key_id(key));
            true
        });
        assert_eq!(n, v.len());
        assert_eq!(seen, reference);

        for stop in [1, 50, 64, 65, 200, 2999] {
            fill_keys(&mut keys, &v);
            let mut seen = Vec::new();
            let n = walk_sorted(&mut keys, key_desc, |key| {
                if seen.len() == stop {
                    return false;
                }
                seen.push(key_id(key));
                true
            });
            assert_eq!(n, stop);
            assert_eq!(seen, reference[..stop]);
            let prefix: Vec<u32> = keys[..stop].iter().map(|&k| key_id(k)).collect();
            assert_eq!(prefix, reference[..stop]);
        }
    }
}
