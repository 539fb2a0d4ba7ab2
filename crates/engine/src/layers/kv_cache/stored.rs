//! A cache set as named arrays and a layout that says how to rebuild it: what the prompt
//! cache's disk tier writes and reads back. Each cache's storage is stored as it lies (spare
//! capacity included: storing it needs no copy, which matters when entries leave memory because
//! memory is short), so every key sits where it sat and the sums after a read are those the
//! caches would have given in memory.

use std::collections::HashMap;

use mlx_rs::Array;
use serde::{Deserialize, Serialize};

use super::{
    cache::KvCache,
    chunked::ChunkedCache,
    rotating::RotatingCache,
    snapshot::{Saved, Snapshot},
    standard::StandardCache,
    state::StateCache,
};

/// How to rebuild one layer's cache, or what a snapshot saved of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layer {
    /// Arrays `keys`, `values` `(B, H, capacity, D)` when it holds positions.
    Standard {
        offset: i32,
    },
    /// Arrays `keys`, `values`: the ring as it lies.
    Rotating {
        window: i32,
        offset: i32,
        idx: i32,
    },
    /// Arrays `keys`, `values`: positions `start..start + offset`.
    Chunked {
        chunk: i32,
        start: i32,
        offset: i32,
    },
    /// Arrays `conv`, `state` where held.
    State {
        offset: i32,
    },
    Pair {
        of: Box<[Layer; 2]>,
    },
    /// A snapshot's layer that is cut back instead of saved.
    Cut,
}

/// A cache set and its snapshots, as layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    pub layers: Vec<Layer>,
    /// Each snapshot's position and layers.
    pub snapshots: Vec<(usize, Vec<Layer>)>,
}

/// The arrays of a stored set, by name.
pub type Arrays = Vec<(String, Array)>;

/// `caches` and `snapshots` as a layout and its arrays; `None` when a cache cannot be stored
/// (a quantized one: the prompt cache never keeps those).
pub fn store(caches: &[KvCache], snapshots: &[Snapshot]) -> Option<(Layout, Arrays)> {
    let mut arrays = Vec::new();
    let layers = (caches.iter().enumerate())
        .map(|(i, c)| store_cache(c, &format!("layer.{i}"), &mut arrays))
        .collect::<Option<Vec<_>>>()?;
    let snapshots = (snapshots.iter().enumerate())
        .map(|(j, s)| {
            let saved = s.layers.iter().enumerate();
            let layers =
                saved.map(|(i, l)| store_saved(l, &format!("snapshot.{j}.{i}"), &mut arrays));
            (s.positions, layers.collect())
        })
        .collect();
    Some((Layout { layers, snapshots }, arrays))
}

