//! The next tile columns asked for from memory while the row groups work on these.
//!
//! A model's weights do not stay in cache from one decode step to the next, so each step's
//! products read them from memory. The kernel reads a group of tile columns side by side
//! (one stream of tiles each, every few tiles into a new 4 KiB page, where the hardware
//! prefetcher's streams stop), and with several rows it left the kernel waiting: 16 rows
//! against Gemma 3's 178 MB output layer ran at about four fifths of the speed of the same
//! format's matrices that stay in cache. Now each row group, tile by tile as it goes,
//! prefetches its share of the next group of tile columns: of `n` row groups, group `i`
//! takes tiles `i, i + n, …` of each next column, so the loads spread over all the groups'
//! passes and the tiles are in cache when the next columns start.
//!
//! With and without, alternated 15 times in one process, on one thread and on two
//! (SmolLM2's and Gemma 3's shapes): a 120 MB Q8_0 matrix 1.30–1.40× at 2 rows, 1.47–1.50×
//! at 8, 1.27–1.29× at 16, 1.02–1.05× at 96. Matrices that stay in the L3 cache between
//! calls (21–28 MB): Q4_1 and Q8_0 mostly 0.94–1.09× at 2–96 rows, Q4_K and Q6_K lose
//! 13–15% at 2 rows and 0–3% at 16 and 96. The shard's decode, alternated with the build
//! before: SmolLM2 1.06× at 1 stream and 1.13× at 4 and 16 (medians), Gemma 3 1.05–1.34×
//! (`docs/performance-log.md`). A single row asks for nothing: its kernel streams at the
//! memory's speed already, and prefetching cost it 18% on SmolLM2's output layer.
//!
//! Speed only: a prefetch reads nothing into the computation.

use super::super::blocks::{Tile, TileColumns};

/// Tile columns to prefetch: the ones after those a sweep works on.
#[derive(Clone, Copy)]
pub(super) struct Next<'a, T> {
    /// Their tiles, column after column (`nb` each); empty for none.
    tiles: &'a [T],
    nb: usize,
}

impl<'a, T: Tile> Next<'a, T> {
    /// Nothing to prefetch.
    #[inline(always)]
    pub fn none() -> Self {
        Next { tiles: &[], nb: 1 }
    }

    /// The `count` tile columns of `m` after `g .. g + count` (fewer at its end).
    #[inline(always)]
    pub fn after(m: TileColumns<'a, T>, g: usize, count: usize) -> Self {
        let from = (g + count).min(m.groups());
        let to = (from + count).min(m.groups());
        Next {
            tiles: m.group(from, to - from),
            nb: m.nb,
        }
    }

    /// Row group `who`'s share (none for a single row: see the module docs).
    #[inline(always)]
    pub fn share(self, who: RowGroup) -> Ahead<'a, T> {
        let next = if who.rows < 2 { Self::none() } else { self };
        Ahead {
            next,
            due: who.group,
            shares: who.groups.max(1),
        }
    }
}

/// Which row group of a piece is asking: `group` of `groups`, `rows` rows each.
#[derive(Clone, Copy)]
pub(super) struct RowGroup {
    pub rows: usize,
    pub group: usize,
    pub groups: usize,
}

/// One row group's share of [`Next`]: tile `due` of each column, then every
/// `shares`-th after it.
pub(super) struct Ahead<'a, T> {
    next: Next<'a, T>,
    due: usize,
    shares: usize,
}

impl<T: Tile> Ahead<'_, T> {
    /// Called with each tile index `b` in order: prefetches tile `b` of every next
    /// column, if it is this group's.
    #[inline(always)]
    pub fn step(&mut self, b: usize) {
        if b != self.due {
            return;
        }
        self.due += self.shares;
        for tile in self.next.tiles.iter().skip(b).step_by(self.next.nb) {
            prefetch(tile);
        }
    }
}

/// Asks for every cache line of `t` to be brought into L1.
#[inline(always)]
pub(super) fn prefetch<T>(t: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = std::ptr::from_ref(t).cast::<i8>();
        for line in (0..size_of::<T>()).step_by(64) {
            // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has; the address is
            // inside `t`, and a prefetch neither reads into the program nor faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(line)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = t;
}
