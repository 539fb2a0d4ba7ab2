//! Arbitrary bytes as an image file (PNG, JPEG, WebP, GIF, ...): decoding ends in an RGB image
//! within the pixel cap or an error, and a small decoded image resizes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = images::DecodeLimits {
        max_pixels: 1 << 22,
    };
    let Ok(image) = images::decode(data, &limits) else {
        return;
    };
    assert!(u64::from(image.width) * u64::from(image.height) <= limits.max_pixels);
    if image.width * image.height <= 1 << 16 {
        let _ = images::resize(&image, 17, 9, images::Filter::Bicubic);
    }
});
