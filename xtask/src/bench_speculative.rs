//! `cargo xtask bench --speculative`: speculative decoding on an edit-this-text task. SmolLM2
//! rewrites the story of `prompts.json`'s long prompt with one name changed, greedily:
//! - the release worker with and without `speculative: prompt_lookup` (mlx-lm has no prompt
//!   lookup), alternating within each round;
//! - with `--draft-model`: the worker's `speculative: draft_model` beside mlx-lm's speculative
//!   `stream_generate` on the same pair (SmolLM2 drafting for itself unless a draft is given);
//!   then the chat's next turn (the rewrite as the assistant's message and a follow-up
//!   question), timed to its first token: the worker with drafts (the prompt cache kept the
//!   draft model's caches with the model's), without, and mlx-lm with drafts (every request
//!   from an empty cache, as its `stream_generate` runs).
//!
//! Medians, ratios, drafted/accepted, and whether every run's text is identical.

use std::path::{Path, PathBuf};

use protocol::methods::{
    ChatMessage, GenerateParams, GenerateResult, LoadParams, MessageContent, SpeculativeMethod,
    SpeculativeParams,
};
use serde_json::{json, Value};

use crate::bench::{median, BenchPrompt, MlxLm, Worker};
use crate::venv;

/// Tokens per run: enough to copy the first paragraphs of the story.
const MAX_NEW_TOKENS: u32 = 256;

/// The chat's next turn after the rewrite, and the tokens it runs to.
const FOLLOW_UP: &str = "Now write one sentence about Anna.";
const FOLLOW_UP_TOKENS: u32 = 32;

/// The next turn of `params`' chat, after `answer`.
fn next_turn(params: &GenerateParams, answer: &GenerateResult) -> GenerateParams {
    let mut messages = params.messages.clone();
    messages.push(ChatMessage::new("assistant", answer.text.clone()));
    messages.push(ChatMessage::new("user", FOLLOW_UP));
    GenerateParams {
        messages,
        max_new_tokens: FOLLOW_UP_TOKENS,
        ..params.clone()
    }
}

pub struct Options<'a> {
    pub model: &'a Path,
    pub story: &'a BenchPrompt,
    pub runs: u32,
    pub drafts: u32,
    /// Also compare draft-model decoding with mlx-lm's, this model drafting.
    pub draft_model: Option<PathBuf>,
    /// The worker binary.
    pub bin: PathBuf,
}

pub fn run(o: &Options) -> anyhow::Result<()> {
    let MessageContent::Text(content) = &o.story.messages[0].content else {
        anyhow::bail!("prompts.json: the long prompt's content must be a string");
    };
    let text = content
        .split_once("\n\n")
        .map_or(content.as_str(), |(_, t)| t);
    let ask = format!(
        "Rewrite the following text exactly as it is, but with the name Mara changed to \
         Anna:\n\n{text}"
    );
    let messages = vec![ChatMessage::new("user", ask)];
    let mut params = GenerateParams::new(messages.clone());
    params.max_new_tokens = MAX_NEW_TOKENS;
    params.sampling.temperature = 0.0;
    let with = |method| GenerateParams {
        speculative: Some(SpeculativeParams {
            method,
            num_draft_tokens: Some(o.drafts),
        }),
        ..params.clone()
    };
    let lookup = with(SpeculativeMethod::PromptLookup);
    let drafted = with(SpeculativeMethod::DraftModel);
    let bin = o.bin.clone();
    let mut reference = match &o.draft_model {
        Some(draft) => Some(MlxLm::start(
            &venv::reference_python()?,
            o.model,
            Some(draft),
            None,
        )?),
        None => None,
    };
    let request = json!({"messages": messages, "max_new_tokens": MAX_NEW_TOKENS,
                         "num_draft_tokens": o.drafts});
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let mut load = LoadParams::new(o.model.display().to_string());
        load.draft_model = o.draft_model.as_ref().map(|d| d.display().to_string());
        let worker = Worker::start_with(&bin, &load).await?;
        eprintln!("bench: warm-up");
        worker.fresh_generate(&params).await?;
        worker.fresh_generate(&lookup).await?;
        if let Some(mlx_lm) = &mut reference {
            worker.fresh_generate(&drafted).await?;
            mlx_lm.request(&request)?;
        }
        let (mut plain, mut fast, mut ours, mut theirs) = (vec![], vec![], vec![], vec![]);
        let mut next = NextTurns::default();
        for round in 1..=o.runs {
            eprintln!("bench: round {round}/{}", o.runs);
            plain.push(worker.fresh_generate(&params).await?);
            if reference.is_some() {
                // The plain chat's next turn, on the cache its first turn left.
                let ask = next_turn(&params, plain.last().expect("a run"));
                next.plain
                    .push(worker.client.generate(&ask)?.finish().await?);
            }
            fast.push(worker.fresh_generate(&lookup).await?);
            if let Some(mlx_lm) = &mut reference {
                ours.push(worker.fresh_generate(&drafted).await?);
                let ask = next_turn(&drafted, ours.last().expect("a run"));
                next.drafted
                    .push(worker.client.generate(&ask)?.finish().await?);
                theirs.push(mlx_lm.request(&request)?);
                let mut theirs_next = request.clone();
                theirs_next["messages"] = json!(ask.messages);
                theirs_next["max_new_tokens"] = json!(FOLLOW_UP_TOKENS);
                next.mlx_lm.push(mlx_lm.request(&theirs_next)?);
            }
        }
        worker.client.shutdown().await.ok();
        print_lookup(o.drafts, &plain, &fast);
        if reference.is_some() {
            print_draft(o, &plain, &ours, &theirs);
            print_next(&next);
        }
        anyhow::Ok(())
    })
}

