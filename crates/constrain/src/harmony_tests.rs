//! Harmony on SmolLM2's tokenizer given harmony's seven marker tokens (special, as gpt-oss's):
//! detection, the token-id splitter, and the grammars of an answer and of a tool call.

use serde_json::json;
use tokenizers::Tokenizer;

use super::{Harmony, Opening, Part};
use crate::tests::{admits_after, weather_tool};
use crate::{Constraint, Reasoning, ToolSyntax, Vocabulary};

/// A template that writes harmony, as gpt-oss's does.
const TEMPLATE: &str = "{% for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant";

/// SmolLM2's tokenizer with harmony's markers (ids 3..=9), and its vocabulary with `eos`.
fn harmony_tokenizer(eos: &[u32]) -> Option<(Tokenizer, Vocabulary, Harmony)> {
    let dir = fixtures::smollm2_dir()?;
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    fixtures::rename_added_tokens(&mut json, &fixtures::HARMONY_TOKENS, true);
    let tokenizer: Tokenizer = json.to_string().parse().unwrap();
    let vocab = Vocabulary::new(&tokenizer, &eos.iter().copied().collect(), 49152).unwrap();
    let harmony = Harmony::detect(&tokenizer, Some(TEMPLATE)).expect("harmony detected");
    Some((tokenizer, vocab, harmony))
}

/// `text` (markers spelled out) split into (part, text) runs by the splitter, starting after
/// the generation prompt `<|start|>assistant`.
fn split(
    tokenizer: &Tokenizer,
    harmony: &Harmony,
    prompt: &str,
    text: &str,
) -> Vec<(Part, String)> {
    let ids = |text: &str| tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    let piece = |id: u32| tokenizer.decode(&[id], true).unwrap();
    let mut splitter = harmony.splitter(&ids(prompt), piece);
    let mut runs: Vec<(Part, String)> = Vec::new();
    for id in ids(text) {
        let part = splitter.push(id, &piece(id));
        match runs.last_mut() {
            Some((p, run)) if *p == part => run.push_str(&piece(id)),
            _ => runs.push((part, piece(id))),
        }
    }
    runs
}

#[test]
fn harmony_is_detected_from_tokens_and_template() {
    let Some((tokenizer, _, harmony)) = harmony_tokenizer(&[2]) else {
        return;
    };
    assert_eq!(
        ToolSyntax::of(&tokenizer, Some(TEMPLATE)),
        Some(ToolSyntax::Harmony(harmony))
    );
    // A template that does not write harmony, or a tokenizer without its tokens: not harmony.
    let chatml =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    assert_eq!(Harmony::detect(&tokenizer, Some(chatml)), None);
    assert_eq!(Harmony::detect(&tokenizer, None), None);
    let plain =
        Tokenizer::from_file(fixtures::smollm2_dir().unwrap().join("tokenizer.json")).unwrap();
    assert_eq!(Harmony::detect(&plain, Some(TEMPLATE)), None);
    assert_eq!(
        ToolSyntax::of(&plain, Some("<tool_call>")),
        Some(ToolSyntax::Hermes)
    );
}

