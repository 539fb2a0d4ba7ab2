//! End-to-end: LoRA and DoRA adapters through the real `mlx-worker` binary on a tiny random
//! Llama. The numbers of an adapter are checked against mlx-lm by `cargo xtask parity`
//! (tiny-lora, tiny-dora fixtures); here: the `adapter` param, an adapter directory given as
//! `model`, PEFT and mlx-lm layouts giving the same text, the `use_adapter` switch per request,
//! and bad adapters refused with the resident model left usable.

use crate::support::{greedy, model_id, rpc_error, tiny_model, within, worker};
use fixtures::{write_tiny_dora, write_tiny_lora, AdapterLayout, TinyLlama};
use protocol::error::LoadFailedData;
use protocol::methods::*;
use protocol::{Client, ErrorCode, LoadErrorKind};

const PROMPT: &str = "Tell me a story about a lighthouse.";

async fn text(w: &Client, model: &str, use_adapter: Option<bool>) -> String {
    answer(w, model, use_adapter, None).await.text
}

async fn answer(
    w: &Client,
    model: &str,
    use_adapter: Option<bool>,
    speculative: Option<SpeculativeParams>,
) -> GenerateResult {
    let mut p = greedy(PROMPT, 24);
    p.model = Some(model.to_owned());
    (p.use_adapter, p.speculative) = (use_adapter, speculative);
    within(w.generate(&p).unwrap().collect()).await.unwrap().1
}