fn tps(results: &[GenerateResult]) -> f64 {
    median(
        results
            .iter()
            .map(|r| r.timings.predicted_per_second)
            .collect(),
    )
}

fn print_lookup(drafts: u32, plain: &[GenerateResult], fast: &[GenerateResult]) {
    let (p, f) = (tps(plain), tps(fast));
    let last = fast.last().expect("at least one run");
    println!();
    println!(
        "SmolLM2-135M-Instruct, edit-this-text prompt ({} prompt tokens), greedy, at most \
         {MAX_NEW_TOKENS} new tokens, prompt lookup with at most {drafts} drafts per pass, \
         median of {} runs",
        last.usage.prompt_tokens,
        plain.len()
    );
    println!("| metric | one token per pass | prompt lookup | ratio |");
    println!("|---|---|---|---|");
    println!("| decode tok/s | {p:.1} | {f:.1} | {:.2}x |", f / p);
    println!(
        "| generated tokens | {} | {} | |",
        plain[0].usage.completion_tokens, last.usage.completion_tokens
    );
    println!(
        "| drafted / accepted | | {} / {} ({:.0} %) | |",
        last.usage.drafted_tokens,
        last.usage.accepted_tokens,
        100.0 * last.usage.accepted_tokens as f64 / last.usage.drafted_tokens.max(1) as f64
    );
    let same = plain.iter().chain(fast).all(|r| r.text == plain[0].text);
    println!("| identical text, every run | | {} | |", yes(same));
}

fn print_draft(o: &Options, plain: &[GenerateResult], ours: &[GenerateResult], theirs: &[Value]) {
    let (w, m) = (
        tps(ours),
        median(
            theirs
                .iter()
                .map(|a| a["generation_tps"].as_f64().unwrap_or(0.0))
                .collect(),
        ),
    );
    let draft = o.draft_model.as_ref().expect("a draft model");
    println!();
    println!(
        "The same request with a draft model ({}, at most {} drafts per pass): worker vs \
         mlx-lm's speculative stream_generate, median of {} runs",
        draft.display(),
        o.drafts,
        ours.len()
    );
    println!("| metric | worker | mlx-lm | ratio |");
    println!("|---|---|---|---|");
    println!("| decode tok/s | {w:.1} | {m:.1} | {:.2}x |", w / m);
    let last = ours.last().expect("at least one run");
    println!(
        "| accepted drafts | {} | {} | |",
        last.usage.accepted_tokens,
        theirs
            .last()
            .map_or(0, |a| a["from_draft"].as_u64().unwrap_or(0))
    );
    println!(
        "| worker: one token per pass, decode tok/s | {:.1} | | {:.2}x |",
        tps(plain),
        w / tps(plain)
    );
    let same = ours.iter().all(|r| r.text == plain[0].text)
        && theirs
            .iter()
            .all(|a| a["text"].as_str() == Some(plain[0].text.as_str()));
    println!(
        "| identical text, every run, both sides | {} | | |",
        yes(same)
    );
}

/// The chat's next turns, per round: the worker with and without drafts, mlx-lm with.
#[derive(Default)]
struct NextTurns {
    drafted: Vec<GenerateResult>,
    plain: Vec<GenerateResult>,
    mlx_lm: Vec<Value>,
}

fn print_next(next: &NextTurns) {
    let ttft = |r: &[GenerateResult]| median(r.iter().map(|r| r.timings.ttft_ms).collect());
    let theirs = median(
        next.mlx_lm
            .iter()
            .map(|a| a["ttft_ms"].as_f64().unwrap_or(0.0))
            .collect(),
    );
    let (ours, plain) = (ttft(&next.drafted), ttft(&next.plain));
    let last = next.drafted.last().expect("at least one run");
    println!();
    println!(
        "The chat's next turn (the rewrite as the assistant's message, then {FOLLOW_UP:?}; {} \
         prompt tokens, {FOLLOW_UP_TOKENS} new), time to first token, median of {} runs",
        last.usage.prompt_tokens,
        next.drafted.len()
    );
    println!("| metric | worker, draft model | worker, no drafts | mlx-lm, draft model |");
    println!("|---|---|---|---|");
    println!("| ttft ms | {ours:.0} | {plain:.0} | {theirs:.0} |");
    println!(
        "| prompt tokens reused (model / draft model) | {} / {} | {} / - | 0 / 0 |",
        last.usage.cached_tokens,
        last.usage.draft_cached_tokens,
        next.plain.last().map_or(0, |r| r.usage.cached_tokens)
    );
    println!(
        "| worker with drafts vs mlx-lm, ttft | {:.2}x faster | | |",
        theirs / ours
    );
    let same = next
        .drafted
        .iter()
        .zip(&next.plain)
        .all(|(a, b)| a.text == b.text);
    println!(
        "| identical text, with and without drafts | {} | | |",
        yes(same)
    );
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}
