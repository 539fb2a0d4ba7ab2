//! The caches against mlx-lm's rules, position by position: each stored key is its position,
//! so what a cache returns says which positions a query attends to, in which order. The expected
//! sequences and masks are what mlx-lm 0.32.2's `RotatingKVCache` returns for the same updates
//! (checked in the venv), trims included.

use mlx_rs::{ops::indexing::IndexOp, Array};

use super::{causal_mask, KvCache, Mask};
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
