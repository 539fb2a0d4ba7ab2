//! The real SmolLM2-135M-Instruct (imported by `cargo xtask setup`), greedy, in-process.

use std::path::Path;

use mlx_engine::{
    text, CancelToken, Completion, Constraint, Engine, GenerateRequest, LoadRequest, Loaded, Prompt,
};

/// Loads the model directory `model` and asks the capital of France, greedily.
fn ask_capital(model: &Path) -> (Loaded, Completion, String) {
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: model.display().to_string(),
        ..Default::default()
    };
    let loaded = engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    let question = GenerateRequest::greedy(
        Prompt::Chat {
            messages: vec![text::Message::text(
                "user",
                "What is the capital of France?",
            )],
            options: text::RenderOptions::default(),
        },
        20,
    );
    let mut deltas = String::new();
    let out = engine
        .generate(
            &question,
            &mut |d| deltas.push_str(&d.text),
            &CancelToken::new(),
        )
        .unwrap();
    (loaded, out, deltas)
}

#[test]
fn greedy_answer_names_paris() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let (loaded, out, deltas) = ask_capital(&dir);
    assert_eq!(loaded.info.architecture, "llama");
    assert_eq!(loaded.info.vocab_size, 49152);
    assert!(out.text.contains("Paris"), "{:?}", out.text);
    assert_eq!(deltas, out.text);
}

/// A greedy chat request of one user message.
fn chat(content: impl Into<String>, max_new_tokens: usize) -> GenerateRequest {
    GenerateRequest::greedy(
        Prompt::Chat {
            messages: vec![text::Message::text("user", content)],
            options: text::RenderOptions::default(),
        },
        max_new_tokens,
    )
}

/// An engine with the real SmolLM2 loaded, or `None` when it is not there.
fn smollm2_engine() -> Option<Engine> {
    let dir = fixtures::smollm2_dir()?;
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: dir.display().to_string(),
        ..Default::default()
    };
    engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    Some(engine)
}

/// Generates `req` from an empty prompt cache.
fn fresh(engine: &mut Engine, req: &GenerateRequest) -> Completion {
    engine.reset(true);
    engine
        .generate(req, &mut |_| {}, &CancelToken::new())
        .unwrap()
}

/// Prompt lookup on an edit-this-text task: drafts copied from the prompt are confirmed by the
/// model, and the greedy output is the same as one token per pass.
#[test]
fn prompt_lookup_drafts_are_accepted_and_change_nothing() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(mut engine) = smollm2_engine() else {
        return;
    };
    let text = "The quick brown fox jumps over the lazy dog. It was a sunny day in the small \
                village, and the children were playing in the park near the old church.";
    let ask = format!("Repeat this text exactly, replacing 'fox' with 'cat':\n\n{text}");
    let mut req = chat(ask, 48);
    let plain = fresh(&mut engine, &req);
    for k in [1, 4, 10] {
        req.speculative = Some(mlx_engine::Speculative {
            method: mlx_engine::Drafts::PromptLookup,
            num_draft_tokens: Some(k),
        });
        let fast = fresh(&mut engine, &req);
        assert_eq!(
            fast.token_ids, plain.token_ids,
            "{k} drafts: {:?}",
            fast.text
        );
        assert_eq!(fast.finish_reason, plain.finish_reason);
        assert!(fast.usage.drafted_tokens > 0, "{:?}", fast.usage);
        assert!(
            fast.usage.accepted_tokens * 2 > fast.usage.drafted_tokens,
            "{k} drafts: {:?}",
            fast.usage
        );
    }
    assert_eq!(plain.usage.drafted_tokens, 0);
}

