//! The prompt cache on hybrid models (the tiny Qwen3-Next, LFM2, Nemotron-H, Granite 4.0-H and
//! Falcon-H1 parity fixtures, which `cargo xtask test` builds before the tests, or `cargo xtask parity
//! --model tiny-qwen3-next` and so on), in-process and greedy: their linear-attention layers'
//! recurrent states, short convolutions' windows and Mamba2 states cannot forget positions, so a kept cache is reused only by a
//! prompt that extends the tokens it holds, and then answers what a fresh engine answers. And on
//! Llama 4's chunked layers (`tiny-llama4`), which forget all but their chunk's positions.

use mlx_engine::{
    CancelToken, Completion, Engine, FinishReason, GenerateRequest, LoadRequest, Prompt,
};

fn loaded(dir: &std::path::Path) -> Engine {
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: dir.display().to_string(),
        ..Default::default()
    };
    engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    engine
}

fn greedy(engine: &mut Engine, tokens: &[u32], max_new_tokens: usize) -> Completion {
    let request = GenerateRequest::greedy(Prompt::Tokens(tokens.to_vec()), max_new_tokens);
    engine
        .generate(&request, &mut |_| {}, &CancelToken::new())
        .unwrap()
}

#[test]
fn a_recurrent_state_is_reused_by_a_prompt_that_extends_it_and_answers_the_same() {
    let _mlx = fixtures::mlx_test_lock();
    let names = [
        "tiny-qwen3-next",
        "tiny-lfm2",
        "tiny-nemotron-h",
        "tiny-granite-hybrid",
        "tiny-falcon-h1",
        "tiny-kimi-linear",
        "tiny-mamba",
    ];
    for name in names {
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

    // The same prompt again: its last token would have to be forgotten, so nothing is reused.
    let again = greedy(&mut engine, &extended, 8);
    assert_eq!(again.usage.cached_tokens, 0);
    assert_eq!(again.token_ids, uncached.token_ids);

    // A prompt that leaves the kept tokens (shares only their start): computed from scratch.
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
