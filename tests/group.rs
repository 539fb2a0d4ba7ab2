//! End-to-end: the worker as a group of ranks over MLX's ring backend on loopback (CPU), as
//! `cargo xtask launch` starts it: models split by pipeline and tensor parallel answer exactly
//! what one process answers; cancel, shutdown and a dead rank.

use std::time::Duration;

use crate::support::{greedy, model_id, ranks, rpc_error, tiny_model, within_for, worker, Ranks};
use fixtures::{
    smollm2_dir, vision_fixture, write_tiny_dora, write_tiny_lora, AdapterLayout, TinyLlama,
};
use protocol::methods::{
    FinishReason, GenerateParams, GenerateResult, Initialize, InitializeParams, Load, LoadParams,
    ParallelMode, Status, StatusParams, Unload, UnloadParams,
};
use protocol::{Client, ErrorCode};

/// Several processes share two slow cores (with other tests running beside them).
const LIMIT: Duration = Duration::from_secs(300);

fn questions() -> Vec<GenerateParams> {
    vec![
        greedy("What is the capital of France?", 40),
        greedy("Write a short poem about the sea and the wind.", 40),
    ]
}

/// Loads `model` (split as `parallel` asks) and answers each question.
async fn answers(
    w: &Client,
    model: &str,
    parallel: Option<ParallelMode>,
    questions: &[GenerateParams],
) -> Result<Vec<GenerateResult>, protocol::ClientError> {
    let mut params = LoadParams::new(model);
    params.parallel = parallel;
    answers_with(w, params, questions).await
}

/// Loads as `params` asks, answers each question, unloads.
async fn answers_with(
    w: &Client,
    params: LoadParams,
    questions: &[GenerateParams],
) -> Result<Vec<GenerateResult>, protocol::ClientError> {
    within_for(LIMIT, w.call::<Load>(&params)).await?;
    let mut out = Vec::new();
    for q in questions {
        out.push(within_for(LIMIT, w.generate(q).unwrap().finish()).await?);
    }
    within_for(LIMIT, w.call::<Unload>(&UnloadParams::default())).await?;
    Ok(out)
}

fn same_answers(alone: &[GenerateResult], split: &[GenerateResult], what: &str) {
    for (a, s) in alone.iter().zip(split) {
        assert_eq!(a.text, s.text, "{what}");
        assert_eq!(
            a.usage.completion_tokens, s.usage.completion_tokens,
            "{what}"
        );
        assert_eq!(a.finish_reason, s.finish_reason, "{what}");
    }
}

/// The split model's description: what each rank holds, and that together they hold it once
/// (each rank less than the whole: the embedding and head are on every rank).
async fn check_split(g: &Ranks, model: &str, mode: ParallelMode, whole_bytes: u64) {
    let mut params = LoadParams::new(model);
    params.parallel = Some(mode);
    let loaded = within_for(LIMIT, g.rank0.call::<Load>(&params))
        .await
        .unwrap();
    let split = loaded.info.parallel.expect("a split model says how");
    assert_eq!(split.mode, mode);
    assert_eq!(split.ranks.len(), g.followers.len() + 1);
    for r in &split.ranks {
        assert!(
            r.weight_bytes < whole_bytes * 3 / 4,
            "{r:?} of {whole_bytes}"
        );
    }
    if mode == ParallelMode::Pipeline {
        let layers: Vec<_> = split.ranks.iter().map(|r| r.layers).collect();
        assert_eq!(layers, [[0, 15], [15, 30]]);
    }
    let status = within_for(LIMIT, g.rank0.call::<Status>(&StatusParams::default()))
        .await
        .unwrap();
    assert_eq!(status.models[0].info.parallel.as_ref().unwrap().mode, mode);
    let group = status.group.expect("status names the group");
    assert_eq!((group.backend.as_str(), group.rank), ("ring", 0));
}

