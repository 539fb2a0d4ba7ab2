//! A cache set's recurrent states at one position, kept so that a later prompt sharing only a
//! prefix with it can resume there: a recurrent state summarises every position it has seen and
//! cannot be cut back ([`StateCache`]), but the other layers' caches can, and with the states as
//! they were at that position the whole set is as if it had stopped there.

use mlx_rs::Array;

use super::{cache::KvCache, state::StateCache};
use crate::layers::array::Result;

/// The recurrent states of a cache set after `positions`.
#[derive(Clone)]
pub struct Snapshot {
    pub positions: usize,
    pub(super) layers: Vec<Saved>,
}

/// What is kept of one layer's cache.
#[derive(Clone)]
pub(super) enum Saved {
    /// Nothing: the cache is cut back instead.
    Cut,
    State(StateCache),
    /// A layer with two caches (Falcon-H1's attention beside its Mamba state).
    Pair(Box<[Saved; 2]>),
}

impl Saved {
    fn of(cache: &KvCache) -> Result<Self> {
        Ok(match cache {
            KvCache::State(s) => Saved::State(s.detached()?),
            KvCache::Pair(p) => Saved::Pair(Box::new([Saved::of(&p[0])?, Saved::of(&p[1])?])),
            _ => Saved::Cut,
        })
    }

    fn holds_state(&self) -> bool {
        match self {
            Saved::Cut => false,
            Saved::State(_) => true,
            Saved::Pair(p) => p.iter().any(Saved::holds_state),
        }
    }

    fn restore(&self, cache: &mut KvCache, positions: usize) -> bool {
        match (self, cache) {
            (Saved::State(state), cache @ KvCache::State(_)) => {
                *cache = KvCache::State(state.clone());
                true
            }
            (Saved::Pair(saved), KvCache::Pair(p)) => {
                let [a, b] = &mut **p;
                saved[0].restore(a, positions) && saved[1].restore(b, positions)
            }
            (Saved::Cut, cache) => {
                let extra = cache.offset() - positions as i32;
                extra >= 0 && cache.trim(extra)
            }
            _ => false,
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Saved::Cut => 0,
            Saved::State(s) => s.arrays().map(|a| a.nbytes() as u64).sum(),
            Saved::Pair(p) => p.iter().map(Saved::bytes).sum(),
        }
    }
}

impl Snapshot {
    /// The recurrent states of `caches` after `positions`; `None` when it has none (every
    /// other cache can be cut back as it is).
    pub fn of(caches: &[KvCache], positions: usize) -> Result<Option<Self>> {
        let layers = caches.iter().map(Saved::of).collect::<Result<Vec<_>>>()?;
        Ok(layers
            .iter()
            .any(Saved::holds_state)
            .then_some(Self { positions, layers }))
    }

    /// Cuts `caches` (the same set, past this position) back to it: the other caches trimmed,
    /// the recurrent states replaced by these. False when a cache cannot be cut back.
    pub fn restore(&self, caches: &mut [KvCache]) -> bool {
        let layers = caches.iter_mut().zip(&self.layers);
        layers.fold(true, |ok, (cache, saved)| {
            ok && saved.restore(cache, self.positions)
        })
    }

    /// Bytes of the states it holds.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(Saved::bytes).sum()
    }
}

impl StateCache {
    /// A copy holding buffers of its own: the convolution window is otherwise a view of the
    /// last pass's whole convolution input, which MLX keeps alive with it.
    fn detached(&self) -> Result<StateCache> {
        let mut copy = self.clone();
        copy.stop_recording();
        if let Some(conv) = &self.conv {
            let own = conv.multiply(Array::from_f32(1.0).as_dtype(conv.dtype())?)?;
            own.eval()?;
            copy.conv = Some(own);
        }
        Ok(copy)
    }
}