#[tokio::test]
async fn adapters_change_the_text_and_use_adapter_false_restores_the_base() {
    let base = tiny_model(&TinyLlama::default());
    let base_id = model_id(base.path());
    let adapters = tempfile::tempdir().unwrap();
    let mlx_dir = adapters.path().join("mlx-lm");
    let peft_dir = adapters.path().join("peft");
    write_tiny_lora(&mlx_dir, 7, AdapterLayout::MlxLm, &base_id).unwrap();
    write_tiny_lora(&peft_dir, 7, AdapterLayout::Peft, &base_id).unwrap();
    let w = worker(&[]);

    let init = within(w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    assert!(init.capabilities.lora);

    let loaded = within(w.call::<Load>(&LoadParams::new(&base_id)))
        .await
        .unwrap();
    assert!(!loaded.info.is_lora);
    let base_text = text(&w, &base_id, None).await;

    // The same model with an adapter replaces the plain one (one resident per model id).
    let loaded = within(w.call::<Load>(&load_with(&base_id, &mlx_dir)))
        .await
        .unwrap();
    assert!(loaded.info.is_lora);
    let lora_text = text(&w, &base_id, None).await;
    assert_ne!(lora_text, base_text, "the adapter changes greedy text");
    assert_eq!(text(&w, &base_id, Some(false)).await, base_text);
    assert_eq!(text(&w, &base_id, Some(true)).await, lora_text);
    assert_eq!(text(&w, &base_id, None).await, lora_text);
    // Speculative decoding with the adapter on and off: the drafts are checked by the weights
    // the request runs with, so each answers as without drafts.
    let lookup: SpeculativeParams = serde_json::from_value(serde_json::json!({
        "method": "prompt_lookup", "num_draft_tokens": 4
    }))
    .unwrap();
    for (use_adapter, expected) in [(None, &lora_text), (Some(false), &base_text)] {
        let fast = answer(&w, &base_id, use_adapter, Some(lookup.clone())).await;
        assert_eq!(&fast.text, expected, "use_adapter {use_adapter:?}");
        assert!(fast.usage.drafted_tokens > 0, "{:?}", fast.usage);
    }

    // A PEFT adapter directory as `model`: its base model comes from adapter_config.json, and
    // the same numbers in PEFT's layout give the same text.
    let peft_id = model_id(&peft_dir);
    let loaded = within(w.call::<Load>(&LoadParams::new(&peft_id)))
        .await
        .unwrap();
    assert_eq!(loaded.model_id, peft_id);
    assert!(loaded.info.is_lora);
    assert_eq!(text(&w, &peft_id, None).await, lora_text);
    assert_eq!(text(&w, &peft_id, Some(false)).await, base_text);
    w.shutdown().await.unwrap();
}

#[tokio::test]
async fn dora_adapters_rescale_the_rows_and_use_adapter_false_restores_the_base() {
    let base = tiny_model(&TinyLlama::default());
    let base_id = model_id(base.path());
    let adapters = tempfile::tempdir().unwrap();
    let lora_dir = adapters.path().join("lora");
    let mlx_dir = adapters.path().join("mlx-lm-dora");
    let peft_dir = adapters.path().join("peft-dora");
    write_tiny_lora(&lora_dir, 7, AdapterLayout::MlxLm, &base_id).unwrap();
    write_tiny_dora(&mlx_dir, 7, AdapterLayout::MlxLm, &base_id).unwrap();
    write_tiny_dora(&peft_dir, 7, AdapterLayout::Peft, &base_id).unwrap();
    let w = worker(&[]);

    within(w.call::<Load>(&LoadParams::new(&base_id)))
        .await
        .unwrap();
    let base_text = text(&w, &base_id, None).await;
    within(w.call::<Load>(&load_with(&base_id, &lora_dir)))
        .await
        .unwrap();
    let lora_text = text(&w, &base_id, None).await;

    // The same low-rank matrices as DoRA: the magnitudes change the text again.
    let loaded = within(w.call::<Load>(&load_with(&base_id, &mlx_dir)))
        .await
        .unwrap();
    assert!(loaded.info.is_lora);
    let dora_text = text(&w, &base_id, None).await;
    assert_ne!(dora_text, base_text, "the DoRA adapter changes greedy text");
    assert_ne!(dora_text, lora_text, "DoRA's magnitudes change greedy text");
    assert_eq!(text(&w, &base_id, Some(false)).await, base_text);
    assert_eq!(text(&w, &base_id, Some(true)).await, dora_text);

    // PEFT's `use_dora` layout of the same numbers gives the same text.
    let peft_id = model_id(&peft_dir);
    within(w.call::<Load>(&LoadParams::new(&peft_id)))
        .await
        .unwrap();
    assert_eq!(text(&w, &peft_id, None).await, dora_text);
    assert_eq!(text(&w, &peft_id, Some(false)).await, base_text);
    w.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_adapters_are_refused_and_the_resident_model_stays_usable() {
    let base = tiny_model(&TinyLlama::default());
    let base_id = model_id(base.path());
    let w = worker(&[]);
    within(w.call::<Load>(&LoadParams::new(&base_id)))
        .await
        .unwrap();
    let before = text(&w, &base_id, None).await;

    let refused = |e: protocol::ResponseError| e.data_as::<LoadFailedData>().unwrap();

    // No adapter there.
    let missing = base.path().join("no-such-adapter");
    let e = rpc_error(
        w.call::<Load>(&load_with(&base_id, &missing)).await,
        ErrorCode::LoadFailed,
    );
    assert_eq!(refused(e).kind, LoadErrorKind::NotFound);

    // An adapter for a deeper model: the layer it adapts that this one lacks is named.
    let adapters = tempfile::tempdir().unwrap();
    let deeper = adapters.path().join("deeper");
    write_tiny_lora(&deeper, 1, AdapterLayout::MlxLm, &base_id).unwrap();
    rename_tensors(
        &deeper.join("adapters.safetensors"),
        "layers.1.",
        "layers.9.",
    );
    let e = rpc_error(
        w.call::<Load>(&load_with(&base_id, &deeper)).await,
        ErrorCode::LoadFailed,
    );
    let data = refused(e);
    assert_eq!(data.kind, LoadErrorKind::InvalidWeights);
    assert!(data.detail.contains("model.layers.9."), "{}", data.detail);

    // LoRA on the embedding is refused by name.
    let embedding = adapters.path().join("embedding");
    write_tiny_lora(&embedding, 1, AdapterLayout::MlxLm, &base_id).unwrap();
    let file = embedding.join("adapters.safetensors");
    rename_tensors(
        &file,
        "model.layers.1.self_attn.q_proj",
        "model.embed_tokens",
    );
    let e = rpc_error(
        w.call::<Load>(&load_with(&base_id, &embedding)).await,
        ErrorCode::LoadFailed,
    );
    let data = refused(e);
    assert_eq!(data.kind, LoadErrorKind::UnsupportedArchitecture);
    assert!(data.detail.contains("embed_tokens"), "{}", data.detail);

    // A full fine-tune is refused, naming the kind.
    let full = adapters.path().join("full");
    write_tiny_lora(&full, 1, AdapterLayout::MlxLm, &base_id).unwrap();
    edit_config(&full, |c| c["fine_tune_type"] = "full".into());
    let e = rpc_error(
        w.call::<Load>(&load_with(&base_id, &full)).await,
        ErrorCode::LoadFailed,
    );
    let data = refused(e);
    assert_eq!(data.kind, LoadErrorKind::UnsupportedArchitecture);
    assert!(data.detail.contains("`full`"), "{}", data.detail);

    // DoRA magnitudes in an adapter whose config does not ask for DoRA.
    let half_dora = adapters.path().join("half-dora");
    write_tiny_dora(&half_dora, 1, AdapterLayout::Peft, &base_id).unwrap();
    edit_config(&half_dora, |c| c["use_dora"] = false.into());
    let e = rpc_error(
        w.call::<Load>(&load_with(&base_id, &half_dora)).await,
        ErrorCode::LoadFailed,
    );
    let data = refused(e);
    assert_eq!(data.kind, LoadErrorKind::InvalidWeights);
    assert!(data.detail.contains("use_dora"), "{}", data.detail);

    // The plain model is still resident and answers as before.
    assert_eq!(text(&w, &base_id, None).await, before);
    w.shutdown().await.unwrap();
}

/// Loads `base_id` with the adapter in `adapter`.
fn load_with(base_id: &str, adapter: &std::path::Path) -> LoadParams {
    let mut p = LoadParams::new(base_id);
    p.adapter = Some(model_id(adapter));
    p
}

/// Rewrites `dir`'s adapter_config.json through `edit`.
fn edit_config(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let config = dir.join("adapter_config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&config, json.to_string()).unwrap();
}

/// Rewrites a safetensors file with `from` replaced by `to` in every tensor name.
fn rename_tensors(file: &std::path::Path, from: &str, to: &str) {
    let bytes = std::fs::read(file).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| (name.replace(from, to), view))
        .collect();
    safetensors::serialize_to_file(renamed, None, file).unwrap();
}