#[tokio::test]
async fn smollm2_split_over_ranks_answers_as_one_process() {
    let Some(dir) = smollm2_dir() else { return };
    let model = model_id(&dir);
    let alone = worker(&[]);
    let questions = questions();
    let expected = answers(&alone, &model, None, &questions).await.unwrap();
    let whole = within_for(LIMIT, alone.call::<Load>(&LoadParams::new(&model)))
        .await
        .unwrap()
        .memory
        .active_bytes;

    // Pipeline over two ranks: 15 of the 30 layers each.
    let g = ranks(2);
    let init = within_for(
        LIMIT,
        g.rank0.call::<Initialize>(&InitializeParams::default()),
    )
    .await
    .unwrap();
    let group = init.group.expect("initialize names the group");
    assert_eq!(
        (group.backend.as_str(), group.size, group.rank),
        ("ring", 2, 0)
    );
    let split = answers(&g.rank0, &model, Some(ParallelMode::Pipeline), &questions).await;
    same_answers(&expected, &split.unwrap(), "pipeline over 2 ranks");
    check_split(&g, &model, ParallelMode::Pipeline, whole).await;
    // Tensor parallel over two ranks cannot split SmolLM2's 9 heads: refused, and the group
    // goes on serving.
    let mut params = LoadParams::new(&model);
    params.parallel = Some(ParallelMode::Tensor);
    let refused = rpc_error(
        within_for(LIMIT, g.rank0.call::<Load>(&params)).await,
        ErrorCode::InvalidParams,
    );
    assert!(refused.message.contains("heads"), "{}", refused.message);
    let again = within_for(LIMIT, g.rank0.generate(&questions[0]).unwrap().finish()).await;
    assert_eq!(again.unwrap().text, expected[0].text);
    within_for(LIMIT, g.rank0.shutdown()).await.unwrap();

    // Tensor parallel over three ranks: 3 of the 9 heads and a third of each MLP each.
    let g = ranks(3);
    let split = answers(&g.rank0, &model, Some(ParallelMode::Tensor), &questions).await;
    same_answers(&expected, &split.unwrap(), "tensor over 3 ranks");
    check_split(&g, &model, ParallelMode::Tensor, whole).await;
    within_for(LIMIT, g.rank0.shutdown()).await.unwrap();
}

/// LoRA and DoRA adapters on a split model: each rank attaches the updates of what it holds (a
/// pipeline stage's layers; under tensor parallel its part of each split layer's `a` or `b`:
/// the adapter covers q and v, split by rows, and down, split by columns), and the split model
/// answers as one process with the same adapter, with it on and off. DoRA under tensor
/// parallel is refused by name.
#[tokio::test]
async fn adapters_on_a_split_model_answer_as_one_process() {
    let base = tiny_model(&TinyLlama::default());
    let base_id = model_id(base.path());
    let dir = tempfile::tempdir().unwrap();
    let (lora, dora) = (dir.path().join("lora"), dir.path().join("dora"));
    write_tiny_lora(&lora, 7, AdapterLayout::MlxLm, &base_id).unwrap();
    write_tiny_dora(&dora, 7, AdapterLayout::Peft, &base_id).unwrap();
    let ask = |use_adapter| {
        let mut q = greedy("Hello there, who are you?", 24);
        q.use_adapter = use_adapter;
        q
    };
    let questions = [ask(None), ask(Some(false))];
    let with_adapter = |adapter: &std::path::Path, parallel| {
        let mut params = LoadParams::new(&base_id);
        params.adapter = Some(model_id(adapter));
        params.parallel = parallel;
        params
    };
    let alone = worker(&[]);
    let g = ranks(2);
    let cases = [
        (&lora, ParallelMode::Pipeline),
        (&lora, ParallelMode::Tensor),
        (&dora, ParallelMode::Pipeline),
    ];
    for (adapter, mode) in cases {
        let what = format!("{} {mode:?}", adapter.display());
        let expected = answers_with(&alone, with_adapter(adapter, None), &questions).await;
        let expected = expected.unwrap();
        assert_ne!(
            expected[0].text, expected[1].text,
            "the adapter changes the text"
        );
        let split = answers_with(&g.rank0, with_adapter(adapter, Some(mode)), &questions).await;
        let split = split.unwrap_or_else(|e| panic!("{what}: {e}"));
        same_answers(&expected, &split, &what);
    }
    let refused = rpc_error(
        within_for(
            LIMIT,
            g.rank0
                .call::<Load>(&with_adapter(&dora, Some(ParallelMode::Tensor))),
        )
        .await,
        ErrorCode::LoadFailed,
    );
    assert!(refused.message.contains("DoRA"), "{}", refused.message);
    within_for(LIMIT, g.rank0.shutdown()).await.unwrap();
}

