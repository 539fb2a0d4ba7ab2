//! Bytes to RGB pixels, as mlx-vlm's `load_image` gets them from PIL:
//! `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`.
//!
//! PIL's `convert("RGB")` rules, each checked against Pillow in `tests/pillow_parity.rs`:
//! - RGBA, LA: alpha dropped, never composited.
//! - L: R = G = B = L. 1-, 2- and 4-bit grey is first scaled to 0..255 (0, 85, 170, 255 for 2 bits).
//! - P (palette): the palette's RGB entry.
//! - 16-bit RGB(A) and grey+alpha PNG: the high byte of each sample (PIL reads them as 8-bit
//!   `RGB;16B`/`RGBA;16B`/`LA;16B`, which keep the most significant byte).
//! - 16-bit grey PNG: PIL's mode `I;16`, whose conversion to RGB clamps: values 0..255 stay,
//!   everything above becomes 255 (a typical 16-bit grey image turns almost white). Matched, not
//!   fixed: the model sees what it sees through mlx-vlm.
//! - GIF: the first frame only, on the logical screen filled with the transparent index (or 0), as
//!   Pillow's GIF reader composes frame 0.
//!
//! One more PIL fact travels with the pixels: a PNG `tRNS` colour key (RGB or grey, or a palette
//! with exactly one transparent entry) or a GIF transparent index survives `convert("RGB")` as
//! `info["transparency"]`, an RGB colour. Hugging Face's image processors (their
//! `convert_to_rgb`) then composite such an image onto white: every pixel of exactly that colour
//! becomes white. [`RgbImage::transparency`] keeps the colour so the processors that do this can.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

use crate::error::{ImageError, Result};

/// The most pixels (width x height) an image may have: 64 Mi (e.g. 8192 x 8192). Checked from
/// the header, before any pixel is decoded. Pillow warns above 89.5 M and refuses above 179 M; an
/// 800 px image from Studio has 0.64 M.
pub const DEFAULT_MAX_PIXELS: u64 = 64 * 1024 * 1024;

/// Limits on what is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Width x height above which an image is refused before decoding.
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_pixels: DEFAULT_MAX_PIXELS,
        }
    }
}

/// An 8-bit RGB image, rows top to bottom, pixels interleaved (`[r, g, b, r, g, b, ...]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    /// `width * height * 3` bytes.
    pub pixels: Vec<u8>,
    /// PIL's `info["transparency"]` after `convert("RGB")`: the colour key of a PNG `tRNS` chunk or
    /// a GIF's transparent index, as RGB. See the module docs.
    pub transparency: Option<[u8; 3]>,
}

impl RgbImage {
    /// An image from interleaved RGB bytes (`pixels.len()` must be `width * height * 3`).
    pub fn new(width: u32, height: u32, pixels: Vec<u8>) -> Self {
        assert_eq!(
            pixels.len(),
            width as usize * height as usize * 3,
            "RgbImage::new: {width}x{height} needs {} bytes",
            width as usize * height as usize * 3
        );
        Self {
            width,
            height,
            pixels,
            transparency: None,
        }
    }

    /// What Hugging Face's `convert_to_rgb` makes of this image: with a colour key, every pixel of
    /// that colour becomes white (alpha 0 composited onto white); otherwise the image as it is.
    pub fn hf_convert_to_rgb(&self) -> RgbImage {
        let mut out = RgbImage::new(self.width, self.height, self.pixels.clone());
        if let Some(key) = self.transparency {
            for px in out.pixels.chunks_exact_mut(3) {
                if px == key {
                    px.copy_from_slice(&[255, 255, 255]);
                }
            }
        }
        out
    }
}

