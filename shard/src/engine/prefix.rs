//! The automatic prefix cache: prompt positions an earlier request already computed are
//! copied into a new request's KV cache instead of being computed again.
//!
//! - Prompts are cut into blocks of [`BLOCK_TOKENS`] tokens. A block is keyed by its
//!   tokens and its parent block, so it stands for the whole prefix up to its end; lookups
//!   compare token ids, never hashes alone, so a match is exact.
//! - A block holds what its positions computed: every layer's keys and values, and, when
//!   the request that stored it scored its prompt, each position's final hidden row. The
//!   hidden rows are what keep prompt logprobs exact: a cached position's logits come from
//!   the same row-independent output projection as a computed one's, from the same bits,
//!   so its scores are bit-identical to a cold run. A request without prompt scores
//!   computes the last layer at its last position only (`Model::forward`), so its blocks
//!   hold keys and values alone: a request that scores its prompt loads blocks up to the
//!   first without hidden rows, computes the rest, and gives those blocks its rows.
//!   Every kernel computes a row the same way whatever the other rows of its step (the
//!   batch-invariance tests hold it), so a suffix computed after loaded rows equals the
//!   same positions computed in one pass.
//! - Copy in, copy out: a sequence's cache stays one contiguous reservation, which the
//!   attention kernel reads directly. Copying a cached position costs ~1/1000 of
//!   computing it.
//! - The store lives in the part of the KV budget no running request reserves: admission
//!   evicts before it reserves, so the cache never refuses or delays work.
//! - Eviction is least recently used, leaves first: a lookup touches its whole chain with
//!   one tick, and blocks leave in (tick, deepest first) order, so the block that leaves
//!   never has a child still cached.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use crate::model::{KvRows, SeqCache};

/// Prompt tokens per cached block.
pub const BLOCK_TOKENS: usize = 16;

type BlockId = u64;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BlockKey {
    parent: Option<BlockId>,
    tokens: [u32; BLOCK_TOKENS],
}

struct Block {
    key: BlockKey,
    /// Its index in the chain: it holds positions `depth * BLOCK_TOKENS..`.
    depth: usize,
    kv: KvRows,
    /// `[BLOCK_TOKENS × hidden_size]` final hidden rows, when they were computed.
    hidden: Option<Vec<f32>>,
    used: u64,
}

/// What a block stores: the keys and values of its positions and, when the step computed
/// them, their final hidden rows.
pub struct BlockRows {
    pub kv: KvRows,
    pub hidden: Option<Vec<f32>>,
}

/// A request's prompt as the cache sees it.
#[derive(Debug, Clone, Copy)]
pub struct Prompt<'a> {
    pub tokens: &'a [u32],
    /// The request scores its prompt: it needs the final hidden rows of what it loads,
    /// and its step computes them for every position.
    pub scored: bool,
}

/// A cached prefix loaded into a sequence's cache.
#[derive(Debug, Default)]
pub struct LoadedPrefix {
    pub tokens: usize,
    /// `[tokens × hidden_size]` final hidden rows of those positions, for a scored prompt
    /// (empty otherwise).
    pub hidden: Vec<f32>,
}

/// Running totals, for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt tokens loaded from the cache instead of computed.
    pub hit_tokens: u64,
    pub evicted_tokens: u64,
    /// Tokens cached now.
    pub cached_tokens: u64,
}

pub struct PrefixStore {
    enabled: bool,
    hidden_size: usize,
    blocks: HashMap<BlockId, Block>,
    index: HashMap<BlockKey, BlockId>,
    lru: BTreeSet<(u64, Reverse<usize>, BlockId)>,
    next_id: BlockId,
    clock: u64,
    hit_tokens: u64,
    evicted_tokens: u64,
}

