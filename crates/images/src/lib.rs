//! Images for vision-language models, without MLX: where an image comes from ([`ImageSource`]),
//! decoding to 8-bit RGB exactly as PIL's `convert("RGB")` ([`decode`]), resampling bit-exact
//! with Pillow ([`resize`]), and the pixel tensors each family's image processor computes
//! ([`processors`]), as mlx-vlm 0.7.0 gets them (Hugging Face transformers' PIL backend, or
//! mlx-vlm's own NumPy port for Qwen-VL).
//!
//! ```no_run
//! use images::{decode::DecodeLimits, processors::Processor};
//! # fn main() -> Result<(), images::ImageError> {
//! let image = images::load("data:image/png;base64,...", &DecodeLimits::default())?;
//! let processor = Processor::from_model_dir("/models/gemma-3-4b-it".as_ref(), "gemma3")?;
//! let out = processor.preprocess(&[image])?;
//! println!("{:?}", out.pixel_values.shape); // [1, 3, 896, 896]
//! # Ok(()) }
//! ```

pub mod decode;
mod error;
pub mod processors;
pub mod resize;
mod source;

pub use decode::{decode, load, DecodeLimits, RgbImage};
pub use error::{ImageError, Result};
pub use processors::PixelValues;
pub use resize::{resize, Filter};
pub use source::ImageSource;
