//! Damaged and hostile model directories: each load fails with `-32002` and a kind and detail
//! that say what is wrong, nothing is allocated by the damage, and the resident model goes on
//! answering exactly as before.

use std::fs;
use std::path::Path;

use fixtures::TinyLlama;
use protocol::error::LoadFailedData;
use protocol::methods::*;
use protocol::{ErrorCode, LoadErrorKind};
use serde_json::{json, Value};

use crate::support::{greedy, model_id, rpc_error, tiny_model, within, worker_with_tiny_model};

/// A damage done to a copy of the tiny model's directory.
struct Damage {
    what: &'static str,
    apply: fn(&Path),
    /// Words the error's detail must hold.
    says: &'static [&'static str],
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    fs::write(path, config.to_string()).unwrap();
}

fn edit_weights(dir: &Path, edit: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let path = dir.join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    fs::write(path, edit(bytes)).unwrap();
}

/// The safetensors header length (its first 8 bytes) and the header JSON.
fn header(bytes: &[u8]) -> (usize, Value) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (n, serde_json::from_slice(&bytes[8..8 + n]).unwrap())
}

/// `bytes` with its header replaced by `header` (padded to its old length with spaces).
fn with_header(bytes: Vec<u8>, header: &Value) -> Vec<u8> {
    let (n, _) = self::header(&bytes);
    let mut text = header.to_string().into_bytes();
    assert!(text.len() <= n, "the new header must not be longer");
    text.resize(n, b' ');
    [&bytes[..8], &text, &bytes[8 + n..]].concat()
}

const DAMAGES: &[Damage] = &[
    Damage {
        what: "a billion layers",
        apply: |d| edit_config(d, |c| c["num_hidden_layers"] = json!(1_000_000_000u64)),
        says: &["num_hidden_layers", "1000000000"],
    },
    Damage {
        what: "heads that disagree with the weights",
        apply: |d| edit_config(d, |c| c["num_attention_heads"] = json!(2)),
        says: &["self_attn", "config.json does not describe these weights"],
    },
    Damage {
        what: "a hidden size that disagrees with the weights",
        apply: |d| edit_config(d, |c| c["hidden_size"] = json!(1 << 20)),
        says: &["config.json does not describe these weights"],
    },
    Damage {
        what: "a vocabulary of 10^12",
        apply: |d| edit_config(d, |c| c["vocab_size"] = json!(1_000_000_000_000u64)),
        says: &["vocab_size"],
    },
    Damage {
        what: "a truncated safetensors file",
        apply: |d| edit_weights(d, |b| b[..b.len() / 2].to_vec()),
        says: &["model.safetensors"],
    },
    Damage {
        what: "garbage instead of safetensors",
        apply: |d| edit_weights(d, |b| vec![0xA5; b.len()]),
        says: &["model.safetensors"],
    },
    Damage {
        what: "a header that claims more bytes than the file holds",
        apply: |d| {
            edit_weights(d, |b| {
                // The tensor that ends the data ends far past it: same digits, all nines.
                let (_, h) = header(&b);
                let end = h
                    .as_object()
                    .unwrap()
                    .values()
                    .filter_map(|t| t["data_offsets"][1].as_u64())
                    .max()
                    .unwrap();
                let mut h = h;
                let beyond = "9".repeat(end.to_string().len()).parse::<u64>().unwrap();
                assert!(beyond > end);
                for t in h.as_object_mut().unwrap().values_mut() {
                    if t["data_offsets"][1].as_u64() == Some(end) {
                        t["data_offsets"][1] = json!(beyond);
                    }
                }
                with_header(b, &h)
            })
        },
        says: &["model.safetensors"],
    },
];

