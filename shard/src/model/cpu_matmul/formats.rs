//! The formats served: which tile type holds which `GgmlDType`, and the one `match` that
//! sends each operation to the code of its format.

use candle_core::quantized::GgmlDType;

use super::blocks::{
    tiles, Bf16, Tile, TileColumns, Wide, F16, F32, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0,
    TILE,
};
use super::input::Rows;
use super::kernel::{self, Isa};
use super::tasks::{run_task, Task};

/// A matrix's tiles, one variant per format.
#[derive(Clone)]
pub(super) enum Tiles {
    Q4_0(Vec<Q4_0>),
    Q4_1(Vec<Q4_1>),
    Q5_0(Vec<Q5_0>),
    Q5_1(Vec<Q5_1>),
    Q8_0(Vec<Q8_0>),
    Q4K(Vec<Q4K>),
    Q5K(Vec<Q5K>),
    Q6K(Vec<Q6K>),
    F32(Vec<F32>),
    F16(Vec<F16>),
    Bf16(Vec<Bf16>),
    /// A wide copy of the 4- and 5-bit legacy formats (`blocks::wide`).
    WideQ4_0(Vec<Wide<Q4_0>>),
    WideQ4_1(Vec<Wide<Q4_1>>),
    WideQ5_0(Vec<Wide<Q5_0>>),
    WideQ5_1(Vec<Wide<Q5_1>>),
}

/// `$body` with `$t` bound to the tiles of whichever format `$tiles` holds, and the type
/// `$T` to its tile type.
macro_rules! each {
    ($tiles:expr, $t:ident: $T:ident => $body:expr) => {
        match $tiles {
            Tiles::Q4_0($t) => {
                type $T = Q4_0;
                $body
            }
            Tiles::Q4_1($t) => {
                type $T = Q4_1;
                $body
            }
            Tiles::Q5_0($t) => {
                type $T = Q5_0;
                $body
            }
            Tiles::Q5_1($t) => {
                type $T = Q5_1;
                $body
            }
            Tiles::Q8_0($t) => {
                type $T = Q8_0;
                $body
            }
            Tiles::Q4K($t) => {
                type $T = Q4K;
                $body
            }
            Tiles::Q5K($t) => {
                type $T = Q5K;
                $body
            }
            Tiles::Q6K($t) => {
                type $T = Q6K;
                $body
            }
            Tiles::F32($t) => {
                type $T = F32;
                $body
            }
            Tiles::F16($t) => {
                type $T = F16;
                $body
            }
            Tiles::Bf16($t) => {
                type $T = Bf16;
                $body
            }
            Tiles::WideQ4_0($t) => {
                type $T = Wide<Q4_0>;
                $body
            }
            Tiles::WideQ4_1($t) => {
                type $T = Wide<Q4_1>;
                $body
            }
            Tiles::WideQ5_0($t) => {
                type $T = Wide<Q5_0>;
                $body
            }
            Tiles::WideQ5_1($t) => {
                type $T = Wide<Q5_1>;
                $body
            }
        }
    };
}

pub(super) fn supports(dtype: GgmlDType) -> bool {
    use GgmlDType as D;
    matches!(
        dtype,
        D::Q4_0
            | D::Q4_1
            | D::Q5_0
            | D::Q5_1
            | D::Q8_0
            | D::Q4K
            | D::Q5K
            | D::Q6K
            | D::F32
            | D::F16
            | D::BF16
    )
}

/// The tiles of `n` rows of `k` inputs stored as `data` in `T`'s blocks; `None` unless
/// `k` is a positive multiple of the block and `data` the right length.
fn build<T: Tile>(data: &[u8], n: usize, k: usize) -> Option<Vec<T>> {
    if k == 0 || !k.is_multiple_of(T::INPUTS) {
        return None;
    }
    tiles(data, n, k / T::INPUTS)
}

