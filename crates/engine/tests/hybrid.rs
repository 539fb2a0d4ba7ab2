//! Hybrid models: speculative decoding, whose rejected draft positions a recurrent layer takes
//! back to the state it recorded after the last accepted one, and the prompt cache (the tiny Qwen3-Next, LFM2, Nemotron-H, Granite 4.0-H and
//! Falcon-H1 parity fixtures, which `cargo xtask test` builds before the tests, or `cargo xtask parity
//! --model tiny-qwen3-next` and so on), in-process and greedy: their linear-attention layers'
//! recurrent states, short convolutions' windows and Mamba2 states cannot forget positions, so a kept cache is reused only by a
//! prompt that extends the tokens it holds, and then answers what a fresh engine answers. And on
//! Llama 4's chunked layers (`tiny-llama4`), which forget all but their chunk's positions.

use mlx_engine::{
    CancelToken, Completion, Drafts, Engine, FinishReason, GenerateRequest, LoadRequest, Prompt,
    Speculative,
};

/// The hybrid fixtures: gated delta-nets (Qwen3-Next, Qwen3.5), short convolutions (LFM2), Mamba2
/// (Nemotron-H, Granite 4.0-H, Falcon-H1), Kimi delta attention and Mamba.
const HYBRIDS: [&str; 8] = [
    "tiny-qwen3-next",
    "tiny-qwen3-5",
    "tiny-lfm2",
    "tiny-nemotron-h",
    "tiny-granite-hybrid",
    "tiny-falcon-h1",
    "tiny-kimi-linear",
    "tiny-mamba",
];

fn loaded(dir: &std::path::Path) -> Engine {
    loaded_in(Engine::new(), dir)
}

fn loaded_in(mut engine: Engine, dir: &std::path::Path) -> Engine {
    let load = LoadRequest {
        model: dir.display().to_string(),
        ..Default::default()
    };
    engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    engine
}

/// `request` (sampled with a seed, speculative) run twice from a cold cache: the same tokens,
/// and drafts were made.
fn sampled_twice_alike(engine: &mut Engine, request: &GenerateRequest) {
    let mut sampled = || {
        engine.reset(true);
        (engine.generate(request, &mut |_| {}, &CancelToken::new())).unwrap()
    };
    let (first, again) = (sampled(), sampled());
    assert_eq!(first.token_ids, again.token_ids);
    assert!(first.usage.drafted_tokens > 0, "{:?}", first.usage);
}

fn greedy(engine: &mut Engine, tokens: &[u32], max_new_tokens: usize) -> Completion {
    let request = GenerateRequest::greedy(Prompt::Tokens(tokens.to_vec()), max_new_tokens);
    engine
        .generate(&request, &mut |_| {}, &CancelToken::new())
        .unwrap()
}

/// Prompt lookup on every hybrid family: drafts copied from a prompt that repeats itself are
/// checked in one pass, the rejected positions are taken back from the recurrent states, and the
/// greedy output is token for token that of one token per pass.
#[test]
fn speculation_takes_back_rejected_positions_of_recurrent_layers() {
    let _mlx = fixtures::mlx_test_lock();
    let (mut drafted, mut accepted) = (0, 0);
    for name in HYBRIDS {
        let Some(dir) = fixtures::vision_fixture(name) else {
            continue;
        };
        let mut engine = loaded(&dir);
        // The prompt, its answer, the prompt again (and the answer's first token): lookup drafts
        // the answer, which the model follows for a while or not at all (its context changed).
        let prompt: Vec<u32> = (300..340).collect();
        let first = greedy(&mut engine, &prompt, 24);
        let again = [&prompt[..], &first.token_ids, &prompt[..]].concat();
        let mut model_drafted = 0;
        for prompt in [again.clone(), [&again[..], &first.token_ids[..1]].concat()] {
            engine.reset(true);
            let plain = greedy(&mut engine, &prompt, 48);
            for k in [1, 3, 6] {
                let mut request = GenerateRequest::greedy(Prompt::Tokens(prompt.clone()), 48);
                request.speculative = Some(Speculative {
                    method: Drafts::PromptLookup,
                    num_draft_tokens: Some(k),
                });
                engine.reset(true);
                let fast = engine
                    .generate(&request, &mut |_| {}, &CancelToken::new())
                    .unwrap();
                assert_eq!(fast.token_ids, plain.token_ids, "{name}, {k} drafts");
                model_drafted += fast.usage.drafted_tokens;
                drafted += fast.usage.drafted_tokens;
                accepted += fast.usage.accepted_tokens;
            }
        }
        assert!(model_drafted > 0, "{name} drafted nothing");
        eprintln!("{name}: drafted {drafted}, accepted {accepted} so far");
    }
    // Both paths ran: drafts taken whole and drafts cut back.
    assert!(
        0 < accepted && accepted < drafted,
        "{accepted} of {drafted}"
    );
}

