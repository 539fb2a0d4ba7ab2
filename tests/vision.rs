//! End-to-end with a vision-language model: the tiny random Gemma 3 (a SigLIP tower, 112 px
//! images, 16 image tokens) that `cargo xtask parity` builds with mlx-vlm's own classes and checks
//! token for token against mlx-vlm. Here, through the binary: every way an image can arrive,
//! several images, the prompt cache across images, and bad images, each a clear -32602 after
//! which the worker goes on. And a tiny LLaVA (`tiny-llava`, a CLIP tower on a Llama) answering an
//! image question, a tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL (`tiny-qwen2-vl`, `tiny-qwen2.5-vl`,
//! `tiny-qwen3-vl`) answering a second question about an image from the prompt cache, a tiny Idefics3 (`tiny-idefics3`) one about an image split
//! into tiles, and an image's encoder output kept for the next question about it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use protocol::error::InvalidParamsData;
use protocol::methods::{
    ChatMessage, ContentPart, GenerateParams, GenerateResult, ImageUrl, Initialize,
    InitializeParams, Load, LoadParams, MessageContent,
};
use protocol::{Client, ErrorCode};
use serde_json::Map;

use crate::support::{model_id, rpc_error, tiny_model, within_for, worker};

const LIMIT: Duration = Duration::from_secs(120);
/// Image tokens per image of the fixture (`mm_tokens_per_image`).
const IMAGE_TOKENS: u64 = 16;

/// A vision fixture (`xtask/parity/cases.json`) and the directory of the case images.
fn fixture(name: &str) -> Option<(PathBuf, PathBuf)> {
    let dir = fixtures::vision_fixture(name)?;
    let images = dir.parent().expect("a parent").join("images");
    Some((dir, images))
}

fn user(parts: Vec<ContentPart>) -> ChatMessage {
    ChatMessage {
        role: "user".into(),
        content: MessageContent::Parts(parts),
        extra: Map::new(),
    }
}

fn image(source: impl Into<String>) -> ContentPart {
    ContentPart::Image {
        image: source.into(),
    }
}

fn text(t: &str) -> ContentPart {
    ContentPart::Text { text: t.into() }
}

fn greedy(messages: Vec<ChatMessage>) -> GenerateParams {
    let mut p = GenerateParams::new(messages);
    p.max_new_tokens = 8;
    p.sampling.temperature = 0.0;
    p
}

async fn generate(w: &Client, p: &GenerateParams) -> GenerateResult {
    within_for(LIMIT, w.generate(p).unwrap().finish())
        .await
        .expect("generate")
}

fn base64_of(path: &Path) -> String {
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).expect("read image"))
}

async fn loaded(w: &Client, dir: &Path, architecture: &str) {
    let loaded = within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(dir))))
        .await
        .expect("load the vision fixture");
    assert!(loaded.info.is_vision);
    assert_eq!(loaded.info.architecture, architecture);
}

