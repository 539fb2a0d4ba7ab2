//! Batched passes against lone ones on a tiny Llama: a padded decode step gives each row its
//! row-by-row logits (`Caches::Padded` vs `Caches::Rows`), and prompts prefilled together give
//! each sequence its lone pass's caches and logits (`Caches::Segments`), as the scheduler's
//! `generate/padded.rs` and `generate/together.rs` use them.

use mlx_rs::{ops::indexing::IndexOp, transforms, Array};

use crate::{
    layers::device::on_gpu,
    layers::kv_cache::{Caches, KvCache, PaddedCache},
    models::Input,
    Engine,
};

/// Decode steps over a padded cache give each row the logits row-by-row attention gives it
/// in the same batch (whose rows are a lone run's wherever BLAS gives a row the same bits
/// in a product of that many rows: docs/traps.md): on the CPU bit for bit, for rows far
/// apart in length (short rows inside OpenBLAS's first inner-axis block of the longest
/// row's sum, long ones past it, where a weighted sum over the padded length would group
/// their terms otherwise), before and after the longest row leaves; on a GPU to rounding.
#[test]
fn padded_steps_give_each_row_its_row_by_row_logits() {
    let _mlx = fixtures::mlx_test_lock();
    let (mut engine, dir) = Engine::with_tiny_llama("padded");
    let model = engine.models[0].split().0.model;
    let batching = model.facts().batching;
    assert!(batching.padded && batching.rows);
    let ids = |c: &[u32]| Array::from_slice(c, &[1, c.len() as i32]);
    let prompts: Vec<Vec<u32>> = [9, 1100, 300, 520]
        .iter()
        .map(|&n| (0..n).map(|i| 3 + (i * 7 + n) % 200).collect())
        .collect();
    let (mut own, mut padded) = (Vec::new(), PaddedCache::default());
    for (id, p) in prompts.iter().enumerate() {
        let mut caches = model.make_caches();
        let tokens = ids(p);
        (model.forward(Input::tokens(&tokens), Caches::One(&mut caches))).unwrap();
        padded.join(id, &caches).unwrap();
        own.push(caches);
    }
    for step in 0..6u32 {
        if step == 3 {
            // The longest row leaves; the others go on over a shorter capacity.
            padded.retain(|id| id != 1, |_, _| {}).unwrap();
        }
        let rows: Vec<usize> = padded.ids().to_vec();
        let tokens: Vec<u32> = rows.iter().map(|&r| 10 + step + r as u32).collect();
        let batch = Array::from_slice(&tokens, &[rows.len() as i32, 1]);
        let input = Input::tokens(&batch);
        let logits = model.forward(input, Caches::Padded(&mut padded)).unwrap();
        let mut caches: Vec<&mut [_]> = (own.iter_mut().enumerate())
            .filter(|(r, _)| rows.contains(r))
            .map(|(_, c)| c.as_mut_slice())
            .collect();
        let input = Input::tokens(&batch);
        let by_rows = model.forward(input, Caches::Rows(&mut caches)).unwrap();
        let same = match on_gpu() {
            false => by_rows.eq_values(&logits).unwrap(),
            true => by_rows.all_close(&logits, 1e-3, 1e-3, None).unwrap(),
        };
        for (b, r) in rows.iter().enumerate().filter(|_| !same) {
            let b = b as i32;
            let (x, y) = (by_rows.index(b..b + 1), logits.index(b..b + 1));
            assert!(x.eq_values(&y).unwrap(), "step {step}, sequence {r}");
        }
        assert!(same, "step {step}: the padded rows' logits");
    }
    drop(engine);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What `caches` hold, position by position (up to each cache's offset).
fn held(caches: &[KvCache]) -> Vec<Array> {
    (caches.iter())
        .flat_map(|c| {
            let k = c.arrays().next().unwrap();
            let none = k.index((.., .., ..0, ..));
            let (k, v) = c.clone().update_and_fetch(none.clone(), none).unwrap();
            [k, v]
        })
        .collect()
}

fn close(x: &Array, y: &Array) -> bool {
    assert_eq!(x.shape(), y.shape());
    x.all_close(y, 1e-4, 1e-5, None).unwrap()
}

/// Two prompts in one pass leave each sequence's caches as its own passes do (to rounding),
/// from empty caches and from cached prefixes of different lengths, and give each its last
/// position's logits.
#[test]
fn prompts_prefilled_together_match_each_alone() {
    let _mlx = fixtures::mlx_test_lock();
    let (mut engine, dir) = Engine::with_tiny_llama("together");
    let model = engine.models[0].split().0.model;
    let chunk = |from: u32, n: u32| (from..from + n).collect::<Vec<u32>>();
    let [mut a1, mut b1, mut a2, mut b2] = [(); 4].map(|()| model.make_caches());
    // Rounds: (a's tokens, b's tokens), the second on top of the first.
    for (a, b) in [(chunk(3, 9), chunk(40, 5)), (chunk(20, 4), chunk(7, 11))] {
        let ids = |c: &[u32]| Array::from_slice(c, &[1, c.len() as i32]);
        let last = |x: Array| x.index((.., -1, ..));
        let alone = [
            last(
                model
                    .forward(Input::tokens(&ids(&a)), Caches::One(&mut a1))
                    .unwrap(),
            ),
            last(
                model
                    .forward(Input::tokens(&ids(&b)), Caches::One(&mut b1))
                    .unwrap(),
            ),
        ];
        let both = [a.clone(), b.clone()].concat();
        let lens = [a.len() as i32, b.len() as i32];
        let mut caches = [a2.as_mut_slice(), b2.as_mut_slice()];
        let both = ids(&both);
        let logits = model
            .forward(Input::tokens(&both), Caches::Segments(&mut caches, &lens))
            .unwrap();
        assert_eq!(logits.shape()[..2], [1, 2]);
        for (s, (one, caches)) in alone.iter().zip([(&a1, &a2), (&b1, &b2)]).enumerate() {
            let (x, y) = (held(caches.0), held(caches.1));
            transforms::eval(x.iter().chain(&y)).unwrap();
            assert!(
                x.iter().zip(&y).all(|(x, y)| close(x, y)),
                "sequence {s}'s caches"
            );
            assert!(
                close(one, &logits.index((.., s as i32, ..))),
                "sequence {s}'s logits"
            );
        }
    }
    drop(engine);
    std::fs::remove_dir_all(&dir).unwrap();
}
