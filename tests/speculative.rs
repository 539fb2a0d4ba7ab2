//! Speculative decoding's drafters that read the model's hidden states, over real pipes: the tiny
//! Qwen3.5 fixture's own multi-token-prediction head and its DFlash companion (both made with
//! mlx-vlm's drafter classes by `cargo xtask parity`'s fixture builder), each answering what one
//! token per pass answers.

use crate::support::{model_id, rpc_error, tiny_model, within_for, worker};
use protocol::methods::*;
use protocol::Client;
use protocol::ErrorCode;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// 24 greedy tokens after the prompt ids 100..140 (the fixtures' drafter references' prompt).
fn greedy_after_the_prompt() -> GenerateParams {
    let mut ask = GenerateParams::new(vec![]);
    ask.prompt_ids = Some((100..140).collect());
    (ask.max_new_tokens, ask.sampling.temperature) = (24, 0.0);
    ask
}

async fn answer(w: &Client, ask: &GenerateParams) -> GenerateResult {
    within_for(LIMIT, w.generate(ask).unwrap().finish())
        .await
        .unwrap()
}

fn speculating(ask: &mut GenerateParams, method: &str) {
    ask.speculative =
        Some(serde_json::from_value(serde_json::json!({ "method": method })).unwrap());
}

#[tokio::test]
async fn the_mtp_head_and_a_dflash_drafter_answer_as_one_token_per_pass() {
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let w = worker(&[]);
    let mut load = LoadParams::new(model_id(&dir));
    load.draft_model = Some(model_id(&dir.join("dflash")));
    let loaded = within_for(LIMIT, w.call::<Load>(&load)).await.unwrap();
    assert_eq!(loaded.info.mtp_layers, 1);
    assert_eq!(loaded.info.draft_kind, Some(DraftKind::Dflash));
    // `auto` prefers the checkpoint's own head, and says so.
    let auto = &loaded.info.speculative_auto;
    assert_eq!(auto.method, Some(SpeculativeMethod::Mtp), "{auto:?}");
    assert!(
        auto.reason.contains("multi-token-prediction head"),
        "{auto:?}"
    );

    let mut ask = greedy_after_the_prompt();
    let plain = answer(&w, &ask).await;
    for method in ["mtp", "draft_model", "auto"] {
        speculating(&mut ask, method);
        let fast = answer(&w, &ask).await;
        assert_eq!(fast.text, plain.text, "{method}");
        assert!(fast.usage.drafted_tokens > 0, "{method}: {:?}", fast.usage);
    }
    assert_eq!(w.shutdown().await.unwrap().code(), Some(0));
    assert!(w.stray_stdout_lines().is_empty());
}

/// DFlash2, DSpark and EAGLE-3 companions (made with mlx-vlm's classes beside the fixture):
/// loaded as `draft_model` and named by their kind, greedy answers as one token per pass with
/// drafts taken, and a sampled request speculating too (drafts drawn from the selector's, the
/// Markov head's or the draft vocabulary's distribution and judged by the acceptance rule).
#[tokio::test]
async fn dflash2_dspark_and_eagle3_drafters_answer_as_one_token_per_pass() {
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let w = worker(&[]);
    for (name, kind) in [
        ("dflash2", DraftKind::Dflash2),
        ("dspark", DraftKind::Dspark),
        ("eagle3", DraftKind::Eagle3),
    ] {
        let mut load = LoadParams::new(model_id(&dir));
        load.draft_model = Some(model_id(&dir.join(name)));
        let loaded = within_for(LIMIT, w.call::<Load>(&load)).await.unwrap();
        assert_eq!(loaded.info.draft_kind, Some(kind), "{name}");

        let mut ask = greedy_after_the_prompt();
        let plain = answer(&w, &ask).await;
        speculating(&mut ask, "draft_model");
        let fast = answer(&w, &ask).await;
        assert_eq!(fast.text, plain.text, "{name}");
        assert!(fast.usage.drafted_tokens > 0, "{name}: {:?}", fast.usage);

        (ask.sampling.temperature, ask.sampling.seed) = (0.8, Some(7));
        let drawn = answer(&w, &ask).await;
        assert!(
            drawn.usage.completion_tokens > 0,
            "{name}: {:?}",
            drawn.usage
        );
        assert!(drawn.usage.drafted_tokens > 0, "{name}: {:?}", drawn.usage);
        assert!(drawn.usage.accepted_tokens <= drawn.usage.drafted_tokens);
    }
    assert_eq!(w.shutdown().await.unwrap().code(), Some(0));
    assert!(w.stray_stdout_lines().is_empty());
}