#[tokio::test]
async fn every_image_source_gives_the_same_answer() {
    let Some((dir, images)) = fixture("tiny-gemma3-vl") else {
        return;
    };
    let w = worker(&[]);
    let init = within_for(LIMIT, w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    assert!(init.capabilities.vision);
    assert!(init
        .capabilities
        .architectures
        .iter()
        .any(|a| a == "gemma3"));
    loaded(&w, &dir, "gemma3").await;

    let png = images.join("gradient.png");
    let question = "What is in this picture?";
    let by_path = generate(
        &w,
        &greedy(vec![user(vec![image(model_id(&png)), text(question)])]),
    )
    .await;
    // The prompt holds the image's tokens, between `<start_of_image>` and `<end_of_image>`.
    let text_only = generate(&w, &greedy(vec![ChatMessage::new("user", question)])).await;
    assert_eq!(
        by_path.usage.prompt_tokens,
        text_only.usage.prompt_tokens + IMAGE_TOKENS + 3,
        "16 image tokens, `<start_of_image>`, `<end_of_image>` and a newline token"
    );

    let b64 = base64_of(&png);
    let mut sources = vec![
        (
            "base64",
            greedy(vec![user(vec![image(b64.clone()), text(question)])]),
        ),
        (
            "data URL",
            greedy(vec![user(vec![
                image(format!("data:image/png;base64,{b64}")),
                text(question),
            ])]),
        ),
        (
            "image_url",
            greedy(vec![user(vec![
                ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: format!("data:image/png;base64,{b64}"),
                    },
                },
                text(question),
            ])]),
        ),
    ];
    // The seed's interface: one `image`, put first in the last user message.
    let mut lone = greedy(vec![ChatMessage::new("user", question)]);
    lone.image = Some(model_id(&png));
    sources.push(("image param", lone));
    for (what, p) in sources {
        let r = generate(&w, &p).await;
        assert_eq!(r.text, by_path.text, "{what}");
        assert_eq!(r.usage.prompt_tokens, by_path.usage.prompt_tokens, "{what}");
    }

    // Another image, another answer: the pixels reach the model.
    let noise = images.join("noise.jpg");
    let other = generate(
        &w,
        &greedy(vec![user(vec![image(model_id(&noise)), text(question)])]),
    )
    .await;
    assert_ne!(other.text, by_path.text);

    // Two images in one message: both expanded.
    let two = generate(
        &w,
        &greedy(vec![user(vec![
            image(model_id(&png)),
            image(model_id(&noise)),
            text(question),
        ])]),
    )
    .await;
    assert!(two.usage.prompt_tokens >= by_path.usage.prompt_tokens + IMAGE_TOKENS + 2);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn the_prompt_cache_reuses_an_image_only_for_that_image() {
    let Some((dir, images)) = fixture("tiny-gemma3-vl") else {
        return;
    };
    let w = worker(&[]);
    loaded(&w, &dir, "gemma3").await;
    let (a, b) = (images.join("gradient.png"), images.join("noise.jpg"));
    let turn = |img: &Path, reply: &str| {
        greedy(vec![
            user(vec![image(model_id(img)), text("What is this?")]),
            ChatMessage::new("assistant", reply),
            ChatMessage::new("user", "Tell me more."),
        ])
    };
    let first = generate(
        &w,
        &greedy(vec![user(vec![image(model_id(&a)), text("What is this?")])]),
    )
    .await;
    // The next turn about the same image reuses its KV, image tokens included.
    let same = generate(&w, &turn(&a, &first.text)).await;
    assert!(
        same.usage.cached_tokens > IMAGE_TOKENS + 4,
        "{:?}",
        same.usage
    );
    // The same conversation with another image shares only what comes before the image.
    let other = generate(&w, &turn(&b, &first.text)).await;
    assert!(other.usage.cached_tokens < 6, "{:?}", other.usage);
    // And what the cache gave is what a fresh start gives.
    within_for(
        LIMIT,
        w.call::<protocol::methods::Reset>(&Default::default()),
    )
    .await
    .unwrap();
    let fresh = generate(&w, &turn(&b, &first.text)).await;
    assert_eq!(fresh.usage.cached_tokens, 0);
    assert_eq!(fresh.text, other.text);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// A vision encoder's output is kept by the image's pixels: another question about the same
/// image, sharing no KV prefix with the first past its opening (the text before the image
/// differs), skips the tower (`usage.cached_images`) and answers what a fresh worker answers;
/// another image runs the tower. Gemma 3 (SigLIP), Qwen3-VL (deepstack rows kept too) and
/// Qwen3-VL-MoE.
#[tokio::test]
async fn an_images_encoder_output_is_kept_for_the_next_question_about_it() {
    let fixtures = [
        ("tiny-gemma3-vl", "gemma3"),
        ("tiny-qwen3-vl", "qwen3_vl"),
        ("tiny-qwen3-vl-moe-vision", "qwen3_vl_moe"),
    ];
    for (name, architecture) in fixtures {
        let Some((dir, images)) = fixture(name) else {
            continue;
        };
        let ask = |question: &str, img: &Path| {
            greedy(vec![user(vec![text(question), image(model_id(img))])])
        };
        let (a, b) = (images.join("gradient.png"), images.join("noise.jpg"));
        let w = worker(&[]);
        loaded(&w, &dir, architecture).await;
        let first = generate(&w, &ask("Describe it.", &a)).await;
        assert_eq!(first.usage.cached_images, 0, "{name}");
        let again = generate(&w, &ask("What colours are in it?", &a)).await;
        assert_eq!(again.usage.cached_images, 1, "{name}: {:?}", again.usage);
        let other = generate(&w, &ask("What colours are in it?", &b)).await;
        assert_eq!(other.usage.cached_images, 0, "{name}");
        within_for(LIMIT, w.shutdown()).await.unwrap();

        let fresh = worker(&[]);
        loaded(&fresh, &dir, architecture).await;
        let cold = generate(&fresh, &ask("What colours are in it?", &a)).await;
        assert_eq!(cold.usage.cached_images, 0, "{name}");
        assert_eq!(cold.text, again.text, "{name}");
        within_for(LIMIT, fresh.shutdown()).await.unwrap();
    }
}

/// A small PNG file whose header claims `side` x `side` pixels.
fn png_claiming(side: u32) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        let body = [kind, data].concat();
        png.extend((data.len() as u32).to_be_bytes());
        png.extend(&body);
        png.extend(crc32fast::hash(&body).to_be_bytes());
    };
    let header = [side.to_be_bytes(), side.to_be_bytes()].concat();
    chunk(b"IHDR", &[&header[..], &[8, 2, 0, 0, 0]].concat());
    // A few zlib-compressed zero bytes: far too little data, never read.
    chunk(
        b"IDAT",
        &[0x78, 0x9c, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01],
    );
    chunk(b"IEND", &[]);
    png
}