/// Decodes PNG, JPEG, WebP or GIF (first frame) bytes to RGB as PIL does (see the module docs),
/// after applying the EXIF orientation (`ImageOps.exif_transpose`).
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<RgbImage> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    let format =
        image::guess_format(bytes).map_err(|_| ImageError::UnsupportedFormat { found: None })?;
    let name = match format {
        ImageFormat::Png => "PNG",
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::WebP => "WebP",
        ImageFormat::Gif => return decode_gif(bytes, limits),
        other => {
            return Err(ImageError::UnsupportedFormat {
                found: Some(format!("{other:?}")),
            })
        }
    };
    let decode_err = |e: image::ImageError| match e {
        image::ImageError::Limits(l) => ImageError::Decode {
            format: name.into(),
            reason: format!("over the memory limit: {l}"),
        },
        other => ImageError::Decode {
            format: name.into(),
            reason: other.to_string(),
        },
    };
    #[cfg(feature = "turbojpeg")]
    if format == ImageFormat::Jpeg {
        if let Some(img) = decode_jpeg_turbo(bytes, limits)? {
            return Ok(img);
        }
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.no_limits();
    let mut decoder = reader.into_decoder().map_err(decode_err)?;
    let (width, height) = decoder.dimensions();
    check_pixels(width, height, limits)?;
    let orientation = decoder.orientation().map_err(decode_err)?;
    let mut img = DynamicImage::from_decoder(decoder).map_err(decode_err)?;
    img.apply_orientation(orientation);
    let mut rgb = to_rgb_like_pil(img)?;
    if format == ImageFormat::Png {
        rgb.transparency = png_color_key(bytes);
    }
    Ok(rgb)
}

/// Reads a string (see [`crate::ImageSource::parse`]) and decodes it with [`decode`].
pub fn load(source: &str, limits: &DecodeLimits) -> Result<RgbImage> {
    let bytes = crate::ImageSource::parse(source)?.into_bytes()?;
    decode(&bytes, limits)
}

/// JPEG through libjpeg-turbo, the decoder in Pillow's wheels: the same pixels as PIL (IDCT,
/// chroma upsampling, YCbCr to RGB). CMYK/YCCK JPEGs come out as CMYK, which PIL reads inverted
/// (`CMYK;I`, "Adobe conventions") and converts with its `cmyk2rgb`; so here.
#[cfg(feature = "turbojpeg")]
fn decode_jpeg_turbo(bytes: &[u8], limits: &DecodeLimits) -> Result<Option<RgbImage>> {
    let err = |e: turbojpeg::Error| ImageError::Decode {
        format: "JPEG".into(),
        reason: e.to_string(),
    };
    let header = turbojpeg::read_header(bytes).map_err(err)?;
    let (width, height) = (header.width as u32, header.height as u32);
    check_pixels(width, height, limits)?;
    let cmyk = matches!(
        header.colorspace,
        turbojpeg::Colorspace::CMYK | turbojpeg::Colorspace::YCCK
    );
    let format = if cmyk {
        turbojpeg::PixelFormat::CMYK
    } else {
        turbojpeg::PixelFormat::RGB
    };
    let mut raw: turbojpeg::Image<Vec<u8>> = turbojpeg::decompress(bytes, format).map_err(err)?;
    if cmyk {
        raw.pixels = raw
            .pixels
            .chunks_exact(4)
            .flat_map(pil_cmyk_to_rgb)
            .collect();
    }
    // The EXIF orientation, read by the image crate from the header.
    let orientation = image::codecs::jpeg::JpegDecoder::new(Cursor::new(bytes))
        .and_then(|mut d| d.orientation())
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let buffer =
        image::RgbImage::from_raw(width, height, raw.pixels).ok_or_else(|| ImageError::Decode {
            format: "JPEG".into(),
            reason: "decoded size does not match the header".into(),
        })?;
    let mut img = DynamicImage::ImageRgb8(buffer);
    img.apply_orientation(orientation);
    to_rgb_like_pil(img).map(Some)
}

