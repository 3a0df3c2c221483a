//! Rotary position embedding of a ragged batch: every token is rotated by its own
//! position, with the frequencies of its layer's [`RopeSpec`].
//!
//! Angles are computed in f64 (`position * inv_freq`) and rounded once to f32 cos/sin,
//! for the step's positions only, so long contexts keep their precision and no table of
//! the whole context is held.

use candle_core::{Device, Result, Tensor};

use super::spec::{RopeSpec, RopeStyle};

/// One resolved rotary embedding.
pub struct Rope {
    style: RopeStyle,
    /// Rotated dimensions per head; the rest pass through.
    dims: usize,
    inv_freq: Vec<f64>,
}

/// cos/sin of one step's positions, shaped `[tokens, 1, dims / 2]` for candle's kernels.
pub struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    pub fn new(spec: &RopeSpec) -> std::result::Result<Self, String> {
        Ok(Rope {
            style: spec.style,
            dims: spec.dims,
            inv_freq: spec.inv_freq()?,
        })
    }

    pub fn tables(&self, positions: &[usize], device: &Device) -> Result<RopeTables> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for f in &self.inv_freq {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let n = positions.len();
        Ok(RopeTables {
            cos: Tensor::from_vec(cos, (n, 1, half), device)?,
            sin: Tensor::from_vec(sin, (n, 1, half), device)?,
        })
    }

    /// `xs`: `[tokens, heads, head_dim]`, token `i` rotated by row `i` of `tables`.
    pub fn apply(&self, xs: &Tensor, tables: &RopeTables) -> Result<Tensor> {
        let (n, heads, head_dim) = xs.dims3()?;
        let rotated = if self.dims == head_dim {
            xs.clone()
        } else {
            xs.narrow(2, 0, self.dims)?.contiguous()?
        };
        // Each token is its own "batch" entry of candle's rope kernels, which take
        // per-batch tables: one op rotates a ragged batch at arbitrary positions.
        let rotated = rotated.reshape((n, heads, 1, self.dims))?;
        let rotated = match self.style {
            RopeStyle::Interleaved => {
                candle_nn::rotary_emb::rope_i(&rotated, &tables.cos, &tables.sin)?
            }
            RopeStyle::Half => candle_nn::rotary_emb::rope(&rotated, &tables.cos, &tables.sin)?,
        }
        .reshape((n, heads, self.dims))?;
        if self.dims == head_dim {
            return Ok(rotated);
        }
        let kept = xs.narrow(2, self.dims, head_dim - self.dims)?;
        Tensor::cat(&[&rotated, &kept], 2)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A direct f64 rotation of one head, for comparison.
    fn rotate(x: &[f32], pos: usize, rope: &Rope) -> Vec<f64> {
        let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let half = rope.dims / 2;
        for (i, f) in rope.inv_freq.iter().enumerate() {
            let (a, b) = match rope.style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Half => (i, i + half),
            };
            let (c, s) = ((pos as f64 * f).cos(), (pos as f64 * f).sin());
            let (xa, xb) = (f64::from(x[a]), f64::from(x[b]));
            out[a] = xa * c - xb * s;
            out[b] = xb * c + xa * s;
        }
        out
    }

    #[test]
    fn partial_and_full_rotation_match_the_definition() {
        for style in [RopeStyle::Interleaved, RopeStyle::Half] {
            for dims in [8, 4] {
                let rope = Rope::new(&RopeSpec::plain(style, dims, 10_000.0)).unwrap();
                let x: Vec<f32> = (0..2 * 8).map(|i| (i as f32 * 0.37).sin()).collect();
                let xs = Tensor::from_vec(x.clone(), (2, 1, 8), &Device::Cpu).unwrap();
                let positions = [3, 1000];
                let tables = rope.tables(&positions, &Device::Cpu).unwrap();
                let ys = rope.apply(&xs, &tables).unwrap().flatten_all().unwrap();
                let ys = ys.to_vec1::<f32>().unwrap();
                for (t, &pos) in positions.iter().enumerate() {
                    let want = rotate(&x[t * 8..(t + 1) * 8], pos, &rope);
                    for (got, want) in ys[t * 8..(t + 1) * 8].iter().zip(&want) {
                        assert!((f64::from(*got) - want).abs() < 1e-6, "{style:?} {dims}");
                    }
                }
            }
        }
    }
}