/// Prompt lookup under constraints: the grammar follows each draft to mask every position, cuts
/// drafts where it refuses a token (the regex below refuses the commas the prompt offers) and
/// rolls back; the output is token for token what one-token steps give.
#[test]
fn constrained_prompt_lookup_changes_nothing() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(mut engine) = smollm2_engine() else {
        return;
    };
    let record = r#"{"name": "Ada Lovelace", "born": 1815, "city": "London", "fields": ["mathematics", "computing"]}"#;
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "born": {"type": "integer", "maximum": 3000},
            "city": {"type": "string"},
            "fields": {"type": "array", "items": {"type": "string"}, "maxItems": 4}
        },
        "required": ["name", "born", "city", "fields"],
        "additionalProperties": false
    });
    let cases = [
        (
            format!("Repeat this JSON exactly:\n{record}"),
            Constraint::JsonSchema(schema),
        ),
        (
            "Repeat exactly: the quick brown fox, the lazy dog, the quick brown fox, the lazy dog."
                .to_string(),
            Constraint::Regex("[a-z ]{1,80}".into()),
        ),
    ];
    for (ask, constraint) in cases {
        let mut req = chat(ask, 48);
        req.constraint = Some(constraint);
        let plain = fresh(&mut engine, &req);
        req.speculative = Some(mlx_engine::Speculative {
            method: mlx_engine::Drafts::PromptLookup,
            num_draft_tokens: Some(6),
        });
        let fast = fresh(&mut engine, &req);
        assert_eq!(fast.token_ids, plain.token_ids, "{:?}", fast.text);
        assert_eq!(fast.finish_reason, plain.finish_reason);
        assert!(
            fast.usage.accepted_tokens > 0,
            "{:?} {:?}",
            fast.usage,
            fast.text
        );
    }
}

/// A draft model: SmolLM2 in float32 (as `cargo xtask setup` imported it from its Q4_1 GGUF)
/// drafts for the same model quantized to 4 bits on load (the same vocabulary, slightly
/// different numbers); greedy output is the same as without. A draft model with another
/// vocabulary is refused at load, naming `draft_model`.
#[test]
fn a_draft_model_drafts_and_changes_nothing() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: dir.display().to_string(),
        load_in_4bit: true,
        draft_model: Some(dir.display().to_string()),
        ..Default::default()
    };
    engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    let mut req = chat("Write a short poem about the sea.", 40);
    let plain = fresh(&mut engine, &req);
    req.speculative = Some(mlx_engine::Speculative {
        method: mlx_engine::Drafts::DraftModel,
        num_draft_tokens: Some(3),
    });
    let fast = fresh(&mut engine, &req);
    assert_eq!(fast.token_ids, plain.token_ids, "{:?}", fast.text);
    // Some drafts taken, some rejected (the two differ in their numbers): both paths ran.
    let (drafted, accepted) = (fast.usage.drafted_tokens, fast.usage.accepted_tokens);
    assert!(0 < accepted && accepted < drafted, "{:?}", fast.usage);
    // The same under a JSON object constraint: the draft model's tokens pass the grammar first.
    req.constraint = Some(Constraint::JsonObject);
    req.speculative = None;
    let plain = fresh(&mut engine, &req);
    req.speculative = Some(mlx_engine::Speculative {
        method: mlx_engine::Drafts::DraftModel,
        num_draft_tokens: Some(3),
    });
    let fast = fresh(&mut engine, &req);
    assert_eq!(fast.token_ids, plain.token_ids, "{:?}", fast.text);
    assert!(fast.usage.accepted_tokens > 0, "{:?}", fast.usage);
    req.constraint = None;

    // Sampled: drafts drawn from the draft model's distribution, kept by the ratio of the two
    // models' probabilities (`acceptance.rs` proves the output distribution on its own); the
    // same seed gives the same tokens.
    req.sampler = mlx_engine::Sampling {
        temperature: 1.0,
        seed: Some(7),
        ..mlx_engine::Sampling::default()
    };
    req.max_new_tokens = 60;
    let sampled = fresh(&mut engine, &req);
    let (drafted, accepted) = (sampled.usage.drafted_tokens, sampled.usage.accepted_tokens);
    assert!(
        drafted > 20 && accepted * 4 > drafted,
        "{:?}",
        sampled.usage
    );
    assert_eq!(fresh(&mut engine, &req).token_ids, sampled.token_ids);
    req.sampler = mlx_engine::Sampling::greedy();

    let Some(gemma) = fixtures::gemma3_dir() else {
        return;
    };
    let other = LoadRequest {
        draft_model: Some(gemma.display().to_string()),
        force: true,
        ..load
    };
    match engine.load(&other, &mut |_| {}, &CancelToken::new()) {
        Err(mlx_engine::EngineError::InvalidParams { field, reason }) => {
            assert_eq!(field, "draft_model");
            assert!(reason.contains("vocabulary"), "{reason}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a draft model with another vocabulary loaded"),
    }
}
