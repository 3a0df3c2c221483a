//! The store's bookkeeping without a model: matching, room, eviction order, waves. Loading
//! into a real cache, and the exactness of what is loaded, are tested on the real model in
//! `shard/tests/prefix_cache.rs`.
#![allow(clippy::unwrap_used)]

use super::*;

const B: usize = BLOCK_TOKENS;

fn rows(start: usize) -> Option<BlockRows> {
    Some(BlockRows {
        kv: KvRows {
            data: vec![start as f32; 4],
            rows: B,
            head_dim: 1,
        },
        hidden: Some(vec![start as f32; B]),
    })
}

/// What a step that does not score its prompt stores: keys and values alone.
fn kv_only(start: usize) -> Option<BlockRows> {
    rows(start).map(|r| BlockRows { hidden: None, ..r })
}

fn scored(tokens: &[u32]) -> Prompt<'_> {
    Prompt {
        tokens,
        scored: true,
    }
}

fn plain(tokens: &[u32]) -> Prompt<'_> {
    Prompt {
        tokens,
        scored: false,
    }
}

/// `blocks` whole blocks of tokens, block i made of token `first + i`.
fn prompt(first: u32, blocks: usize, tail: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..blocks)
        .flat_map(|i| std::iter::repeat_n(first + i as u32, B))
        .collect();
    p.extend(std::iter::repeat_n(7_000, tail));
    p
}

/// One context of 4 blocks with three different 3-token endings.
fn endings() -> [Vec<u32>; 3] {
    let ctx = prompt(1, 4, 0);
    [5, 6, 7].map(|tail| {
        let mut p = ctx.clone();
        p.extend([tail; 3]);
        p
    })
}

#[test]
fn whole_blocks_are_cached_and_matched_exactly() {
    let mut store = PrefixStore::new(true, 1);
    let p = prompt(100, 3, 5);
    assert_eq!(store.store(scored(&p), 1_000, rows), 0);
    assert_eq!(
        store.tokens(),
        3 * B,
        "the 5-token tail is not a whole block"
    );
    assert_eq!(store.cached_prefix(scored(&p)), 3 * B);
    // Same first two blocks, different third: two match.
    let mut q = prompt(100, 2, 0);
    q.extend(prompt(500, 1, 0));
    assert_eq!(store.cached_prefix(scored(&q)), 2 * B);
    // One token differs in the first block: nothing matches.
    let mut r = p.clone();
    r[3] += 1;
    assert_eq!(store.cached_prefix(scored(&r)), 0);
    // Storing q adds only its new block.
    store.store(scored(&q), 1_000, rows);
    assert_eq!(store.tokens(), 4 * B);
}

#[test]
fn the_same_blocks_after_a_different_parent_are_different_blocks() {
    let mut store = PrefixStore::new(true, 1);
    let mut a = prompt(1, 1, 0);
    a.extend(prompt(9, 1, 0));
    store.store(scored(&a), 1_000, rows);
    let mut b = prompt(2, 1, 0);
    b.extend(prompt(9, 1, 0));
    assert_eq!(store.cached_prefix(scored(&b)), 0);
}

#[test]
fn the_store_keeps_to_its_room_evicting_least_recently_used_leaves_first() {
    let mut store = PrefixStore::new(true, 1);
    let a = prompt(100, 2, 0);
    let b = prompt(200, 2, 0);
    store.store(scored(&a), 4 * B, rows);
    store.store(scored(&b), 4 * B, rows);
    assert_eq!(store.tokens(), 4 * B);
    // a is the least recently used; a third prompt needs one block of room.
    let c = prompt(300, 1, 0);
    assert_eq!(store.store(scored(&c), 4 * B, rows), B);
    // a's deeper block left first, so a still matches its first block.
    assert_eq!(store.cached_prefix(scored(&a)), B);
    assert_eq!(store.cached_prefix(scored(&b)), 2 * B);
    assert_eq!(store.cached_prefix(scored(&c)), B);
    // Touching a makes b the oldest.
    store.store(scored(&a), 1_000, |_| None);
    assert_eq!(store.evict_to(2 * B), 2 * B);
    assert_eq!(store.cached_prefix(scored(&b)), 0);
    assert_eq!(store.cached_prefix(scored(&a)), B);
    assert_eq!(store.stats().evicted_tokens, 3 * B as u64);
}

