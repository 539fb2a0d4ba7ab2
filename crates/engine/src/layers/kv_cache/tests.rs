//! The caches against mlx-lm's rules, position by position: each stored key is its position,
//! so what a cache returns says which positions a query attends to, in which order. The expected
//! sequences and masks are what mlx-lm 0.32.2's `RotatingKVCache` (and `ChunkedKVCache`, with
//! llama4.py's chunk mask) returns for the same updates (checked in the venv), trims included.

use mlx_rs::{ops::indexing::IndexOp, Array};

use super::{
    mask::{causal_mask, Mask},
    KvCache, PaddedCache,
};
use fixtures::mlx_test_lock;

/// Keys/values `(1, 1, n, 1)` holding positions `start..start + n`.
fn positions(start: i32, n: i32) -> Array {
    let p: Vec<f32> = (start..start + n).map(|p| p as f32).collect();
    Array::from_slice(&p, &[1, 1, n, 1])
}

/// Adds positions `start..start + n`; returns the stored positions the attention sees.
fn add(cache: &mut KvCache, start: i32, n: i32) -> Vec<i32> {
    let (k, v) = cache
        .update_and_fetch(positions(start, n), positions(start, n))
        .unwrap();
    let seen: Vec<i32> = k.as_slice::<f32>().iter().map(|&p| p as i32).collect();
    assert_eq!(
        seen,
        v.as_slice::<f32>()
            .iter()
            .map(|&p| p as i32)
            .collect::<Vec<_>>()
    );
    seen
}

fn mask_rows(mask: &Mask) -> Vec<String> {
    let Mask::Array(a) = mask else {
        panic!("expected an explicit mask");
    };
    let (rows, cols) = (a.dim(0), a.dim(1));
    (0..rows)
        .map(|r| {
            let row = a.index((r, ..));
            row.as_slice::<bool>()[..cols as usize]
                .iter()
                .map(|&b| if b { '1' } else { '.' })
                .collect()
        })
        .collect()
}

#[test]
fn causal_mask_with_and_without_window() {
    let _lock = mlx_test_lock();
    let plain = causal_mask(3, 1, None);
    assert_eq!(mask_rows(&Mask::Array(plain)), ["11..", "111.", "1111"]);
    let windowed = causal_mask(3, 1, Some(2));
    assert_eq!(mask_rows(&Mask::Array(windowed)), ["11..", ".11.", "..11"]);
}

#[test]
fn standard_cache_keeps_everything() {
    let _lock = mlx_test_lock();
    let mut cache = KvCache::for_window(None);
    assert!(matches!(cache.mask(5).unwrap(), Mask::Causal));
    assert_eq!(add(&mut cache, 0, 5), [0, 1, 2, 3, 4]);
    assert!(matches!(cache.mask(1).unwrap(), Mask::None));
    assert_eq!(add(&mut cache, 5, 1), [0, 1, 2, 3, 4, 5]);
    assert_eq!(cache.offset(), 6);
}

#[test]
fn rotating_cache_within_the_window_is_a_plain_cache() {
    let _lock = mlx_test_lock();
    let mut cache = KvCache::for_window(Some(4));
    assert!(matches!(cache.mask(3).unwrap(), Mask::Causal));
    assert_eq!(add(&mut cache, 0, 3), [0, 1, 2]);
    assert_eq!(add(&mut cache, 3, 1), [0, 1, 2, 3]);
    assert_eq!(cache.offset(), 4);
}

#[test]
fn rotating_cache_prefill_past_the_window_masks_each_query_to_its_window() {
    let _lock = mlx_test_lock();
    let mut cache = KvCache::for_window(Some(4));
    let mask = cache.mask(6).unwrap();
    assert_eq!(
        mask_rows(&mask),
        ["1.....", "11....", "111...", "1111..", ".1111.", "..1111"]
    );
    // The whole chunk is kept until the next update.
    assert_eq!(add(&mut cache, 0, 6), [0, 1, 2, 3, 4, 5]);
    // A second chunk keeps the last window - 1 positions before appending.
    let mask = cache.mask(2).unwrap();
    assert_eq!(mask_rows(&mask), ["1111.", ".1111"]);
    assert_eq!(add(&mut cache, 6, 2), [3, 4, 5, 6, 7]);
    // Decoding trims to the window and then overwrites the oldest slot.
    assert!(matches!(cache.mask(1).unwrap(), Mask::None));
    assert_eq!(add(&mut cache, 8, 1), [8, 5, 6, 7]);
    assert_eq!(add(&mut cache, 9, 1), [8, 9, 6, 7]);
    assert_eq!(add(&mut cache, 10, 1), [8, 9, 10, 7]);
    assert_eq!(add(&mut cache, 11, 1), [8, 9, 10, 11]);
    assert_eq!(add(&mut cache, 12, 1), [12, 9, 10, 11]);
    assert_eq!(cache.offset(), 13);
}