#[test]
fn the_splitter_tells_reasoning_from_content_by_token_ids() {
    let Some((tokenizer, _, harmony)) = harmony_tokenizer(&[2]) else {
        return;
    };
    let prompt = "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant";
    let output = "<|channel|>analysis<|message|>User asks: simple arithmetic.<|end|>\
                  <|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>";
    let runs = split(&tokenizer, &harmony, prompt, output);
    let shown: Vec<_> = runs
        .iter()
        .filter(|(p, _)| *p != Part::Header)
        .map(|(p, t)| (*p, t.as_str()))
        .collect();
    assert_eq!(
        shown,
        [
            (Part::Reasoning, "User asks: simple arithmetic."),
            (Part::Content, "2 + 2 = 4.")
        ],
        "{runs:?}"
    );
    // The headers' text is structure, never shown; the markers have no text.
    let header: String = runs
        .iter()
        .filter(|(p, _)| *p == Part::Header)
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(header, "analysisassistantfinal");

    // A tool call's arguments are content; a preamble on `commentary` too.
    let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let runs = split(&tokenizer, &harmony, prompt, call);
    assert_eq!(
        runs.last().unwrap(),
        &(Part::Header, String::new()),
        "{runs:?}"
    );
    assert_eq!(
        runs[runs.len() - 2],
        (Part::Content, "{\"city\": \"Paris\"}".into())
    );

    // The prompt decides where the output starts: inside an analysis it opened, or (no
    // harmony message in it) in content.
    let opened = "<|start|>assistant<|channel|>analysis<|message|>";
    assert_eq!(
        split(&tokenizer, &harmony, opened, "Hmm")[0].0,
        Part::Reasoning
    );
    assert_eq!(
        split(&tokenizer, &harmony, "Hello", "Hi")[0].0,
        Part::Content
    );
}

#[test]
fn a_constraint_holds_only_the_final_message() {
    // `<|return|>` (8) an end-of-sequence id, as gpt-oss's, and not one.
    for eos in [&[8, 9, 2][..], &[2, 0]] {
        let Some((tokenizer, vocab, harmony)) = harmony_tokenizer(eos) else {
            return;
        };
        let end = if eos.contains(&8) { "" } else { "<|return|>" };
        let json = Constraint::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        );
        let reasoning = Reasoning::Harmony(harmony, Opening::Header);
        let admits = |text: &str| admits_after(&tokenizer, &vocab, &json, Some(&reasoning), text);
        let thought = "<|channel|>analysis<|message|>Hmm, {not json} yet.<|end|><|start|>assistant";
        let answer = format!("<|channel|>final<|message|>{{\"a\": 1}}{end}");
        assert!(admits(&format!("{thought}{answer}")), "eos {eos:?}");
        assert!(admits(&answer), "the analysis is optional");
        assert!(!admits(&format!(
            "{thought}<|channel|>final<|message|>nope{end}"
        )));
        assert!(
            !admits("{\"a\": 1}"),
            "the answer is a final message, not bare text"
        );
    }
}

#[test]
fn harmony_tool_calls_are_constrained_and_parsed() {
    for eos in [&[8, 9, 2][..], &[2, 0]] {
        let Some((tokenizer, vocab, harmony)) = harmony_tokenizer(eos) else {
            return;
        };
        let end = if eos.contains(&9) { "" } else { "<|call|>" };
        let constraint = Constraint::ToolCalls {
            syntax: ToolSyntax::Harmony(harmony),
            tools: vec![weather_tool()],
            only: None,
            parallel: true,
        };
        // The call carries its own analysis: no second wrap around it.
        let reasoning = Reasoning::Harmony(harmony, Opening::Header);
        let admits =
            |text: &str| admits_after(&tokenizer, &vocab, &constraint, Some(&reasoning), text);
        let call = format!("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{\"city\": \"Paris\"}}{end}");
        let thought = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant";
        assert!(admits(&call), "{call}");
        assert!(admits(&format!("{thought}{call}")));
        assert!(
            !admits(&call.replace("city", "town")),
            "arguments per schema"
        );
        assert!(
            !admits(&call.replace("get_weather", "get_time")),
            "a known tool"
        );
        assert!(
            !admits("<|channel|>final<|message|>Sunny."),
            "a call is forced"
        );
    }
    // Parsed from the output with its markers: the recipient in the channel or in the role.
    let text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant\
                <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let calls = Harmony::parse(text);
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].name.as_str(), calls[0].arguments.as_str()),
        ("get_weather", r#"{"city":"Paris"}"#)
    );
    let in_role = "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"zone\": \"UTC\"}";
    assert_eq!(Harmony::parse(in_role)[0].name, "get_time");
    assert!(Harmony::parse("<|channel|>final<|message|>{\"a\": 1}").is_empty());
    assert!(Harmony::parse(
        "<|start|>assistant<|channel|>commentary to=functions.f<|message|>not json"
    )
    .is_empty());
}