/// The tiny family fixtures (`cargo xtask parity` builds them with mlx-lm's classes): each
/// family split by pipeline answers as one process does; tensor parallel where the family's
/// layers split (dense attention and MLPs), a clear refusal where they do not.
#[tokio::test]
async fn family_fixtures_split_over_two_ranks_answer_as_one_process() {
    let pipeline = [
        "tiny-qwen3",
        "tiny-q4",
        "tiny-gemma3-window",
        "tiny-phi3-q4",
        "tiny-qwen3-moe-q4",
        "tiny-gpt-oss",
        "tiny-gpt-oss-mxfp4",
        "tiny-qwen3-next",
        "tiny-qwen3-5",
    ];
    let tensor = ["tiny-qwen3", "tiny-mistral", "tiny-untied"];
    let refused = ["tiny-qwen3-moe", "tiny-phi3-q4", "tiny-qwen3-next"];
    let Some(_) = vision_fixture(pipeline[0]) else {
        return;
    };
    let questions = vec![greedy("Hello there, who are you?", 24)];
    let alone = worker(&[]);
    let g = ranks(2);
    let cases = pipeline
        .iter()
        .map(|m| (m, ParallelMode::Pipeline))
        .chain(tensor.iter().map(|m| (m, ParallelMode::Tensor)));
    for (name, mode) in cases {
        let model = model_id(&vision_fixture(name).unwrap());
        let expected = answers(&alone, &model, None, &questions).await.unwrap();
        let split = answers(&g.rank0, &model, Some(mode), &questions).await;
        let split = split.unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
        same_answers(&expected, &split, &format!("{name} {mode:?}"));
    }
    // An untied head's vocabulary is split too: each rank holds half of it (the embedding
    // table, as large, stays whole), so a rank holds about three quarters of the model.
    let untied = model_id(&vision_fixture("tiny-untied").unwrap());
    let whole = within_for(LIMIT, alone.call::<Load>(&LoadParams::new(&untied)))
        .await
        .unwrap()
        .memory
        .active_bytes;
    let mut params = LoadParams::new(&untied);
    params.parallel = Some(ParallelMode::Tensor);
    let loaded = within_for(LIMIT, g.rank0.call::<Load>(&params))
        .await
        .unwrap();
    for r in &loaded.info.parallel.unwrap().ranks {
        assert!(r.weight_bytes * 5 < whole * 4, "{r:?} of {whole}");
    }
    for name in refused {
        let mut params = LoadParams::new(model_id(&vision_fixture(name).unwrap()));
        params.parallel = Some(ParallelMode::Tensor);
        let e = rpc_error(
            within_for(LIMIT, g.rank0.call::<Load>(&params)).await,
            ErrorCode::InvalidParams,
        );
        assert!(e.message.contains("pipeline"), "{name}: {}", e.message);
    }
    within_for(LIMIT, g.rank0.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_group_cancels_in_step_and_answers_errors_once_a_rank_dies() {
    let Some(dir) = smollm2_dir() else { return };
    let mut g = ranks(2);
    let mut params = LoadParams::new(model_id(&dir));
    params.parallel = Some(ParallelMode::Pipeline);
    within_for(LIMIT, g.rank0.call::<Load>(&params))
        .await
        .unwrap();

    // Cancelled in the middle of the decode: every rank stops at the same step.
    let mut long = g
        .rank0
        .generate(&greedy("Tell me a very long story.", 2000))
        .unwrap();
    within_for(LIMIT, long.next_delta())
        .await
        .expect("a first delta");
    within_for(LIMIT, g.rank0.cancel(long.id())).await.unwrap();
    let cancelled = within_for(LIMIT, long.finish()).await.unwrap();
    assert_eq!(cancelled.finish_reason, FinishReason::Cancelled);
    // ... and in the middle of a prefill (a prompt of several chunks).
    let story = "The old lighthouse keeper counted the ships every night. ".repeat(120);
    let prefill = g.rank0.generate(&greedy(&story, 20)).unwrap();
    within_for(LIMIT, g.rank0.cancel(prefill.id()))
        .await
        .unwrap();
    let cancelled = within_for(LIMIT, prefill.finish()).await.unwrap();
    assert_eq!(cancelled.finish_reason, FinishReason::Cancelled);
    // The ranks are still in step.
    let answer = within_for(
        LIMIT,
        g.rank0
            .generate(&greedy("What is 2 + 2?", 8))
            .unwrap()
            .finish(),
    )
    .await
    .unwrap();
    assert_eq!(answer.usage.completion_tokens, 8);

    // A rank dies: rank 0 answers errors, quickly, and goes on answering the host.
    let mut dead = g.followers.remove(0);
    dead.kill().unwrap();
    dead.wait().unwrap();
    let failed = within_for(
        Duration::from_secs(20),
        g.rank0
            .generate(&greedy("What is 2 + 2?", 8))
            .unwrap()
            .finish(),
    )
    .await;
    let e = rpc_error(failed, ErrorCode::InternalError);
    assert!(e.message.contains("rank"), "{}", e.message);
    let status = within_for(LIMIT, g.rank0.call::<Status>(&StatusParams::default())).await;
    assert!(status.is_ok());
    within_for(LIMIT, g.rank0.shutdown()).await.unwrap();
}

#[tokio::test]
async fn shutdown_ends_every_rank() {
    let mut g = ranks(3);
    within_for(
        LIMIT,
        g.rank0.call::<Initialize>(&InitializeParams::default()),
    )
    .await
    .unwrap();
    let status = within_for(LIMIT, g.rank0.shutdown()).await.unwrap();
    assert!(status.success());
    for f in &mut g.followers {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(exit) = f.try_wait().unwrap() {
                assert!(exit.success(), "{exit:?}");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a follower outlived rank 0"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[tokio::test]
async fn parallel_without_a_group_is_refused() {
    let dir = crate::support::tiny_model(&fixtures::TinyLlama::default());
    let w = worker(&[]);
    let mut params = LoadParams::new(model_id(dir.path()));
    params.parallel = Some(ParallelMode::Pipeline);
    let e = rpc_error(
        within_for(LIMIT, w.call::<Load>(&params)).await,
        ErrorCode::InvalidParams,
    );
    assert!(e.message.contains("group of ranks"), "{}", e.message);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_rank_that_stops_answering_breaks_the_group_within_its_timeout() {
    let dir = crate::support::tiny_model(&fixtures::TinyLlama::default());
    let g = crate::support::ranks_with(2, &["--group-timeout-secs", "3"]);
    let mut params = LoadParams::new(model_id(dir.path()));
    params.parallel = Some(ParallelMode::Pipeline);
    within_for(LIMIT, g.rank0.call::<Load>(&params))
        .await
        .unwrap();
    let first = within_for(LIMIT, g.rank0.generate(&greedy("Hi", 4)).unwrap().finish()).await;
    assert_eq!(first.unwrap().usage.completion_tokens, 4);

    // Stopped, not dead: its sockets stay open, so only the timeout can tell.
    let follower = g.followers[0].id().to_string();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &follower])
            .status();
        assert!(status.unwrap().success());
    };
    signal("-STOP");
    let started = std::time::Instant::now();
    let stuck = within_for(
        Duration::from_secs(30),
        g.rank0.generate(&greedy("Hi", 200)).unwrap().finish(),
    )
    .await;
    let e = rpc_error(stuck, ErrorCode::InternalError);
    assert!(e.message.contains("stopped answering"), "{}", e.message);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // From then on the group is broken: answered at once, and the host is still heard.
    let again = within_for(
        Duration::from_secs(5),
        g.rank0.generate(&greedy("Hi", 4)).unwrap().finish(),
    )
    .await;
    rpc_error(again, ErrorCode::InternalError);
    let status = within_for(LIMIT, g.rank0.call::<Status>(&StatusParams::default())).await;
    assert!(status.is_ok());
    signal("-CONT");
    within_for(LIMIT, g.rank0.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_load_that_fails_on_one_rank_is_kept_by_none() {
    // A relative path that only rank 0's working directory holds.
    let root = tempfile::tempdir().unwrap();
    fixtures::write_tiny_llama(
        &root.path().join("only-here"),
        &fixtures::TinyLlama::default(),
    )
    .unwrap();
    let g = crate::support::ranks_where(2, &[], Some(root.path()));
    let mut params = LoadParams::new("only-here");
    params.parallel = Some(ParallelMode::Pipeline);
    let e = rpc_error(
        within_for(LIMIT, g.rank0.call::<Load>(&params)).await,
        ErrorCode::LoadFailed,
    );
    assert!(e.message.contains("rank 1"), "{}", e.message);
    let status = within_for(LIMIT, g.rank0.call::<Status>(&StatusParams::default()))
        .await
        .unwrap();
    assert!(status.models.is_empty(), "{:?}", status.models);
    // Both ranks can load it by its full path, and still run in step.
    let mut params = LoadParams::new(model_id(&root.path().join("only-here")));
    params.parallel = Some(ParallelMode::Pipeline);
    within_for(LIMIT, g.rank0.call::<Load>(&params))
        .await
        .unwrap();
    let answer = within_for(LIMIT, g.rank0.generate(&greedy("Hi", 4)).unwrap().finish()).await;
    assert_eq!(answer.unwrap().usage.completion_tokens, 4);
    // The same prompt again reuses the ranks' caches of it, in step.
    let again = within_for(LIMIT, g.rank0.generate(&greedy("Hi", 4)).unwrap().finish()).await;
    let usage = again.unwrap().usage;
    assert!(usage.cached_tokens > 0, "{usage:?}");
    assert_eq!(usage.completion_tokens, 4);
    within_for(LIMIT, g.rank0.shutdown()).await.unwrap();
}