#[tokio::test]
async fn damaged_checkpoints_are_refused_and_the_resident_model_is_untouched() {
    let (w, dir) = worker_with_tiny_model(&[]).await;
    let before = within(w.generate(&greedy("hi", 8)).unwrap().finish())
        .await
        .unwrap();
    for damage in DAMAGES {
        let copy = tiny_model(&Default::default());
        (damage.apply)(copy.path());
        let e = rpc_error(
            within(w.call::<Load>(&LoadParams::new(model_id(copy.path())))).await,
            ErrorCode::LoadFailed,
        );
        let data: LoadFailedData = e.data_as().unwrap();
        assert_eq!(data.kind, LoadErrorKind::InvalidWeights, "{}", damage.what);
        for word in damage.says {
            assert!(
                data.detail.contains(word),
                "{}: `{word}` not in {:?}",
                damage.what,
                data.detail
            );
        }
        let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
        assert_eq!(
            status.active_model,
            Some(model_id(dir.path())),
            "{}",
            damage.what
        );
        let after = within(w.generate(&greedy("hi", 8)).unwrap().finish())
            .await
            .unwrap();
        assert_eq!(after.text, before.text, "{}", damage.what);
    }
    within(w.shutdown()).await.unwrap();
    assert!(w.stray_stdout_lines().is_empty());
}

#[tokio::test]
async fn a_model_larger_than_the_memory_limit_is_refused_before_it_is_read() {
    let (w, dir) = worker_with_tiny_model(&[]).await;
    let init = within(w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    // Beside the tiny model's weights, float32 tensors twice the machine's memory in all, in a
    // sparse file (it takes no disk): only the header is ever read. Each has 2^30 elements
    // (MLX's loader counts a tensor's elements in 32 bits).
    let big = tiny_model(&Default::default());
    const ELEMENTS: u64 = 1 << 30;
    let count = init.mlx.device.memory_bytes * 2 / (ELEMENTS * 4) + 1;
    let mut header = serde_json::Map::new();
    for i in 0..count {
        let offsets = [i * ELEMENTS * 4, (i + 1) * ELEMENTS * 4];
        let shape = [ELEMENTS / 65536, 65536];
        let tensor = json!({"dtype": "F32", "shape": shape, "data_offsets": offsets});
        header.insert(format!("huge.{i}"), tensor);
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    text.resize(text.len().next_multiple_of(8), b' ');
    let path = big.path().join("model-huge.safetensors");
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&text);
    fs::write(&path, &bytes).unwrap();
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(bytes.len() as u64 + count * ELEMENTS * 4)
        .unwrap();

    let e = rpc_error(
        within(w.call::<Load>(&LoadParams::new(model_id(big.path())))).await,
        ErrorCode::LoadFailed,
    );
    let data: LoadFailedData = e.data_as().unwrap();
    assert_eq!(data.kind, LoadErrorKind::OutOfMemory, "{}", data.detail);
    assert!(data.detail.contains("memory limit"), "{}", data.detail);
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    assert_eq!(status.active_model, Some(model_id(dir.path())));
    within(w.generate(&greedy("hi", 4)).unwrap().finish())
        .await
        .unwrap();
    within(w.shutdown()).await.unwrap();
}

/// Load reads every weight of the language model (pricing its caches runs a pass through all
/// of it): a weight file cut after load changes nothing, the model answers as before, and the
/// other resident too.
#[tokio::test]
async fn a_weight_file_cut_after_load_changes_nothing() {
    let (w, dir) = worker_with_tiny_model(&[]).await;
    let spec = TinyLlama {
        seed: 7,
        ..Default::default()
    };
    let cut = tiny_model(&spec);
    within(w.call::<Load>(&LoadParams::new(model_id(cut.path()))))
        .await
        .unwrap();
    let on = |dir: &std::path::Path| GenerateParams {
        model: Some(model_id(dir)),
        ..greedy("hi", 8)
    };
    let before = within(w.generate(&on(cut.path())).unwrap().finish())
        .await
        .unwrap();
    fixtures::cut_after_header(&cut.path().join("model.safetensors")).unwrap();
    for _ in 0..2 {
        let after = within(w.generate(&on(cut.path())).unwrap().finish())
            .await
            .unwrap();
        assert_eq!(after.text, before.text);
        within(w.generate(&on(dir.path())).unwrap().finish())
            .await
            .unwrap();
    }
    within(w.shutdown()).await.unwrap();
}