/// PIL's `cmyk2rgb` on libjpeg's CMYK, which PIL inverts first (`CMYK;I`):
/// `255 - k' - c' * (255 - k') / 255` per channel with `x' = 255 - x` and PIL's rounding
/// `MULDIV255(a, b) = ((a*b + 128) >> 8 + a*b + 128) >> 8`.
#[cfg(feature = "turbojpeg")]
fn pil_cmyk_to_rgb(px: &[u8]) -> [u8; 3] {
    let nk = px[3] as i32; // 255 - (255 - k)
    let muldiv255 = |a: i32, b: i32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    let ch = |c: u8| (nk - muldiv255(255 - c as i32, nk)).clamp(0, 255) as u8;
    [ch(px[0]), ch(px[1]), ch(px[2])]
}

fn check_pixels(width: u32, height: u32, limits: &DecodeLimits) -> Result<()> {
    let pixels = width as u64 * height as u64;
    if pixels > limits.max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            pixels,
            max: limits.max_pixels,
        });
    }
    if pixels == 0 {
        return Err(ImageError::Decode {
            format: "image".into(),
            reason: format!("{width}x{height} has no pixels"),
        });
    }
    Ok(())
}

/// PIL's `convert("RGB")` for what the image crate decodes (module docs).
fn to_rgb_like_pil(img: DynamicImage) -> Result<RgbImage> {
    let (width, height) = (img.width(), img.height());
    let n = width as usize * height as usize;
    let mut out = Vec::with_capacity(n * 3);
    match img {
        DynamicImage::ImageRgb8(b) => out = b.into_raw(),
        DynamicImage::ImageRgba8(b) => {
            for px in b.as_raw().chunks_exact(4) {
                out.extend_from_slice(&px[..3]);
            }
        }
        DynamicImage::ImageLuma8(b) => {
            for &l in b.as_raw() {
                out.extend_from_slice(&[l, l, l]);
            }
        }
        DynamicImage::ImageLumaA8(b) => {
            for px in b.as_raw().chunks_exact(2) {
                out.extend_from_slice(&[px[0], px[0], px[0]]);
            }
        }
        // Mode I;16: clamped to 255.
        DynamicImage::ImageLuma16(b) => {
            for &l in b.as_raw() {
                let v = l.min(255) as u8;
                out.extend_from_slice(&[v, v, v]);
            }
        }
        // Read by PIL as LA;16B into RGBA: the high byte.
        DynamicImage::ImageLumaA16(b) => {
            for px in b.as_raw().chunks_exact(2) {
                let v = (px[0] >> 8) as u8;
                out.extend_from_slice(&[v, v, v]);
            }
        }
        DynamicImage::ImageRgb16(b) => {
            out.extend(b.as_raw().iter().map(|&v| (v >> 8) as u8));
        }
        DynamicImage::ImageRgba16(b) => {
            for px in b.as_raw().chunks_exact(4) {
                out.extend(px[..3].iter().map(|&v| (v >> 8) as u8));
            }
        }
        other => return Err(ImageError::UnsupportedColor(format!("{:?}", other.color()))),
    }
    Ok(RgbImage::new(width, height, out))
}

