//! What a layer's cache holds as it grows: priced from a cache with at least one position
//! written, for `load` to fit the context to memory and `generate` to admit what fits
//! (`runtime/footprint.rs`).

use mlx_rs::Array;

use super::{cache::KvCache, standard::STEP};

/// The bytes of one layer's cache as a function of the positions written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheSize {
    /// Bytes that do not grow (a recurrent state, a convolution window).
    pub fixed: u64,
    /// Bytes per position of storage (keys and values, with their quantization scales).
    pub per_position: u64,
    /// Most positions the storage keeps between passes (a sliding window, an attention
    /// chunk); `None`: all. Right after a pass it holds `cap - 1` and the pass's positions.
    pub cap: Option<u64>,
    /// Bytes per position of the last pass held until the next: a convolution window is a
    /// view of the pass's convolution input, which MLX keeps whole while the view lives.
    pub per_pass_position: u64,
}

impl CacheSize {
    /// Bytes held right after a pass of `pass` positions brought it to `positions`: storage
    /// grows in steps of 256 positions, as the caches grow it, up to the cap.
    pub fn bytes_at(&self, positions: u64, pass: u64) -> u64 {
        let step = STEP as u64;
        let stored = positions.div_ceil(step) * step;
        let stored = self.cap.map_or(stored, |cap| stored.min(cap - 1 + pass));
        self.fixed + self.per_position * stored + self.per_pass_position * pass
    }
}

impl KvCache {
    /// This cache's size as it grows; it must hold at least one position (else it prices as
    /// empty: a layer that keeps nothing of its own, such as one reading another's keys).
    pub fn size(&self) -> CacheSize {
        let growing = |arrays: &mut dyn Iterator<Item = &Array>, cap: Option<i32>| {
            let mut size = CacheSize {
                cap: cap.map(|c| c as u64),
                ..CacheSize::default()
            };
            for a in arrays {
                // Storage is (B, heads, positions, features): positions on axis 2.
                match a.ndim() >= 3 && a.dim(2) > 0 {
                    true => size.per_position += a.nbytes() as u64 / a.dim(2) as u64,
                    false => size.fixed += a.nbytes() as u64,
                }
            }
            size
        };
        match self {
            Self::Standard(c) => growing(&mut c.arrays(), None),
            Self::Quantized(c) => growing(&mut c.arrays(), None),
            Self::Rotating(c) => growing(&mut c.arrays(), Some(c.window())),
            Self::Chunked(c) => growing(&mut c.arrays(), Some(c.chunk())),
            Self::State(c) => CacheSize {
                fixed: c.arrays().map(|a| a.nbytes() as u64).sum(),
                // (B, kernel - 1, channels): per position, one row of channels.
                per_pass_position: (c.conv.as_ref())
                    .filter(|a| a.ndim() == 3 && a.dim(1) > 0)
                    .map_or(0, |a| a.nbytes() as u64 / a.dim(1) as u64),
                ..CacheSize::default()
            },
            Self::Pair(p) => {
                let [a, b] = [p[0].size(), p[1].size()];
                CacheSize {
                    fixed: a.fixed + b.fixed,
                    per_position: a.per_position + b.per_position,
                    // Capped only where both are.
                    cap: a.cap.zip(b.cap).map(|(a, b)| a.max(b)),
                    per_pass_position: a.per_pass_position + b.per_pass_position,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CacheSize;

    #[test]
    fn storage_grows_in_steps_up_to_the_cap() {
        let full = CacheSize {
            per_position: 10,
            ..CacheSize::default()
        };
        assert_eq!(full.bytes_at(1, 1), 2560);
        assert_eq!(full.bytes_at(256, 1), 2560);
        assert_eq!(full.bytes_at(257, 1), 5120);
        // A window of 300 right after a 512-position pass: 299 kept and the pass.
        let window = CacheSize {
            cap: Some(300),
            ..full
        };
        assert_eq!(window.bytes_at(1000, 1), 3000);
        assert_eq!(window.bytes_at(1000, 512), 8110);
        let state = CacheSize {
            fixed: 7,
            per_pass_position: 3,
            ..CacheSize::default()
        };
        assert_eq!(state.bytes_at(100_000, 1), 10);
        assert_eq!(state.bytes_at(100_000, 512), 1543);
    }
}