#[tokio::test]
async fn bad_images_are_invalid_params_naming_the_part() {
    let Some((dir, images)) = fixture("tiny-gemma3-vl") else {
        return;
    };
    let w = worker(&[]);
    loaded(&w, &dir, "gemma3").await;
    let png = images.join("gradient.png");
    let bomb = base64::engine::general_purpose::STANDARD.encode(png_claiming(100_000));
    let truncated = {
        let bytes = std::fs::read(&png).unwrap();
        base64::engine::general_purpose::STANDARD.encode(&bytes[..bytes.len() / 2])
    };
    let cases = [
        ("bad base64", "this is not an image".to_owned(), ""),
        ("truncated PNG", truncated, ""),
        (
            "unknown scheme",
            "http://example.com/cat.png".to_owned(),
            "http",
        ),
        (
            "missing file",
            "/nonexistent/cat.png".to_owned(),
            "/nonexistent/cat.png",
        ),
        ("decompression bomb", bomb, "pixels"),
    ];
    for (what, source, says) in cases {
        let p = greedy(vec![
            ChatMessage::new("user", "hi"),
            ChatMessage::new("assistant", "hello"),
            user(vec![text("look:"), image(source)]),
        ]);
        let e = rpc_error(
            within_for(LIMIT, w.generate(&p).unwrap().finish()).await,
            ErrorCode::InvalidParams,
        );
        let data = e.data_as::<InvalidParamsData>().unwrap();
        assert_eq!(data.field, "messages[2].content[1]", "{what}: {e:?}");
        assert!(data.reason.contains(says), "{what}: {}", data.reason);
    }
    // The seed's `image`: named by its field.
    let mut p = greedy(vec![ChatMessage::new("user", "hi")]);
    p.image = Some("/nonexistent/cat.png".into());
    let e = rpc_error(
        within_for(LIMIT, w.generate(&p).unwrap().finish()).await,
        ErrorCode::InvalidParams,
    );
    assert_eq!(e.data_as::<InvalidParamsData>().unwrap().field, "image");
    // The worker goes on, the model still resident.
    let ok = generate(
        &w,
        &greedy(vec![user(vec![image(model_id(&png)), text("hi")])]),
    )
    .await;
    assert_eq!(ok.usage.completion_tokens, 8);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn an_image_for_a_text_model_is_refused() {
    let Some((_, images)) = fixture("tiny-gemma3-vl") else {
        return;
    };
    let dir = tiny_model(&Default::default());
    let w = worker(&[]);
    within_for(
        LIMIT,
        w.call::<Load>(&LoadParams::new(model_id(dir.path()))),
    )
    .await
    .unwrap();
    let p = greedy(vec![user(vec![
        image(model_id(&images.join("gradient.png"))),
        text("hi"),
    ])]);
    let e = rpc_error(
        within_for(LIMIT, w.generate(&p).unwrap().finish()).await,
        ErrorCode::InvalidParams,
    );
    let data = e.data_as::<InvalidParamsData>().unwrap();
    assert_eq!(data.field, "messages[0].content[0]");
    assert!(
        data.reason.contains("not a vision model"),
        "{}",
        data.reason
    );
    let ok = generate(&w, &greedy(vec![ChatMessage::new("user", "hi")])).await;
    assert_eq!(ok.usage.completion_tokens, 8);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// A multimodal checkpoint whose tower the worker does not run (`models::TEXT_OF_MULTIMODAL`:
/// Gemma 4's; Mistral Small 4's Pixtral, beside a `mistral4` language model) loads its
/// language model alone, as mlx-lm does: not a vision model, images refused, text answered.
#[tokio::test]
async fn a_multimodal_checkpoint_without_its_tower_runs_as_text() {
    for (name, architecture) in [
        ("tiny-gemma4-multimodal", "gemma4"),
        ("tiny-mistral3-mistral4", "mistral3"),
        ("tiny-gemma3n", "gemma3n"),
    ] {
        let Some((dir, images)) = fixture(name) else {
            continue;
        };
        let w = worker(&[]);
        let loaded = within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(&dir))))
            .await
            .expect("load the fixture");
        assert!(!loaded.info.is_vision, "{name}");
        assert_eq!(loaded.info.architecture, architecture);
        let p = greedy(vec![user(vec![
            text("what is this?"),
            image(model_id(&images.join("gradient.png"))),
        ])]);
        let e = rpc_error(
            within_for(LIMIT, w.generate(&p).unwrap().finish()).await,
            ErrorCode::InvalidParams,
        );
        let data = e.data_as::<InvalidParamsData>().unwrap();
        assert_eq!(data.field, "messages[0].content[1]");
        assert!(data.reason.contains("tower"), "{}", data.reason);
        let ok = generate(&w, &greedy(vec![ChatMessage::new("user", "hi")])).await;
        assert_eq!(ok.usage.completion_tokens, 8);
        within_for(LIMIT, w.shutdown()).await.unwrap();
    }
}

