//! `cargo xtask bench --constrained`: what a constraint costs. The release worker decodes the
//! same prompt with and without a JSON schema (llguidance's mask computed each step while the
//! forward pass runs), alternating within each round; medians and the ratio.

use std::path::Path;

use protocol::methods::{JsonSchemaFormat, ResponseFormat};
use serde_json::json;

use crate::bench::{median, BenchPrompt, Sample, Worker};

pub fn run(
    bin: &Path,
    model: &Path,
    prompt: &BenchPrompt,
    runs: u32,
    max: u32,
) -> anyhow::Result<()> {
    // A schema whose long string keeps the model writing for the whole budget (both sides
    // decode the same number of tokens).
    let schema = json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "story": {"type": "string", "minLength": 2000}
        },
        "required": ["title", "story"],
        "additionalProperties": false
    });
    let constrain = |p: &mut protocol::methods::GenerateParams| {
        p.response_format = Some(ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: "story".into(),
                description: None,
                schema: schema.clone(),
                strict: Some(true),
            },
        });
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let worker = Worker::start(bin, model).await?;
        eprintln!("bench: warm-up");
        worker.generate(prompt, 8).await?;
        worker.generate_with(prompt, 8, constrain).await?;
        let (mut free, mut json) = (Vec::new(), Vec::new());
        for round in 1..=runs {
            eprintln!("bench: round {round}/{runs}");
            free.push(worker.generate(prompt, max).await?);
            json.push(worker.generate_with(prompt, max, constrain).await?);
        }
        worker.client.shutdown().await.ok();
        print_table(prompt, max, &free, &json);
        anyhow::Ok(())
    })
}

fn print_table(prompt: &BenchPrompt, max: u32, free: &[Sample], json: &[Sample]) {
    println!();
    println!(
        "SmolLM2-135M-Instruct (float32), prompt `{}`, greedy, {max} new tokens, median of {} \
         runs; ratio = constrained / free for tok/s, free / constrained for ms",
        prompt.name,
        free.len()
    );
    println!("| metric | free text | JSON schema | ratio |");
    println!("|---|---|---|---|");
    type Get = fn(&Sample) -> f64;
    let rows: [(&str, Get, bool); 3] = [
        ("decode tok/s", |s| s.decode_tps, true),
        ("ttft ms", |s| s.ttft_ms, false),
        ("generated tokens", |s| s.generated as f64, true),
    ];
    for (name, get, higher_is_better) in rows {
        let f = median(free.iter().map(get).collect());
        let j = median(json.iter().map(get).collect());
        let ratio = if higher_is_better { j / f } else { f / j };
        println!("| {name} | {f:.1} | {j:.1} | {ratio:.2}x |");
    }
}