#[test]
fn the_opening_is_read_from_where_the_prompt_ends() {
    let Some((tokenizer, _, harmony)) = harmony_tokenizer(&[2]) else {
        return;
    };
    let ids = |text: &str| tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    let piece = |id: u32| tokenizer.decode(&[id], true).unwrap();
    let opening = |prompt: &str| harmony.splitter(&ids(prompt), piece).opening();
    let user = "<|start|>user<|message|>Hi<|end|>";
    assert_eq!(
        opening(&format!("{user}<|start|>assistant")),
        Opening::Header
    );
    assert_eq!(opening("Hello"), Opening::Header);
    for channel in ["analysis", "commentary"] {
        assert_eq!(
            opening(&format!(
                "{user}<|start|>assistant<|channel|>{channel}<|message|>"
            )),
            Opening::Message
        );
    }
    assert_eq!(
        opening(&format!(
            "{user}<|start|>assistant<|channel|>final<|message|>"
        )),
        Opening::Final
    );
}

#[test]
fn several_messages_may_come_before_the_constrained_one() {
    for eos in [&[8, 9, 2][..], &[2, 0]] {
        let Some((tokenizer, vocab, harmony)) = harmony_tokenizer(eos) else {
            return;
        };
        let (ret, call_end) = (
            if eos.contains(&8) { "" } else { "<|return|>" },
            if eos.contains(&9) { "" } else { "<|call|>" },
        );
        let json = Constraint::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        );
        let tools = Constraint::ToolCalls {
            syntax: ToolSyntax::Harmony(harmony),
            tools: vec![weather_tool()],
            only: None,
            parallel: false,
        };
        let admits = |constraint: &Constraint, opening: Opening, text: &str| {
            let reasoning = Reasoning::Harmony(harmony, opening);
            admits_after(&tokenizer, &vocab, constraint, Some(&reasoning), text)
        };
        let next = "<|end|><|start|>assistant";
        let analysis = format!("<|channel|>analysis<|message|>Think {{freely}}.{next}");
        let preamble = format!("<|channel|>commentary<|message|>Let me check.{next}");
        let answer = format!("<|channel|>final<|message|>{{\"a\": 1}}{ret}");
        let call = format!("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{\"city\": \"Paris\"}}{call_end}");

        // From a generation prompt's header: any analysis and commentary preambles first.
        let header = Opening::Header;
        assert!(admits(
            &json,
            header,
            &format!("{analysis}{preamble}{analysis}{answer}")
        ));
        assert!(admits(
            &tools,
            header,
            &format!("{analysis}{preamble}{call}")
        ));
        assert!(
            !admits(&json, header, &format!("{call}{answer}")),
            "a call is no preamble"
        );
        let eight = analysis.repeat(8);
        assert!(admits(&json, header, &format!("{eight}{answer}")));
        assert!(
            !admits(&json, header, &format!("{analysis}{eight}{answer}")),
            "at most 8 preambles"
        );
        assert!(!admits(
            &json,
            header,
            &format!("{preamble}<|channel|>final<|message|>no{ret}")
        ));

        // From inside a body the prompt opened: its rest, its end, then as from a header.
        let inside = Opening::Message;
        assert!(admits(
            &json,
            inside,
            &format!("more thought{next}{answer}")
        ));
        assert!(admits(&json, inside, &format!("{next}{preamble}{answer}")));
        assert!(admits(&tools, inside, &format!("more{next}{call}")));
        assert!(
            !admits(&json, inside, &answer),
            "the opened body ends first"
        );

        // Inside the final message the prompt opened: the rest of it is the constrained text.
        let in_final = Opening::Final;
        assert!(admits(&json, in_final, &format!("{{\"a\": 2}}{ret}")));
        assert!(!admits(&json, in_final, &answer));
        assert!(admits(&tools, in_final, &format!("Sure.{next}{call}")));
    }
}