/// The prompt cache keeps each drafter's caches with the model's: a next prompt sharing the
/// first one's 40 tokens reuses the model's caches (to the recurrent layers' snapshot where the
/// first prompt ended: 39 positions) and the drafter's as far (`draft_cached_tokens`), which
/// then reads the model's hidden states from there on, and answers as without drafts.
#[tokio::test]
async fn the_prompt_cache_keeps_each_drafters_caches() {
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let w = worker(&[]);
    for (drafter, method) in [
        (None, "mtp"),
        (Some("dflash"), "draft_model"),
        (Some("eagle3"), "draft_model"),
    ] {
        let mut load = LoadParams::new(model_id(&dir));
        load.draft_model = drafter.map(|d| model_id(&dir.join(d)));
        within_for(LIMIT, w.call::<Load>(&load)).await.unwrap();
        let mut ask = greedy_after_the_prompt();
        speculating(&mut ask, method);
        let first = answer(&w, &ask).await;
        assert_eq!(first.usage.draft_cached_tokens, 0, "{method}");
        ask.prompt_ids = Some((100..140).chain(200..208).collect());
        let next = answer(&w, &ask).await;
        let usage = (next.usage.cached_tokens, next.usage.draft_cached_tokens);
        assert_eq!(usage, (39, 39), "{drafter:?} {method}: {:?}", next.usage);
        assert!(next.usage.drafted_tokens > 0);
        ask.speculative = None;
        assert_eq!(answer(&w, &ask).await.text, next.text, "{drafter:?}");
    }
    assert_eq!(w.shutdown().await.unwrap().code(), Some(0));
}

/// After an image: Qwen2.5-VL and Qwen3-VL (their M-RoPE positions after the image's grid run
/// on from the prompt's) speculate with prompt lookup, the greedy answer as without drafts. A
/// bias keeps the random models to three tokens, so that drafts are found and taken, and which
/// of the three comes next still depends on every position before it.
#[tokio::test]
async fn qwen_vl_speculates_after_an_image_and_answers_the_same() {
    for name in ["tiny-qwen2.5-vl", "tiny-qwen3-vl"] {
        let Some(dir) = fixtures::vision_fixture(name) else {
            return;
        };
        let png = dir.parent().unwrap().join("images").join("gradient.png");
        let w = worker(&[]);
        within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(&dir))))
            .await
            .unwrap();
        let mut ask = GenerateParams::new(vec![ChatMessage {
            role: "user".into(),
            content: MessageContent::Parts(vec![
                ContentPart::Image {
                    image: model_id(&png),
                },
                ContentPart::Text {
                    text: "Repeat: the cat sat on the mat, the cat sat on the mat.".into(),
                },
            ]),
            extra: Default::default(),
        }]);
        (ask.max_new_tokens, ask.sampling.temperature) = (32, 0.0);
        ask.sampling.logit_bias = [("100", 50.0), ("200", 50.0), ("300", 50.0)]
            .into_iter()
            .map(|(id, bias)| (id.to_string(), bias))
            .collect();
        let plain = within_for(LIMIT, w.generate(&ask).unwrap().finish())
            .await
            .unwrap();
        ask.speculative = Some(
            serde_json::from_value(
                serde_json::json!({"method": "prompt_lookup", "num_draft_tokens": 4}),
            )
            .unwrap(),
        );
        let fast = within_for(LIMIT, w.generate(&ask).unwrap().finish())
            .await
            .unwrap();
        assert_eq!(fast.text, plain.text, "{name}");
        assert!(fast.usage.accepted_tokens > 0, "{name}: {:?}", fast.usage);
        assert!(
            fast.usage.drafted_tokens > fast.usage.accepted_tokens,
            "{name}: {:?}",
            fast.usage
        );
        assert_eq!(w.shutdown().await.unwrap().code(), Some(0));
    }
}

