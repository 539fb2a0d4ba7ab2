//! Speculative decoding's drafters that read the model's hidden states, over real pipes: the tiny
//! Qwen3.5 fixture's own multi-token-prediction head and its DFlash companion (both made with
//! mlx-vlm's drafter classes by `cargo xtask parity`'s fixture builder), each answering what one
//! token per pass answers.

use crate::support::{model_id, within_for, worker};
use protocol::methods::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

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

    let mut ask = GenerateParams::new(vec![]);
    ask.prompt_ids = Some((100..140).collect());
    (ask.max_new_tokens, ask.sampling.temperature) = (24, 0.0);
    let plain = within_for(LIMIT, w.generate(&ask).unwrap().finish())
        .await
        .unwrap();
    for method in ["mtp", "draft_model"] {
        ask.speculative =
            Some(serde_json::from_value(serde_json::json!({ "method": method })).unwrap());
        let fast = within_for(LIMIT, w.generate(&ask).unwrap().finish())
            .await
            .unwrap();
        assert_eq!(fast.text, plain.text, "{method}");
        assert!(fast.usage.drafted_tokens > 0, "{method}: {:?}", fast.usage);
    }
    assert_eq!(w.shutdown().await.unwrap().code(), Some(0));
    assert!(w.stray_stdout_lines().is_empty());
}