impl PrefixStore {
    pub fn new(enabled: bool, hidden_size: usize) -> Self {
        PrefixStore {
            enabled,
            hidden_size,
            blocks: HashMap::new(),
            index: HashMap::new(),
            lru: BTreeSet::new(),
            next_id: 0,
            clock: 0,
            hit_tokens: 0,
            evicted_tokens: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Turns the cache on or off (off drops what it holds); returns the previous state.
    pub fn set_enabled(&mut self, enabled: bool) -> bool {
        if !enabled {
            self.clear();
        }
        std::mem::replace(&mut self.enabled, enabled)
    }

    /// Tokens cached now.
    pub fn tokens(&self) -> usize {
        self.blocks.len() * BLOCK_TOKENS
    }

    pub fn stats(&self) -> PrefixStats {
        PrefixStats {
            hit_tokens: self.hit_tokens,
            evicted_tokens: self.evicted_tokens,
            cached_tokens: self.tokens() as u64,
        }
    }

    /// Tokens of `prompt`'s longest cached prefix it can load (whole blocks), without
    /// touching it.
    pub fn cached_prefix(&self, prompt: Prompt) -> usize {
        self.chain(prompt).len() * BLOCK_TOKENS
    }

    /// Loads the longest cached prefix of `prompt` it can load, at most `limit` tokens, into
    /// the empty `cache`, with its hidden rows if `prompt` is scored. The last block may be
    /// loaded in part.
    pub fn load(
        &mut self,
        prompt: Prompt,
        limit: usize,
        cache: &mut SeqCache,
    ) -> candle_core::Result<LoadedPrefix> {
        let chain = self.chain(prompt);
        let tick = self.tick();
        let mut loaded = LoadedPrefix::default();
        for id in chain {
            self.touch(id, tick);
            let take = BLOCK_TOKENS.min(limit - loaded.tokens);
            let Some(block) = self.blocks.get(&id) else {
                break;
            };
            if take == 0 {
                continue;
            }
            if prompt.scored {
                // `chain` stops before a block without hidden rows.
                let Some(hidden) = &block.hidden else {
                    break;
                };
                loaded
                    .hidden
                    .extend_from_slice(&hidden[..take * self.hidden_size]);
            }
            cache.append_rows(&block.kv, take)?;
            loaded.tokens += take;
        }
        self.hit_tokens += loaded.tokens as u64;
        Ok(loaded)
    }

    /// Caches the whole blocks of `prompt` not cached yet, keeping the store within `room`
    /// tokens by evicting the least recently used; `rows(start)` copies out the block that
    /// starts at position `start`. A scored prompt also gives its hidden rows to cached
    /// blocks that lack them. Returns the tokens evicted.
    pub fn store(
        &mut self,
        prompt: Prompt,
        room: usize,
        mut rows: impl FnMut(usize) -> Option<BlockRows>,
    ) -> usize {
        if !self.enabled {
            return 0;
        }
        let tick = self.tick();
        let mut evicted = 0;
        let mut parent = None;
        for (depth, tokens) in prompt.tokens.chunks_exact(BLOCK_TOKENS).enumerate() {
            let Ok(tokens) = <[u32; BLOCK_TOKENS]>::try_from(tokens) else {
                break;
            };
            let key = BlockKey { parent, tokens };
            if let Some(&id) = self.index.get(&key) {
                self.touch(id, tick);
                parent = Some(id);
                if prompt.scored {
                    self.add_hidden(id, || rows(depth * BLOCK_TOKENS));
                }
                continue;
            }
            // Room comes from blocks used before this call, never from this chain.
            evicted += self.evict(room.saturating_sub(BLOCK_TOKENS), Some(tick));
            if self.tokens() + BLOCK_TOKENS > room {
                break;
            }
            let Some(BlockRows { kv, hidden }) = rows(depth * BLOCK_TOKENS) else {
                break;
            };
            let id = self.next_id;
            self.next_id += 1;
            self.index.insert(key.clone(), id);
            self.lru.insert((tick, Reverse(depth), id));
            self.blocks.insert(
                id,
                Block {
                    key,
                    depth,
                    kv,
                    hidden,
                    used: tick,
                },
            );
            parent = Some(id);
        }
        evicted
    }

    /// Gives block `id` the hidden rows of `rows()` if it has none: the same positions
    /// after the same prefix, so the same bits as if its first request had computed them.
    fn add_hidden(&mut self, id: BlockId, rows: impl FnOnce() -> Option<BlockRows>) {
        if let Some(block) = self.blocks.get_mut(&id) {
            if block.hidden.is_none() {
                block.hidden = rows().and_then(|r| r.hidden);
            }
        }
    }

    /// Evicts least recently used blocks until at most `max_tokens` are cached; returns
    /// the tokens evicted.
    pub fn evict_to(&mut self, max_tokens: usize) -> usize {
        self.evict(max_tokens, None)
    }

    /// Evicts down to `max_tokens`, sparing blocks last used at tick `spare`.
    fn evict(&mut self, max_tokens: usize, spare: Option<u64>) -> usize {
        let mut evicted = 0;
        while self.tokens() > max_tokens {
            let Some(&oldest) = self.lru.first() else {
                break;
            };
            if Some(oldest.0) == spare {
                break;
            }
            self.lru.remove(&oldest);
            let id = oldest.2;
            if let Some(block) = self.blocks.remove(&id) {
                self.index.remove(&block.key);
                evicted += BLOCK_TOKENS;
            }
        }
        self.evicted_tokens += evicted as u64;
        evicted
    }

    pub fn clear(&mut self) {
        self.blocks.clear();
        self.index.clear();
        self.lru.clear();
    }

    /// The cached blocks that cover `prompt` from its start, outermost first; for a
    /// scored prompt, up to the first without hidden rows.
    fn chain(&self, prompt: Prompt) -> Vec<BlockId> {
        let mut chain = Vec::new();
        if !self.enabled {
            return chain;
        }
        let mut parent = None;
        for tokens in prompt.tokens.chunks_exact(BLOCK_TOKENS) {
            let Ok(tokens) = <[u32; BLOCK_TOKENS]>::try_from(tokens) else {
                break;
            };
            let Some(&id) = self.index.get(&BlockKey { parent, tokens }) else {
                break;
            };
            let usable = self
                .blocks
                .get(&id)
                .is_some_and(|b| !prompt.scored || b.hidden.is_some());
            if !usable {
                break;
            }
            chain.push(id);
            parent = Some(id);
        }
        chain
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn touch(&mut self, id: BlockId, tick: u64) {
        if let Some(block) = self.blocks.get_mut(&id) {
            self.lru.remove(&(block.used, Reverse(block.depth), id));
            block.used = tick;
            self.lru.insert((tick, Reverse(block.depth), id));
        }
    }
}

/// Splits a new batch into two waves: a request waits for the second when an earlier
/// first-wave request of the same batch will store at least half a block more of its
/// prompt than the store holds now, so requests that arrive together (a query scored
/// against many items, one context with many endings) compute their shared prefix once.
/// `limit(i)` is the most of prompt i that may be loaded. A scored prompt gains nothing
/// from a prompt that is not (its blocks have no hidden rows).
pub fn second_wave(
    store: &PrefixStore,
    prompts: &[Prompt],
    limit: impl Fn(usize) -> usize,
) -> Vec<bool> {
    let mut first: Vec<usize> = Vec::new();
    let mut wait = vec![false; prompts.len()];
    if !store.enabled() {
        return wait;
    }
    for (i, prompt) in prompts.iter().enumerate() {
        let cached = store.cached_prefix(*prompt).min(limit(i));
        let shared = first
            .iter()
            .filter(|&&j| prompts[j].scored || !prompt.scored)
            .map(|&j| shared_blocks(prompt.tokens, prompts[j].tokens) * BLOCK_TOKENS)
            .max()
            .unwrap_or(0)
            .min(limit(i));
        if 2 * shared.saturating_sub(cached) >= BLOCK_TOKENS {
            wait[i] = true;
        } else {
            first.push(i);
        }
    }
    wait
}

/// Whole blocks `a` and `b` have in common from their start.
fn shared_blocks(a: &[u32], b: &[u32]) -> usize {
    a.chunks_exact(BLOCK_TOKENS)
        .zip(b.chunks_exact(BLOCK_TOKENS))
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;
