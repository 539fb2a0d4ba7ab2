//! Image strings and bad input: each source kind, each refusal with a message that says what to do.

use std::io::Write;

use base64::Engine as _;
use images::processors::{smart_resize, Processor};
use images::{decode, load, DecodeLimits, ImageError, ImageSource};

/// A valid 3x2 RGB PNG, written by the `png` encoder of the image crate's own dependency.
fn png_3x2() -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, 3, 2);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().unwrap();
    w.write_image_data(&(0..18).collect::<Vec<u8>>()).unwrap();
    w.finish().unwrap();
    out
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn limits() -> DecodeLimits {
    DecodeLimits::default()
}

#[test]
fn raw_base64_data_url_path_and_file_url_give_the_same_pixels() {
    let png = png_3x2();
    let want = decode(&png, &limits()).unwrap();
    assert_eq!((want.width, want.height), (3, 2));
    assert_eq!(want.pixels, (0..18).collect::<Vec<u8>>());

    let dir = std::env::temp_dir().join(format!("images-sources-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a b.png");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&png)
        .unwrap();
    let file_url = format!("file://{}", path.display()).replace(' ', "%20");
    for source in [
        b64(&png),
        format!("data:image/png;base64,{}", b64(&png)),
        format!("DATA:image/png;BASE64,{}", b64(&png)),
        // Line breaks in base64 (MIME style) and no padding are accepted.
        b64(&png)
            .as_bytes()
            .chunks(10)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join("\n")
            .trim_end_matches('=')
            .to_owned(),
        path.display().to_string(),
        file_url,
    ] {
        let got = load(&source, &limits()).unwrap_or_else(|e| panic!("{source:.40}: {e}"));
        assert_eq!(got, want, "{source:.40}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn http_and_unknown_schemes_are_refused_saying_what_is_accepted() {
    for s in [
        "https://example.com/cat.png",
        "http://x/y.jpg",
        "s3://bucket/key",
        "ftp://h/f",
    ] {
        let err = ImageSource::parse(s).unwrap_err();
        assert!(
            matches!(err, ImageError::UnsupportedSource { .. }),
            "{s}: {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("base64") && msg.contains("data URL") && msg.contains("file"),
            "{msg}"
        );
    }
}

#[test]
fn bad_base64_and_empty_input_are_named() {
    let err = ImageSource::parse("not base64 at all!").unwrap_err();
    assert!(matches!(err, ImageError::BadBase64 { .. }), "{err:?}");
    let err = ImageSource::parse("data:image/png;base64,%%%%").unwrap_err();
    assert!(matches!(err, ImageError::BadBase64 { .. }), "{err:?}");
    let err = ImageSource::parse("data:image/png,rawbytes").unwrap_err();
    assert!(matches!(err, ImageError::DataUrlNotBase64), "{err:?}");
    assert!(matches!(
        ImageSource::parse("  ").unwrap_err(),
        ImageError::Empty
    ));
    assert!(matches!(
        ImageSource::parse("data:image/png;base64,").unwrap_err(),
        ImageError::Empty
    ));
}

#[test]
fn a_missing_file_is_a_file_error_naming_the_path() {
    for s in ["/no/such/dir/cat.png", "cat.png", "file:///no/such/cat.png"] {
        let err = load(s, &limits()).unwrap_err();
        assert!(matches!(err, ImageError::File { .. }), "{s}: {err:?}");
        assert!(err.to_string().contains("cat.png"), "{err}");
    }
}

#[test]
fn bytes_of_another_format_or_truncated_or_garbage_are_refused() {
    let png = png_3x2();
    let err = decode(&png[..png.len() - 20], &limits()).unwrap_err();
    assert!(matches!(err, ImageError::Decode { .. }), "{err:?}");
    assert!(err.to_string().contains("PNG"), "{err}");
    let err = decode(b"BM\x00\x00 a bitmap", &limits()).unwrap_err();
    assert!(
        matches!(err, ImageError::UnsupportedFormat { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("PNG, JPEG, WebP and GIF"), "{err}");
    let err = decode(b"hello", &limits()).unwrap_err();
    assert!(
        matches!(err, ImageError::UnsupportedFormat { found: None }),
        "{err:?}"
    );
    assert!(matches!(
        decode(b"", &limits()).unwrap_err(),
        ImageError::Empty
    ));
}

#[test]
fn the_pixel_cap_is_checked_from_the_header_before_decoding() {
    // A PNG header claiming 100000 x 100000 pixels, with no pixel data at all: refused from the
    // header (decoding would fail for lack of data, or allocate 30 GB if it tried).
    let mut bomb = png_3x2();
    bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32(&bomb[12..29]);
    bomb[29..33].copy_from_slice(&crc.to_be_bytes());
    let err = decode(&bomb, &limits()).unwrap_err();
    match &err {
        ImageError::TooManyPixels {
            width, height, max, ..
        } => {
            assert_eq!((*width, *height), (100_000, 100_000));
            assert_eq!(*max, images::decode::DEFAULT_MAX_PIXELS);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .contains(&images::decode::DEFAULT_MAX_PIXELS.to_string()),
        "{err}"
    );
    // A GIF screen of 60000 x 60000 holding one 1x1 frame: refused from its header too.
    let mut gif = b"GIF89a".to_vec();
    gif.extend_from_slice(&60_000u16.to_le_bytes());
    gif.extend_from_slice(&60_000u16.to_le_bytes());
    gif.extend_from_slice(&[0, 0, 0]);
    gif.extend_from_slice(&[b',', 0, 0, 0, 0, 1, 0, 1, 0, 0, 2, 2, 0x44, 0x01, 0, b';']);
    let err = decode(&gif, &limits()).unwrap_err();
    assert!(
        matches!(err, ImageError::TooManyPixels { width: 60_000, .. }),
        "{err:?}"
    );
    // A lower cap refuses a small image too.
    let err = decode(&png_3x2(), &DecodeLimits { max_pixels: 5 }).unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::TooManyPixels {
                pixels: 6,
                max: 5,
                ..
            }
        ),
        "{err:?}"
    );
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn smart_resize_rounds_halves_to_even_and_refuses_extreme_aspect_ratios() {
    // 42 / 28 = 1.5 rounds to 2, 70 / 28 = 2.5 rounds to 2 (Python's round), 98 / 28 = 3.5 to 4.
    assert_eq!(smart_resize(42, 70, 28, 0, u64::MAX).unwrap(), (56, 56));
    assert_eq!(smart_resize(98, 98, 28, 0, u64::MAX).unwrap(), (112, 112));
    // Below min_pixels: scaled up with ceil.
    assert_eq!(
        smart_resize(10, 10, 28, 56 * 56, u64::MAX).unwrap(),
        (56, 56)
    );
    let err = smart_resize(1, 201, 28, 0, u64::MAX).unwrap_err();
    assert!(matches!(err, ImageError::BadImageSize { .. }), "{err:?}");
    assert!(err.to_string().contains("200"), "{err}");
}

#[test]
fn processor_configs_refuse_what_is_not_implemented() {
    let config = |v: serde_json::Value| v.as_object().unwrap().clone();
    let err = Processor::from_hf_config(
        &config(serde_json::json!({"do_pan_and_scan": true})),
        "gemma3",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("pan_and_scan_min_crop_size"),
        "{err}"
    );
    // Gemma 3's checkpoints write null for pan and scan: off.
    Processor::from_hf_config(
        &config(serde_json::json!({"do_pan_and_scan": null})),
        "gemma3",
    )
    .unwrap();
    let err = Processor::from_hf_config(&config(serde_json::json!({"resample": 9})), "gemma3")
        .unwrap_err();
    assert!(err.to_string().contains("resample"), "{err}");
    let err = Processor::from_hf_config(
        &config(serde_json::json!({"image_processor_type": "PixtralImageProcessor"})),
        "mistral3",
    )
    .unwrap_err();
    assert!(err.to_string().contains("mistral3"), "{err}");
    let err = Processor::from_hf_config(&config(serde_json::json!({"image_mean": null})), "gemma3")
        .unwrap_err();
    assert!(err.to_string().contains("image_mean"), "{err}");
}