#[test]
fn rotating_cache_decoding_grows_to_the_window_then_rings() {
    let _lock = mlx_test_lock();
    let mut cache = KvCache::for_window(Some(3));
    assert_eq!(add(&mut cache, 0, 1), [0]);
    assert_eq!(add(&mut cache, 1, 1), [0, 1]);
    assert_eq!(add(&mut cache, 2, 1), [0, 1, 2]);
    assert_eq!(add(&mut cache, 3, 1), [3, 1, 2]);
    // A multi-token update after ringing restores temporal order first.
    assert_eq!(add(&mut cache, 4, 2), [2, 3, 4, 5]);
    assert_eq!(add(&mut cache, 6, 1), [6, 4, 5]);
}

#[test]
fn trimmed_caches_continue_as_mlx_lm_does() {
    let _lock = mlx_test_lock();
    // Rotating, window 4: a chunk, trim one, a chunk that reaches the window, then the ring.
    let mut cache = KvCache::for_window(Some(4));
    assert_eq!(add(&mut cache, 0, 3), [0, 1, 2]);
    assert!(cache.trim(1));
    assert_eq!(add(&mut cache, 2, 2), [0, 1, 2, 3]);
    assert_eq!(add(&mut cache, 4, 1), [4, 1, 2, 3]);
    assert_eq!(add(&mut cache, 5, 1), [4, 5, 2, 3]);
    // Wrapped: no longer trimmable.
    assert!(!cache.trim(1));
    // Decoded one by one, trimmed by two, then one step and a chunk.
    let mut cache = KvCache::for_window(Some(4));
    for p in 0..3 {
        add(&mut cache, p, 1);
    }
    assert!(cache.trim(2));
    assert_eq!(add(&mut cache, 1, 1), [0, 1]);
    assert_eq!(add(&mut cache, 2, 3), [0, 1, 2, 3, 4]);
    // Plain: trimmed positions are overwritten.
    let mut cache = KvCache::for_window(None);
    assert_eq!(add(&mut cache, 0, 5), [0, 1, 2, 3, 4]);
    assert!(cache.trim(3));
    assert_eq!(add(&mut cache, 2, 1), [0, 1, 2]);
    assert_eq!(add(&mut cache, 3, 2), [0, 1, 2, 3, 4]);
}

/// Stored positions of each layer of `caches`, as [`add`] reads them (without adding).
fn stored(caches: &[KvCache]) -> Vec<Vec<i32>> {
    (caches.iter())
        .map(|c| {
            let KvCache::Standard(s) = c else {
                panic!("expected a full-attention cache")
            };
            let (k, _) = s.storage().unwrap();
            let k = k.index((.., .., ..s.offset(), ..)).contiguous().unwrap();
            k.as_slice::<f32>().iter().map(|&p| p as i32).collect()
        })
        .collect()
}

/// Two layers of caches holding positions `0..n` (values: keys + 1000).
fn filled(n: i32) -> Vec<KvCache> {
    (0..2)
        .map(|_| {
            let mut c = KvCache::default();
            let k = positions(0, n);
            c.update_and_fetch(k.clone(), k.add(Array::from_f32(1000.0)).unwrap())
                .unwrap();
            c
        })
        .collect()
}

