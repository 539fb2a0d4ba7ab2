//! A vision model's encoder outputs kept by the pixels of the images encoded: a second question
//! about the same image skips the tower even where no KV prefix is shared (another conversation,
//! a different text before the image, a prefix the prompt cache dropped). Bounded in bytes,
//! least recently used out; emptied with the prompt cache.

use mlx_rs::Array;

/// Bytes of encoder outputs a resident keeps.
pub(crate) const IMAGE_FEATURES_BYTES: u64 = 256 << 20;

/// What the encoder gave for a run of images: the features at their tokens, and Qwen3-VL's
/// deepstack rows (empty for other families).
#[derive(Clone)]
pub(crate) struct Encoded {
    pub features: Array,
    pub deepstack: Vec<Array>,
}

impl Encoded {
    fn bytes(&self) -> u64 {
        let arrays = std::iter::once(&self.features).chain(&self.deepstack);
        arrays.map(|a| a.nbytes() as u64).sum()
    }
}

#[derive(Default)]
pub(crate) struct ImageFeatures {
    /// Least recently used first: the digests of the images encoded together, and what the
    /// encoder gave.
    entries: Vec<(Vec<u64>, Encoded)>,
}

impl ImageFeatures {
    /// What the encoder gave for the images with these pixel digests, if kept.
    pub fn get(&mut self, digests: &[u64]) -> Option<Encoded> {
        let i = self.entries.iter().position(|(d, _)| d == digests)?;
        let entry = self.entries.remove(i);
        let encoded = entry.1.clone();
        self.entries.push(entry);
        Some(encoded)
    }

    /// Keeps `encoded` for these digests; the least recently used go past the budget (an
    /// output larger than it is not kept).
    pub fn keep(&mut self, digests: Vec<u64>, encoded: Encoded) {
        if encoded.bytes() > IMAGE_FEATURES_BYTES {
            return;
        }
        self.entries.retain(|(d, _)| *d != digests);
        self.entries.push((digests, encoded));
        let mut total: u64 = self.entries.iter().map(|(_, e)| e.bytes()).sum();
        while total > IMAGE_FEATURES_BYTES {
            total -= self.entries.remove(0).1.bytes();
        }
    }

    /// Bytes of the outputs kept.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|(_, e)| e.bytes()).sum()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }
}