/// `auto` on a model with no head and no draft model is prompt lookup; with a quantized KV cache
/// (which cannot take positions back) it is nothing, and says why; a request for it then runs
/// one token per pass.
#[tokio::test]
async fn auto_names_prompt_lookup_or_nothing_with_the_reason() {
    let dir = tiny_model(&fixtures::TinyLlama::default());
    let w = worker(&[]);
    let load = LoadParams::new(model_id(dir.path()));
    let loaded = within_for(LIMIT, w.call::<Load>(&load)).await.unwrap();
    let auto = &loaded.info.speculative_auto;
    assert_eq!(
        auto.method,
        Some(SpeculativeMethod::PromptLookup),
        "{auto:?}"
    );
    assert!(auto.reason.contains("prompt lookup"), "{auto:?}");

    // Gemma 3's sliding-window layers keep a ring that forgets.
    if let Some(gemma3) = fixtures::vision_fixture("tiny-gemma3-vl") {
        let load = LoadParams::new(model_id(&gemma3));
        let loaded = within_for(LIMIT, w.call::<Load>(&load)).await.unwrap();
        let auto = &loaded.info.speculative_auto;
        assert_eq!(auto.method, None, "{auto:?}");
        assert!(auto.reason.contains("sliding-window"), "{auto:?}");
    }
    // SmolLM2's heads of 64 features take a quantized KV cache.
    let Some(smollm2) = fixtures::smollm2_dir() else {
        return;
    };
    let mut load = LoadParams::new(model_id(&smollm2));
    load.kv_bits = Some(8);
    let loaded = within_for(LIMIT, w.call::<Load>(&load)).await.unwrap();
    assert_eq!(loaded.info.kv_quantization.applied, Some(8));
    let auto = &loaded.info.speculative_auto;
    assert_eq!(auto.method, None, "{auto:?}");
    assert!(auto.reason.contains("kv_bits"), "{auto:?}");
    let mut ask = GenerateParams::new(vec![ChatMessage::new("user", "hi")]);
    ask.max_new_tokens = 8;
    ask.speculative = Some(serde_json::from_value(serde_json::json!({"method": "auto"})).unwrap());
    let result = within_for(LIMIT, w.generate(&ask).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(result.usage.drafted_tokens, 0);
    assert_eq!(w.shutdown().await.unwrap().code(), Some(0));
}

/// A damaged or mismatched DFlash drafter is bad input: a truncated weights file and a config
/// whose shapes its tensors do not have fail the load with `load_failed` naming the problem, a
/// drafter for layers the model lacks is `-32602` on `draft_model`; the model loaded before
/// answers as it did.
#[tokio::test]
async fn a_damaged_dflash_drafter_fails_its_load_and_nothing_else() {
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let w = worker(&[]);
    within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(&dir))))
        .await
        .unwrap();
    let mut ask = GenerateParams::new(vec![]);
    ask.prompt_ids = Some((100..120).collect());
    (ask.max_new_tokens, ask.sampling.temperature) = (8, 0.0);
    let before = within_for(LIMIT, w.generate(&ask).unwrap().finish())
        .await
        .unwrap();

    let copy = |edit: &dyn Fn(&std::path::Path)| {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["config.json", "model.safetensors"] {
            std::fs::copy(dir.join("dflash").join(name), tmp.path().join(name)).unwrap();
        }
        edit(tmp.path());
        tmp
    };
    let edit_config = |edit: fn(&mut serde_json::Value)| {
        move |path: &std::path::Path| {
            let file = path.join("config.json");
            let mut config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            edit(&mut config);
            std::fs::write(&file, config.to_string()).unwrap();
        }
    };
    let truncated = copy(&|path| {
        let file = path.join("model.safetensors");
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    });
    let more_heads = copy(&edit_config(|c| c["num_attention_heads"] = 8.into()));
    let other_layers = copy(&edit_config(|c| {
        c["dflash_config"]["target_layer_ids"] = serde_json::json!([0, 9])
    }));
    for (drafter, code, names) in [
        (&truncated, ErrorCode::LoadFailed, "safetensors"),
        (&more_heads, ErrorCode::LoadFailed, "q_proj"),
        (&other_layers, ErrorCode::InvalidParams, "target_layer_ids"),
    ] {
        let mut load = LoadParams::new(model_id(&dir));
        load.draft_model = Some(model_id(drafter.path()));
        let err = rpc_error(within_for(LIMIT, w.call::<Load>(&load)).await, code);
        let text = format!("{err:?}");
        assert!(text.contains(names), "{text}");
        let after = within_for(LIMIT, w.generate(&ask).unwrap().finish())
            .await
            .unwrap();
        assert_eq!(after.text, before.text);
    }
    assert_eq!(w.shutdown().await.unwrap().code(), Some(0));
    assert!(w.stray_stdout_lines().is_empty());
}