/// Qwen3.5's own multi-token-prediction head (`mtp.*`, made with mlx-vlm's drafter class in the
/// tiny-qwen3-5 fixture) drafts from the model's hidden states: greedy output token for token
/// that of one token per pass, whatever the chain's length; a model without a head refuses
/// `mtp` by name.
#[test]
fn the_checkpoints_own_mtp_head_drafts_and_changes_nothing() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let mut engine = loaded(&dir);
    for prompt in [
        (100..140).collect::<Vec<u32>>(),
        (7..700).step_by(3).collect(),
    ] {
        engine.reset(true);
        let plain = greedy(&mut engine, &prompt, 48);
        for drafts in [None, Some(1), Some(4)] {
            let mut request = GenerateRequest::greedy(Prompt::Tokens(prompt.clone()), 48);
            request.speculative = Some(Speculative {
                method: Drafts::Mtp,
                num_draft_tokens: drafts,
            });
            engine.reset(true);
            let fast = engine
                .generate(&request, &mut |_| {}, &CancelToken::new())
                .unwrap();
            assert_eq!(fast.token_ids, plain.token_ids, "{drafts:?} drafts");
            let usage = &fast.usage;
            eprintln!("mtp {drafts:?}: {usage:?}");
            assert!(usage.drafted_tokens > 0, "{drafts:?}: {usage:?}");
            // Without a count, the head's one layer drafts two per pass (mlx-vlm's block).
            if drafts.is_none() {
                assert!(usage.drafted_tokens <= 2 * 48, "{usage:?}");
            }
        }
    }
    // Sampled: the head's guesses drawn from its distribution and judged by speculative
    // sampling's rule (`acceptance.rs`); the same seed, the same tokens. (This random head
    // agrees with its random model on nothing: every draft is refused, the residual drawn.)
    let mut request = GenerateRequest::greedy(Prompt::Tokens((100..140).collect()), 32);
    request.sampler.temperature = 1.0;
    request.sampler.seed = Some(3);
    request.speculative = Some(Speculative {
        method: Drafts::Mtp,
        num_draft_tokens: Some(3),
    });
    sampled_twice_alike(&mut engine, &request);

    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-next") else {
        return;
    };
    let mut other = loaded(&dir);
    let mut request = GenerateRequest::greedy(Prompt::Tokens((100..110).collect()), 4);
    request.speculative = Some(Speculative {
        method: Drafts::Mtp,
        num_draft_tokens: None,
    });
    let err = other
        .generate(&request, &mut |_| {}, &CancelToken::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("speculative.method") && err.contains("mtp"),
        "{err}"
    );
}

/// Every hybrid family: a prompt that extends the kept tokens reuses them all; one that leaves
/// them after the point where an earlier prompt's prefill ended (the same prompt again, a
/// rewritten last reply) resumes from the recurrent states kept there; one that leaves them
/// before starts over; each answers what a fresh engine answers.
#[test]
fn a_recurrent_state_is_reused_by_a_prompt_that_extends_it_and_answers_the_same() {
    let _mlx = fixtures::mlx_test_lock();
    for name in HYBRIDS {
        if let Some(dir) = fixtures::vision_fixture(name) {
            extends_or_starts_over(&dir);
        }
    }
}