/// The encoder of `tiny-gemma3-vl-448` (a 448 px tower: 1024 patches) takes seconds on a CPU.
#[tokio::test]
async fn a_cancel_while_the_encoder_runs_ends_before_any_token() {
    let Some((dir, images)) = fixture("tiny-gemma3-vl-448") else {
        return;
    };
    let w = worker(&[]);
    loaded(&w, &dir, "gemma3").await;
    let p = greedy(vec![user(vec![
        image(model_id(&images.join("photo_800x600.png"))),
        text("hi"),
    ])]);
    let generation = w.generate(&p).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        within_for(LIMIT, w.cancel(generation.id()))
            .await
            .unwrap()
            .cancelled
    );
    let r = within_for(LIMIT, generation.finish()).await.unwrap();
    assert_eq!(r.finish_reason, protocol::methods::FinishReason::Cancelled);
    assert_eq!(r.usage.completion_tokens, 0);
    // The next request runs in full.
    let ok = generate(&w, &p).await;
    assert_eq!(ok.usage.completion_tokens, 8);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// LLaVA (`tiny-llava`: a CLIP tower on 56 px images, 16 image tokens after the class token is
/// dropped, a Llama language model; token-exact with mlx-vlm in `cargo xtask parity`): an image
/// question answered the same from a path and from base64, the image's tokens in the prompt.
#[tokio::test]
async fn a_llava_model_answers_an_image_question() {
    let Some((dir, images)) = fixture("tiny-llava") else {
        return;
    };
    let w = worker(&[]);
    let init = within_for(LIMIT, w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    assert!(init.capabilities.architectures.iter().any(|a| a == "llava"));
    loaded(&w, &dir, "llava").await;

    let png = images.join("gradient.png");
    let question = "What is in this picture?";
    let by_path = generate(
        &w,
        &greedy(vec![user(vec![image(model_id(&png)), text(question)])]),
    )
    .await;
    let by_base64 = generate(
        &w,
        &greedy(vec![user(vec![image(base64_of(&png)), text(question)])]),
    )
    .await;
    assert_eq!(by_base64.text, by_path.text);
    assert!(!by_path.text.is_empty());
    // `USER: <image>\nWhat` is `USER`, `:`, ` `, 16 `<image>`, `\n`, `What`; without the image
    // `USER: What` is `USER`, `:`, ` What`.
    let text_only = generate(&w, &greedy(vec![ChatMessage::new("user", question)])).await;
    assert_eq!(
        by_path.usage.prompt_tokens,
        text_only.usage.prompt_tokens + IMAGE_TOKENS + 2
    );
    let noise = images.join("noise.jpg");
    let other = generate(
        &w,
        &greedy(vec![user(vec![image(model_id(&noise)), text(question)])]),
    )
    .await;
    assert_ne!(other.text, by_path.text, "the pixels reach the model");
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// Qwen2.5-VL (`tiny-qwen2.5-vl`: a windowed tower, a 400x300 image resized within the
/// fixture's pixel budget to 12x18 patches, 54 tokens after the 2x2 merge; M-RoPE positions;
/// token-exact with mlx-vlm in `cargo xtask parity`): see [`second_question_from_the_cache`].
#[tokio::test]
async fn a_qwen2_5_vl_model_answers_a_second_question_from_the_cache() {
    second_question_from_the_cache("tiny-qwen2.5-vl", "qwen2_5_vl", 56).await;
}

/// Qwen2-VL (`tiny-qwen2-vl`: its tower over whole images, the same processor settings as
/// `tiny-qwen2.5-vl`, 54 tokens): likewise.
#[tokio::test]
async fn a_qwen2_vl_model_answers_a_second_question_from_the_cache() {
    second_question_from_the_cache("tiny-qwen2-vl", "qwen2_vl", 56).await;
}

/// Qwen3-VL (`tiny-qwen3-vl`: 16 px patches, the same image resized to 12x18 of them, 54
/// tokens; deepstack features added in the first language layers; interleaved M-RoPE):
/// likewise, the second turn's image tokens (and their deepstack rows) all cached.
#[tokio::test]
async fn a_qwen3_vl_model_answers_a_second_question_from_the_cache() {
    second_question_from_the_cache("tiny-qwen3-vl", "qwen3_vl", 56).await;
}

/// Mistral 3: the 400x300 gradient fitted into 112 px is 3 rows of 4 merged patches: 12
/// `[IMG]`, 2 `[IMG_BREAK]`, 1 `[IMG_END]` where the template wrote one `[IMG]`.
#[tokio::test]
async fn a_mistral3_model_answers_a_second_question_from_the_cache() {
    second_question_from_the_cache("tiny-mistral3-vl", "mistral3", 15).await;
}

/// A vision `fixture` whose prompt grows by `image_tokens` with the 400x300 gradient (Qwen-VL:
/// `<|vision_start|>`, the image's tokens, `<|vision_end|>`): an image question, then a second
/// question about the same image whose prompt reuses the cached image tokens and is answered as
/// a fresh start answers it (the suffix and the new tokens take their positions from the whole
/// prompt, where the family has explicit positions).
async fn second_question_from_the_cache(fixture_name: &str, architecture: &str, image_tokens: u64) {
    let Some((dir, images)) = fixture(fixture_name) else {
        return;
    };
    let w = worker(&[]);
    let init = within_for(LIMIT, w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    assert!(init
        .capabilities
        .architectures
        .iter()
        .any(|a| a == architecture));
    loaded(&w, &dir, architecture).await;

    let question = "What is in this picture?";
    let text_only = generate(&w, &greedy(vec![ChatMessage::new("user", question)])).await;
    let png = model_id(&images.join("gradient.png"));
    let first = generate(
        &w,
        &greedy(vec![user(vec![image(png.clone()), text(question)])]),
    )
    .await;
    assert!(!first.text.is_empty());
    assert_eq!(
        first.usage.prompt_tokens,
        text_only.usage.prompt_tokens + image_tokens
    );

    let second_turn = greedy(vec![
        user(vec![image(png), text(question)]),
        ChatMessage::new("assistant", &first.text),
        ChatMessage::new("user", "Describe its colours."),
    ]);
    let cached = generate(&w, &second_turn).await;
    assert!(
        cached.usage.cached_tokens > image_tokens,
        "{:?}",
        cached.usage
    );
    within_for(
        LIMIT,
        w.call::<protocol::methods::Reset>(&Default::default()),
    )
    .await
    .unwrap();
    let fresh = generate(&w, &second_turn).await;
    assert_eq!(fresh.usage.cached_tokens, 0);
    assert_eq!(fresh.text, cached.text);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// Idefics3 (`tiny-idefics3`: 80 px tiles, 25 image tokens each, images resized to 160 px on the
/// long side; token-exact with mlx-vlm in `cargo xtask parity`): a 400x300 image is split into
/// 2x2 tiles plus the global image, and the prompt carries all of them; the same answer from a
/// path and from base64, another from other pixels.
#[tokio::test]
async fn an_idefics3_model_answers_about_a_split_image() {
    let Some((dir, images)) = fixture("tiny-idefics3") else {
        return;
    };
    let w = worker(&[]);
    let init = within_for(LIMIT, w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    for family in ["idefics3", "smolvlm"] {
        assert!(init.capabilities.architectures.iter().any(|a| a == family));
    }
    loaded(&w, &dir, "idefics3").await;

    let png = images.join("gradient.png");
    let question = "What is in this picture?";
    let one = |source: String| greedy(vec![user(vec![image(source), text(question)])]);
    let by_path = generate(&w, &one(model_id(&png))).await;
    let by_base64 = generate(&w, &one(base64_of(&png))).await;
    assert_eq!(by_base64.text, by_path.text);
    assert!(!by_path.text.is_empty());
    // A second image adds its expansion: four tiles, each `<fake_token_around_image>`,
    // `<row_r_col_c>` and 25 `<image>`; `\n` after the first row and `\n\n` after the second
    // (one token each in SmolLM2's vocabulary); the global image as
    // `<fake_token_around_image><global-img>`, 25 `<image>`, `<fake_token_around_image>`.
    let two = greedy(vec![user(vec![
        image(model_id(&png)),
        image(model_id(&png)),
        text(question),
    ])]);
    let two = generate(&w, &two).await;
    let tiles = 4 * (2 + 25);
    let global = 2 + 25 + 1;
    let newlines = 2;
    assert_eq!(
        two.usage.prompt_tokens - by_path.usage.prompt_tokens,
        tiles + newlines + global
    );
    let noise = images.join("noise.jpg");
    let other = generate(&w, &one(model_id(&noise))).await;
    assert_ne!(other.text, by_path.text, "the pixels reach the model");
    within_for(LIMIT, w.shutdown()).await.unwrap();
}