/// The colour key PIL keeps in `info["transparency"]` after `convert("RGB")`, from the PNG's
/// `IHDR`, `PLTE` and `tRNS` chunks: an RGB key as written; a grey key as grey (PIL compares
/// the raw value, also for 1/2/4-bit images); a palette whose `tRNS` has exactly one 0 entry
/// and only 255 otherwise, that entry's colour. `None` otherwise (PIL drops per-entry palette
/// alpha in `convert("RGB")`). A key above 255 matches no 8-bit pixel, so it is `None`.
fn png_color_key(bytes: &[u8]) -> Option<[u8; 3]> {
    let mut pos = 8;
    let (mut color_type, mut bit_depth) = (None, 0u8);
    let mut palette: &[u8] = &[];
    while pos + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().ok()?) as usize;
        let kind = &bytes[pos + 4..pos + 8];
        let data = bytes.get(pos + 8..pos + 8 + len)?;
        match kind {
            b"IHDR" if len >= 10 => {
                bit_depth = data[8];
                color_type = Some(data[9]);
            }
            b"PLTE" => palette = data,
            b"tRNS" => {
                let u16_at = |i: usize| -> Option<u16> {
                    Some(u16::from_be_bytes(data.get(i..i + 2)?.try_into().ok()?))
                };
                let byte = |v: u16| u8::try_from(v).ok();
                return match color_type? {
                    0 => {
                        let g = u16_at(0)?;
                        // Mode "1": its pixels are 0 or 255, the key 0 or 1 becomes 0 or 255.
                        let g = if bit_depth == 1 { g.min(1) * 255 } else { g };
                        let g = byte(g)?;
                        Some([g, g, g])
                    }
                    2 => Some([byte(u16_at(0)?)?, byte(u16_at(2)?)?, byte(u16_at(4)?)?]),
                    3 => {
                        let zeros = data.iter().filter(|&&a| a == 0).count();
                        let simple = zeros == 1 && data.iter().all(|&a| a == 0 || a == 255);
                        let i = data.iter().position(|&a| a == 0)?;
                        if !simple {
                            return None;
                        }
                        palette.get(i * 3..i * 3 + 3).map(|c| [c[0], c[1], c[2]])
                    }
                    _ => None,
                };
            }
            b"IDAT" | b"IEND" => return None,
            _ => {}
        }
        pos += 12 + len;
    }
    None
}

/// GIF's first frame, composed as Pillow does: the logical screen filled with the transparent
/// index (or 0), the frame pasted at its offset, indices looked up in the frame's palette (local,
/// else global; without one, the index is grey).
fn decode_gif(bytes: &[u8], limits: &DecodeLimits) -> Result<RgbImage> {
    let gif_err = |e: gif::DecodingError| ImageError::Decode {
        format: "GIF".into(),
        reason: e.to_string(),
    };
    let mut options = gif::DecodeOptions::new();
    options.set_color_output(gif::ColorOutput::Indexed);
    // One byte per pixel in indexed output: a frame (which may be larger than the screen) gets
    // the same pixel cap as the screen.
    if let Some(bytes) = std::num::NonZeroU64::new(limits.max_pixels) {
        options.set_memory_limit(gif::MemoryLimit::Bytes(bytes));
    }
    let mut decoder = options.read_info(Cursor::new(bytes)).map_err(gif_err)?;
    let (width, height) = (decoder.width() as u32, decoder.height() as u32);
    check_pixels(width, height, limits)?;
    let global = decoder.global_palette().map(<[u8]>::to_vec);
    let frame = decoder
        .read_next_frame()
        .map_err(gif_err)?
        .ok_or_else(|| ImageError::Decode {
            format: "GIF".into(),
            reason: "no image frame".into(),
        })?;
    let fill = frame.transparent.unwrap_or(0);
    let mut indices = vec![fill; width as usize * height as usize];
    for y in 0..frame.height as usize {
        let cy = frame.top as usize + y;
        if cy >= height as usize {
            break;
        }
        for x in 0..frame.width as usize {
            let cx = frame.left as usize + x;
            if cx >= width as usize {
                break;
            }
            indices[cy * width as usize + cx] = frame.buffer[y * frame.width as usize + x];
        }
    }
    let palette = frame.palette.clone().or(global);
    let color = |i: u8| -> [u8; 3] {
        match &palette {
            Some(p) => p
                .get(i as usize * 3..i as usize * 3 + 3)
                .map_or([0, 0, 0], |c| [c[0], c[1], c[2]]),
            None => [i, i, i],
        }
    };
    let mut pixels = Vec::with_capacity(indices.len() * 3);
    for &i in &indices {
        pixels.extend_from_slice(&color(i));
    }
    let mut img = RgbImage::new(width, height, pixels);
    img.transparency = frame.transparent.map(color);
    Ok(img)
}