fn extends_or_starts_over(dir: &std::path::Path) {
    let dir = dir.to_path_buf();
    let mut engine = loaded(&dir);
    let prompt: Vec<u32> = (100..140).collect();
    let first = greedy(&mut engine, &prompt, 6);
    assert_eq!(first.finish_reason, FinishReason::Length);
    assert_eq!(first.usage.cached_tokens, 0);

    // The prompt, the answer, more tokens: all that the cache holds is reused.
    let extended: Vec<u32> = [&prompt[..], &first.token_ids, &[500, 501, 502]].concat();
    let next = greedy(&mut engine, &extended, 8);
    assert_eq!(
        next.usage.cached_tokens,
        prompt.len() + first.token_ids.len()
    );
    assert_eq!(next.timings.prompt_n, 3);
    let mut fresh = loaded(&dir);
    let uncached = greedy(&mut fresh, &extended, 8);
    assert_eq!(uncached.usage.cached_tokens, 0);
    assert_eq!(next.token_ids, uncached.token_ids);

    // The same prompt again: its last token would have to be forgotten, which a recurrent
    // state cannot; it resumes from the states kept where the prompt's prefill ended.
    let again = greedy(&mut engine, &extended, 8);
    assert_eq!(again.usage.cached_tokens, extended.len() - 1);
    assert_eq!(again.token_ids, uncached.token_ids);

    // A prompt that leaves the kept answer (a chat template that re-renders the last reply):
    // it resumes where the first prompt's prefill ended.
    let rewritten: Vec<u32> = [&prompt[..], &[600, 601, 602, 603]].concat();
    let resumed = greedy(&mut engine, &rewritten, 8);
    assert_eq!(resumed.usage.cached_tokens, prompt.len() - 1);
    assert_eq!(
        resumed.token_ids,
        greedy(&mut fresh, &rewritten, 8).token_ids
    );

    // A prompt that leaves the kept tokens before any snapshot: computed from scratch.
    let diverging: Vec<u32> = [&extended[..20], &[7, 8, 9]].concat();
    let other = greedy(&mut engine, &diverging, 8);
    assert_eq!(other.usage.cached_tokens, 0);
    assert_eq!(other.token_ids, greedy(&mut fresh, &diverging, 8).token_ids);
}

/// Llama 4's chunked layers keep only their chunk's positions (16 in the tiny fixture): once
/// they have dropped one, a kept cache is reused only by a prompt that extends it, and answers
/// what a fresh engine answers.
#[test]
fn a_chunked_cache_is_cut_back_only_before_it_drops_a_position() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::vision_fixture("tiny-llama4") else {
        return;
    };
    let mut engine = loaded(&dir);
    let mut fresh = loaded(&dir);
    let prompt: Vec<u32> = (100..140).collect();
    let first = greedy(&mut engine, &prompt, 6);

    // Extending: everything kept is reused.
    let extended: Vec<u32> = [&prompt[..], &first.token_ids, &[500, 501, 502]].concat();
    let next = greedy(&mut engine, &extended, 8);
    assert_eq!(
        next.usage.cached_tokens,
        prompt.len() + first.token_ids.len()
    );
    assert_eq!(next.token_ids, greedy(&mut fresh, &extended, 8).token_ids);

    // The same prompt again: its last token would have to be cut from caches that have dropped
    // positions at the front, so nothing is reused.
    let again = greedy(&mut engine, &extended, 8);
    assert_eq!(again.usage.cached_tokens, 0);
    assert_eq!(again.token_ids, next.token_ids);

    // A short prompt (within one chunk, nothing dropped), then the same again: all but its last
    // token is reused.
    let short: Vec<u32> = (200..210).collect();
    let first = greedy(&mut engine, &short, 3);
    let same = greedy(&mut engine, &short, 3);
    assert_eq!(same.usage.cached_tokens, short.len() - 1);
    assert_eq!(same.token_ids, first.token_ids);

    // Sharing only the first 20 tokens with a kept conversation: nothing is reused, and the
    // answer is a fresh engine's.
    let diverging: Vec<u32> = [&extended[..20], &[7, 8, 9]].concat();
    let other = greedy(&mut engine, &diverging, 8);
    assert_eq!(other.usage.cached_tokens, 0);
    assert_eq!(other.token_ids, greedy(&mut fresh, &diverging, 8).token_ids);
}