#[test]
fn a_chain_too_long_for_the_room_stops_without_orphans() {
    let mut store = PrefixStore::new(true, 1);
    let long = prompt(1, 5, 0);
    store.store(scored(&long), 3 * B, rows);
    // It does not evict its own blocks to go on: it stops at three, all reachable.
    assert_eq!(store.tokens(), 3 * B);
    assert_eq!(store.cached_prefix(scored(&long)), 3 * B);
}

#[test]
fn no_room_caches_nothing_and_off_caches_nothing() {
    let mut store = PrefixStore::new(true, 1);
    store.store(scored(&prompt(1, 2, 0)), B - 1, rows);
    assert_eq!(store.tokens(), 0);
    let mut off = PrefixStore::new(false, 1);
    off.store(scored(&prompt(1, 2, 0)), 1_000, rows);
    assert_eq!(off.tokens(), 0);
    assert_eq!(off.cached_prefix(scored(&prompt(1, 2, 0))), 0);
}

#[test]
fn requests_sharing_a_prefix_with_an_earlier_one_wait_for_the_second_wave() {
    let store = PrefixStore::new(true, 1);
    let [a, b, c] = endings();
    let other = prompt(50, 4, 2);
    let prompts = vec![scored(&a), scored(&other), scored(&b), scored(&c)];
    let limit = |i: usize| prompts[i].tokens.len() - 1;
    assert_eq!(
        second_wave(&store, &prompts, limit),
        vec![false, false, true, true]
    );
    // Once the store holds the context, nobody waits.
    let mut warm = PrefixStore::new(true, 1);
    warm.store(scored(&a), 1_000, rows);
    assert_eq!(
        second_wave(&warm, &prompts, limit),
        vec![false, false, false, false]
    );
    // Off: one wave.
    let off = PrefixStore::new(false, 1);
    assert_eq!(second_wave(&off, &prompts, limit), vec![false; 4]);
}

#[test]
fn a_request_that_would_gain_less_than_half_a_block_does_not_wait() {
    let store = PrefixStore::new(true, 1);
    let a = prompt(1, 1, 0);
    let b = prompt(1, 1, 0);
    let prompts = vec![scored(&a), scored(&b)];
    // b may load at most 6 of the 16 shared tokens (its prompt is the block itself).
    assert_eq!(second_wave(&store, &prompts, |_| 6), vec![false, false]);
    assert_eq!(second_wave(&store, &prompts, |_| 8), vec![false, true]);
}

#[test]
fn blocks_without_hidden_rows_serve_only_prompts_that_are_not_scored() {
    let mut store = PrefixStore::new(true, 1);
    let p = prompt(100, 3, 0);
    store.store(plain(&p), 1_000, kv_only);
    assert_eq!(store.tokens(), 3 * B);
    assert_eq!(store.cached_prefix(plain(&p)), 3 * B);
    assert_eq!(
        store.cached_prefix(scored(&p)),
        0,
        "a scored prompt needs hidden rows"
    );
    // A scored prompt sharing the first block stores its own second block; its rows give
    // the shared first block the hidden rows it lacked.
    let mut q = prompt(100, 1, 0);
    q.extend(prompt(500, 1, 0));
    store.store(scored(&q), 1_000, rows);
    assert_eq!(store.tokens(), 4 * B);
    assert_eq!(store.cached_prefix(scored(&q)), 2 * B);
    assert_eq!(
        store.cached_prefix(scored(&p)),
        B,
        "p's second block still has none"
    );
    assert_eq!(store.cached_prefix(plain(&p)), 3 * B);
}

#[test]
fn a_scored_prompt_does_not_wait_for_a_plain_one() {
    let store = PrefixStore::new(true, 1);
    let [a, b, c] = endings();
    // b gains nothing from a's blocks (no hidden rows); c, plain, gains from b's.
    let prompts = vec![plain(&a), scored(&b), plain(&c)];
    let limit = |i: usize| prompts[i].tokens.len() - 1;
    assert_eq!(
        second_wave(&store, &prompts, limit),
        vec![false, false, true]
    );
}
