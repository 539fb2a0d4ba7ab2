//! Arbitrary text as a chat template, rendered over a small conversation: it renders or fails
//! with an error; fuel ends templates that loop (a template that doubles a string until memory
//! runs out is a known limit: docs/reliability.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use text::{ChatTemplate, Message, RenderOptions, SpecialTokens};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let special = SpecialTokens {
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
        ..Default::default()
    };
    let Ok(template) = ChatTemplate::new(source, special) else {
        return;
    };
    let messages = [
        Message::text("system", "Be brief."),
        Message::text("user", "hi"),
        Message::text("assistant", "hello"),
        Message::text("user", "and?"),
    ];
    let _ = template.render(&messages, &RenderOptions::default());
});
