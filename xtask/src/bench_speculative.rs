//! `cargo xtask bench --speculative`: prompt lookup on an edit-this-text task. The release
//! worker rewrites the story of `prompts.json`'s long prompt with one name changed, greedily,
//! with and without `speculative: prompt_lookup`, alternating within each round; medians, the
//! ratio, the acceptance rate, and whether the two texts are identical.

use std::path::Path;

use protocol::methods::{
    ChatMessage, GenerateParams, GenerateResult, MessageContent, SpeculativeMethod,
    SpeculativeParams,
};

use crate::bench::{median, BenchPrompt, Worker};
use crate::worker_bin;

/// Tokens per run: enough to copy the first paragraphs of the story.
const MAX_NEW_TOKENS: u32 = 256;

pub fn run(model: &Path, story: &BenchPrompt, runs: u32, drafts: u32) -> anyhow::Result<()> {
    let MessageContent::Text(content) = &story.messages[0].content else {
        anyhow::bail!("prompts.json: the long prompt's content must be a string");
    };
    let text = content
        .split_once("\n\n")
        .map_or(content.as_str(), |(_, t)| t);
    let ask = format!(
        "Rewrite the following text exactly as it is, but with the name Mara changed to \
         Anna:\n\n{text}"
    );
    let mut params = GenerateParams::new(vec![ChatMessage::new("user", ask)]);
    params.max_new_tokens = MAX_NEW_TOKENS;
    params.temperature = 0.0;
    let mut lookup = params.clone();
    lookup.speculative = Some(SpeculativeParams {
        method: SpeculativeMethod::PromptLookup,
        num_draft_tokens: drafts,
    });
    let bin = worker_bin::build_release()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let worker = Worker::start(&bin, model).await?;
        eprintln!("bench: warm-up");
        worker.fresh_generate(&params).await?;
        worker.fresh_generate(&lookup).await?;
        let (mut plain, mut fast) = (Vec::new(), Vec::new());
        for round in 1..=runs {
            eprintln!("bench: round {round}/{runs}");
            plain.push(worker.fresh_generate(&params).await?);
            fast.push(worker.fresh_generate(&lookup).await?);
        }
        worker.client.shutdown().await.ok();
        print_table(drafts, &plain, &fast);
        anyhow::Ok(())
    })
}

fn print_table(drafts: u32, plain: &[GenerateResult], fast: &[GenerateResult]) {
    let tps =
        |r: &[GenerateResult]| median(r.iter().map(|r| r.timings.predicted_per_second).collect());
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
    println!(
        "| identical text, every run | | {} | |",
        if same { "yes" } else { "NO" }
    );
}