impl Tiles {
    /// The tiles of an `[n, k]` matrix of `dtype` stored (GGUF / candle layout) as `data`.
    pub(super) fn new(dtype: GgmlDType, data: &[u8], n: usize, k: usize) -> Option<Self> {
        use GgmlDType as D;
        Some(match dtype {
            D::Q4_0 => Tiles::Q4_0(build(data, n, k)?),
            D::Q4_1 => Tiles::Q4_1(build(data, n, k)?),
            D::Q5_0 => Tiles::Q5_0(build(data, n, k)?),
            D::Q5_1 => Tiles::Q5_1(build(data, n, k)?),
            D::Q8_0 => Tiles::Q8_0(build(data, n, k)?),
            D::Q4K => Tiles::Q4K(build(data, n, k)?),
            D::Q5K => Tiles::Q5K(build(data, n, k)?),
            D::Q6K => Tiles::Q6K(build(data, n, k)?),
            D::F32 => Tiles::F32(build(data, n, k)?),
            D::F16 => Tiles::F16(build(data, n, k)?),
            D::BF16 => Tiles::Bf16(build(data, n, k)?),
            _ => return None,
        })
    }

    /// The wide copy of these tiles (`blocks::wide`), for the formats that have one.
    pub(super) fn widened(&self) -> Option<Self> {
        fn wide<T: Tile>(tiles: &[T]) -> Vec<Wide<T>> {
            tiles.iter().map(Wide::of).collect()
        }
        Some(match self {
            Tiles::Q4_0(t) => Tiles::WideQ4_0(wide(t)),
            Tiles::Q4_1(t) => Tiles::WideQ4_1(wide(t)),
            Tiles::Q5_0(t) => Tiles::WideQ5_0(wide(t)),
            Tiles::Q5_1(t) => Tiles::WideQ5_1(wide(t)),
            _ => return None,
        })
    }

    /// Bytes [`Tiles::widened`] would take; 0 for formats without a wide copy.
    pub(super) fn widened_bytes(&self) -> usize {
        // Every `Wide` tile is the same size, whichever format it came from.
        let bytes = |tiles: usize| tiles * std::mem::size_of::<Wide<Q4_0>>();
        match self {
            Tiles::Q4_0(t) => bytes(t.len()),
            Tiles::Q4_1(t) => bytes(t.len()),
            Tiles::Q5_0(t) => bytes(t.len()),
            Tiles::Q5_1(t) => bytes(t.len()),
            _ => 0,
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Tiles::Q4_0(_) | Tiles::WideQ4_0(_) => "q4_0",
            Tiles::Q4_1(_) | Tiles::WideQ4_1(_) => "q4_1",
            Tiles::Q5_0(_) | Tiles::WideQ5_0(_) => "q5_0",
            Tiles::Q5_1(_) | Tiles::WideQ5_1(_) => "q5_1",
            Tiles::Q8_0(_) => "q8_0",
            Tiles::Q4K(_) => "q4_k",
            Tiles::Q5K(_) => "q5_k",
            Tiles::Q6K(_) => "q6_k",
            Tiles::F32(_) => "f32",
            Tiles::F16(_) => "f16",
            Tiles::Bf16(_) => "bf16",
        }
    }

    /// Runs one column task of a product with input rows `x` (see [`run_task`]).
    pub(super) fn run(&self, x: Rows, task: Task, isa: Isa) {
        each!(self, t: T => run_task(TileColumns::all(t, x.k / T::INPUTS), x, task, isa))
    }

    /// Whether the format's weights have an offset, so its products need the run sums.
    pub(super) fn has_offset(&self) -> bool {
        each!(self, _t: T => T::OFFSET)
    }

    /// Weight row `i` into `out` (`k` values), with the kernel variant `isa`.
    pub(super) fn row(&self, i: usize, out: &mut [f32], isa: Isa) {
        each!(self, t: T => {
            let m = TileColumns::all(t, out.len() / T::INPUTS);
            kernel::row(m.group(i / TILE, 1), i % TILE, out, isa)
        })
    }

    /// The offsets `b` of weight row `i`'s inputs (see `blocks::row_offsets`).
    #[cfg(test)]
    pub(super) fn row_offsets(&self, i: usize, out: &mut [f32]) {
        use super::simd::Portable;
        each!(self, t: T => {
            let m = TileColumns::all(t, out.len() / T::INPUTS);
            super::blocks::row_offsets(Portable, m.group(i / TILE, 1), i % TILE, out)
        })
    }
}