/// Rows of different lengths join, each step writes every row at its own position and masks
/// what it has not written, and a row leaves with exactly the caches a lone sequence would
/// hold; the rows left keep theirs.
#[test]
fn padded_cache_writes_masks_and_gives_back_each_row() {
    let _lock = mlx_test_lock();
    let mut padded = PaddedCache::default();
    assert!(PaddedCache::fits(&filled(3)) && !PaddedCache::fits(&[KvCache::for_window(Some(4))]));
    for (id, n) in [(7, 3), (8, 300), (9, 1)] {
        padded.join(id, &filled(n)).unwrap();
    }
    assert_eq!(padded.ids(), [7, 8, 9]);
    // Two steps: each row's next position, keys = position, values = position + 1000.
    for step_no in 0..2 {
        let step = padded.step().unwrap();
        let offsets: Vec<i32> = [3, 300, 1].iter().map(|o| o + step_no).collect();
        assert_eq!(step.offsets.as_slice::<i32>(), offsets);
        let len = 301 + step_no;
        assert_eq!(step.mask.shape(), [3, 1, 1, len]);
        let mask = step.mask.as_slice::<bool>();
        for (b, &o) in offsets.iter().enumerate() {
            let row = &mask[b * len as usize..(b + 1) * len as usize];
            assert!(row.iter().enumerate().all(|(j, &m)| m == (j as i32 <= o)));
        }
        let k: Vec<f32> = offsets.iter().map(|&o| o as f32).collect();
        let k = Array::from_slice(&k, &[3, 1, 1, 1]);
        for layer in 0..2 {
            let v = k.add(Array::from_f32(1000.0)).unwrap();
            let (keys, values) = padded.update(layer, &step, &k, &v).unwrap();
            assert_eq!(keys.shape(), [3, 1, len, 1]);
            let (keys, values) = (keys.contiguous().unwrap(), values.contiguous().unwrap());
            let (keys, values) = (keys.as_slice::<f32>(), values.as_slice::<f32>());
            for (b, &o) in offsets.iter().enumerate() {
                let at = b * len as usize + o as usize;
                assert_eq!((keys[at], values[at]), (o as f32, o as f32 + 1000.0));
            }
        }
    }
    let mut out = Vec::new();
    padded
        .retain(|id| id != 8, |id, caches| out.push((id, caches)))
        .unwrap();
    assert_eq!(padded.ids(), [7, 9]);
    let (id, caches) = out.pop().unwrap();
    assert_eq!(id, 8);
    assert_eq!(caches[0].offset(), 302);
    assert_eq!(stored(&caches), stored(&filled(302)));
    padded
        .retain(|_| false, |id, caches| out.push((id, caches)))
        .unwrap();
    assert!(padded.ids().is_empty());
    let lengths: Vec<(usize, Vec<Vec<i32>>)> =
        out.into_iter().map(|(id, c)| (id, stored(&c))).collect();
    assert_eq!(lengths, [(7, stored(&filled(5))), (9, stored(&filled(3)))]);
}

/// Llama 4's chunked cache, chunk 4: a pass begins by dropping all but the last 4 positions
/// held (mlx-lm's `ChunkedKVCache.maybe_trim_front`), and each query sees its own chunk of
/// what is held up to itself.
#[test]
fn chunked_cache_keeps_the_last_chunk_and_masks_to_chunks() {
    let _lock = mlx_test_lock();
    let mut cache = KvCache::for_chunk(4);
    assert_eq!(add(&mut cache, 0, 6), [0, 1, 2, 3, 4, 5]);
    // Two queries (6, 7) over positions 2..8: both in chunk 1 (4..8).
    assert_eq!(mask_rows(&cache.mask(2).unwrap()), ["..111.", "..1111"]);
    assert_eq!(add(&mut cache, 6, 2), [2, 3, 4, 5, 6, 7]);
    // One query (8, chunk 2) over positions 4..9: only itself.
    assert_eq!(mask_rows(&cache.mask(1).unwrap()), ["....1"]);
    assert_eq!(add(&mut cache, 8, 1), [4, 5, 6, 7, 8]);
    assert_eq!(cache.offset(), 9);
    // Positions were dropped at the front: no longer cut back.
    assert!(!cache.trim(1));
    // Nothing dropped yet: cut back as a plain cache.
    let mut cache = KvCache::for_chunk(4);
    assert_eq!(add(&mut cache, 0, 3), [0, 1, 2]);
    assert!(cache.trim(1));
    assert_eq!(add(&mut cache, 2, 2), [0, 1, 2, 3]);
}