/// A DFlash block drafter (the tiny-qwen3-5 fixture's `dflash/`, made with mlx-vlm's
/// `qwen3_dflash` class) loaded as `draft_model`: it drafts a block per pass from the model's
/// hidden states at its layers, and the greedy output is token for token that of one token per
/// pass; sampled, the same seed gives the same tokens. A drafter whose layers the model does not
/// have is refused at load, naming `draft_model`. (This random drafter agrees with its random
/// model on nothing: every round takes one token back into its context.)
#[test]
fn a_dflash_drafter_drafts_blocks_and_changes_nothing() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let drafter = dir.join("dflash").display().to_string();
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: dir.display().to_string(),
        draft_model: Some(drafter.clone()),
        ..Default::default()
    };
    engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    let prompt: Vec<u32> = (100..140).collect();
    let plain = greedy(&mut engine, &prompt, 24);
    let mut request = GenerateRequest::greedy(Prompt::Tokens(prompt), 24);
    for drafts in [None, Some(2)] {
        request.speculative = Some(Speculative {
            method: Drafts::DraftModel,
            num_draft_tokens: drafts,
        });
        engine.reset(true);
        let fast = (engine.generate(&request, &mut |_| {}, &CancelToken::new())).unwrap();
        assert_eq!(fast.token_ids, plain.token_ids, "{drafts:?} drafts");
        // Blocks of 4: three guesses a pass by default, never more than asked.
        let per_pass = drafts.unwrap_or(3);
        let usage = &fast.usage;
        assert!(
            usage.drafted_tokens >= 23 && usage.drafted_tokens <= per_pass * 23,
            "{usage:?}"
        );
    }
    request.sampler.temperature = 1.0;
    request.sampler.seed = Some(5);
    sampled_twice_alike(&mut engine, &request);

    let Some(mamba) = fixtures::vision_fixture("tiny-mamba") else {
        return;
    };
    let other = LoadRequest {
        model: mamba.display().to_string(),
        draft_model: Some(drafter),
        ..Default::default()
    };
    match Engine::new().load(&other, &mut |_| {}, &CancelToken::new()) {
        Err(mlx_engine::EngineError::InvalidParams { field, reason }) => {
            assert_eq!(field, "draft_model");
            assert!(reason.contains("target_layer_ids"), "{reason}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a drafter for layers the model does not have loaded"),
    }
}

/// The disk tier on every hybrid family and Llama 4's chunked layers: a conversation's caches
/// and recurrent-state snapshots written at exit and read back by a new engine give the next
/// turn every kept token (and a prompt leaving them the snapshot within its prefix), answering
/// as a fresh engine does.
#[test]
fn a_hybrid_conversation_resumes_from_disk_and_answers_the_same() {
    let _mlx = fixtures::mlx_test_lock();
    for name in HYBRIDS.iter().chain(&["tiny-llama4"]) {
        let Some(dir) = fixtures::vision_fixture(name) else {
            continue;
        };
        let cache = std::env::temp_dir().join(format!("mlx-disk-{name}-{}", std::process::id()));
        let with_disk = || {
            let disk = mlx_engine::DiskSettings {
                dir: cache.clone(),
                bytes: 1 << 30,
                write_bytes_per_hour: 1 << 32,
            };
            loaded_in(Engine::new().with_disk_cache(Some(disk)), &dir)
        };
        let prompt: Vec<u32> = (100..140).collect();
        let first = greedy(&mut with_disk(), &prompt, 6);
        // Dropped: its caches went to disk.
        let extended: Vec<u32> = [&prompt[..], &first.token_ids, &[500, 501, 502]].concat();
        let mut engine = with_disk();
        let next = greedy(&mut engine, &extended, 8);
        let held = prompt.len() + first.token_ids.len();
        assert_eq!(next.usage.cached_tokens, held, "{name}");
        let cold = greedy(&mut loaded(&dir), &extended, 8);
        assert_eq!(next.token_ids, cold.token_ids, "{name}");
        assert_eq!(engine.cache_stats().disk.unwrap().tier.hits, 1, "{name}");
        drop(engine);
        std::fs::remove_dir_all(&cache).unwrap();
        if !HYBRIDS.contains(name) {
            continue; // Llama 4's chunks, once past one, cannot be cut back (no snapshots).
        }
        // A rewritten last reply: the snapshot where the first prompt's prefill ended.
        greedy(&mut with_disk(), &prompt, 6);
        let rewritten: Vec<u32> = [&prompt[..], &[7, 8, 9]].concat();
        let again = greedy(&mut with_disk(), &rewritten, 8);
        assert!(again.usage.cached_tokens > 0, "{name}: {:?}", again.usage);
        let cold = greedy(&mut loaded(&dir), &rewritten, 8);
        assert_eq!(again.token_ids, cold.token_ids, "{name}");
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