/// Rebuilds what [`store`] gave, each cache of the kind `template` (the model's fresh caches)
/// has in its place; an error says what does not fit (a layout or arrays of another model).
pub fn restore(
    layout: &Layout,
    mut arrays: HashMap<String, Array>,
    template: &[KvCache],
) -> Result<(Vec<KvCache>, Vec<Snapshot>), String> {
    if layout.layers.len() != template.len() {
        return Err(format!(
            "{} layers stored, the model has {}",
            layout.layers.len(),
            template.len()
        ));
    }
    let caches = (layout.layers.iter().zip(template).enumerate())
        .map(|(i, (l, t))| restore_cache(l, t, &format!("layer.{i}"), &mut arrays))
        .collect::<Result<Vec<_>, _>>()?;
    let snapshots = (layout.snapshots.iter().enumerate())
        .map(|(j, (positions, layers))| {
            let saved = (layers.iter().enumerate())
                .map(|(i, l)| restore_saved(l, &format!("snapshot.{j}.{i}"), &mut arrays));
            let layers = saved.collect::<Result<Vec<_>, _>>()?;
            if layers.len() != template.len() {
                return Err(format!("snapshot {j} has {} layers", layers.len()));
            }
            Ok(Snapshot {
                positions: *positions,
                layers,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    match arrays.keys().next() {
        Some(name) => Err(format!("an array no layer reads: {name}")),
        None => Ok((caches, snapshots)),
    }
}

fn put(arrays: &mut Arrays, name: &str, part: &str, array: Option<&Array>) {
    if let Some(a) = array {
        arrays.push((format!("{name}.{part}"), a.clone()));
    }
}

fn put_standard(arrays: &mut Arrays, name: &str, cache: &StandardCache) -> i32 {
    let storage = cache.storage();
    put(arrays, name, "keys", storage.map(|s| s.0));
    put(arrays, name, "values", storage.map(|s| s.1));
    cache.offset()
}

fn store_cache(cache: &KvCache, name: &str, arrays: &mut Arrays) -> Option<Layer> {
    Some(match cache {
        KvCache::Standard(c) => Layer::Standard {
            offset: put_standard(arrays, name, c),
        },
        KvCache::Rotating(c) => {
            let (storage, offset, idx) = c.parts();
            put(arrays, name, "keys", storage.map(|s| s.0));
            put(arrays, name, "values", storage.map(|s| s.1));
            Layer::Rotating {
                window: c.window(),
                offset,
                idx,
            }
        }
        KvCache::Chunked(c) => {
            let (kept, start) = c.parts();
            Layer::Chunked {
                chunk: c.chunk(),
                start,
                offset: put_standard(arrays, name, kept),
            }
        }
        KvCache::State(s) => store_state(s, name, arrays),
        KvCache::Pair(p) => Layer::Pair {
            of: Box::new([
                store_cache(&p[0], &format!("{name}.0"), arrays)?,
                store_cache(&p[1], &format!("{name}.1"), arrays)?,
            ]),
        },
        KvCache::Quantized(_) => return None,
    })
}

fn store_state(s: &StateCache, name: &str, arrays: &mut Arrays) -> Layer {
    put(arrays, name, "conv", s.conv.as_ref());
    put(arrays, name, "state", s.state.as_ref());
    Layer::State { offset: s.offset() }
}

fn store_saved(saved: &Saved, name: &str, arrays: &mut Arrays) -> Layer {
    match saved {
        Saved::Cut => Layer::Cut,
        Saved::State(s) => store_state(s, name, arrays),
        Saved::Pair(p) => Layer::Pair {
            of: Box::new([
                store_saved(&p[0], &format!("{name}.0"), arrays),
                store_saved(&p[1], &format!("{name}.1"), arrays),
            ]),
        },
    }
}

/// Keys and values `(B, H, L, D)` stored under `name`, both or neither.
fn take_pair(
    arrays: &mut HashMap<String, Array>,
    name: &str,
) -> Result<Option<(Array, Array)>, String> {
    let keys = arrays.remove(&format!("{name}.keys"));
    let values = arrays.remove(&format!("{name}.values"));
    match (keys, values) {
        (None, None) => Ok(None),
        (Some(k), Some(v)) if k.ndim() == 4 && v.ndim() == 4 && k.dim(2) == v.dim(2) => {
            Ok(Some((k, v)))
        }
        _ => Err(format!("{name}: keys and values do not match")),
    }
}

/// A standard cache of `offset` positions from the storage stored under `name`.
fn take_standard(
    arrays: &mut HashMap<String, Array>,
    name: &str,
    offset: i32,
) -> Result<StandardCache, String> {
    let storage = take_pair(arrays, name)?;
    let capacity = storage.as_ref().map_or(0, |(k, _)| k.dim(2));
    if !(0..=capacity).contains(&offset) {
        return Err(format!(
            "{name}: {offset} positions in a storage of {capacity}"
        ));
    }
    Ok(StandardCache::holding(storage, offset))
}

fn restore_cache(
    layer: &Layer,
    template: &KvCache,
    name: &str,
    arrays: &mut HashMap<String, Array>,
) -> Result<KvCache, String> {
    Ok(match (layer, template) {
        (&Layer::Standard { offset }, KvCache::Standard(_)) => {
            KvCache::Standard(take_standard(arrays, name, offset)?)
        }
        (
            &Layer::Rotating {
                window,
                offset,
                idx,
            },
            KvCache::Rotating(t),
        ) if t.window() == window => {
            let storage = take_pair(arrays, name)?;
            KvCache::Rotating(RotatingCache::from_parts(window, storage, offset, idx))
        }
        (
            &Layer::Chunked {
                chunk,
                start,
                offset,
            },
            KvCache::Chunked(t),
        ) if t.chunk() == chunk => {
            let kept = take_standard(arrays, name, offset)?;
            KvCache::Chunked(ChunkedCache::from_parts(chunk, kept, start))
        }
        (&Layer::State { offset }, KvCache::State(_)) => {
            KvCache::State(restore_state(offset, name, arrays))
        }
        (Layer::Pair { of }, KvCache::Pair(t)) => KvCache::Pair(Box::new([
            restore_cache(&of[0], &t[0], &format!("{name}.0"), arrays)?,
            restore_cache(&of[1], &t[1], &format!("{name}.1"), arrays)?,
        ])),
        _ => {
            return Err(format!(
                "{name}: stored as {layer:?}, the model makes another kind"
            ))
        }
    })
}

fn restore_state(offset: i32, name: &str, arrays: &mut HashMap<String, Array>) -> StateCache {
    let conv = arrays.remove(&format!("{name}.conv"));
    let state = arrays.remove(&format!("{name}.state"));
    StateCache::holding(conv, state, offset)
}

fn restore_saved(
    layer: &Layer,
    name: &str,
    arrays: &mut HashMap<String, Array>,
) -> Result<Saved, String> {
    Ok(match layer {
        Layer::Cut => Saved::Cut,
        &Layer::State { offset } => Saved::State(restore_state(offset, name, arrays)),
        Layer::Pair { of } => Saved::Pair(Box::new([
            restore_saved(&of[0], &format!("{name}.0"), arrays)?,
            restore_saved(&of[1], &format!("{name}.1"), arrays)?,
        ])),
        _ => return Err(format!("{name}: a snapshot cannot hold {layer:?}")),
    })
}
