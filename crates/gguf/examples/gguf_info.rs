//! Prints a GGUF's metadata (arrays as their length and first items) and a tensor summary.
//!
//! `cargo run -p gguf --example gguf_info -- model.gguf`

use std::collections::BTreeMap;

use gguf::{GgufFile, MetadataValue};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: gguf_info FILE.gguf")?;
    let file = GgufFile::open(path.as_ref())?;
    println!("GGUF v{}", file.version());
    for (key, value) in file.metadata() {
        match value {
            MetadataValue::Array(items) => {
                let head: Vec<String> = items.iter().take(5).map(|v| format!("{v:?}")).collect();
                println!("{key} = [{} items] {}", items.len(), head.join(", "));
            }
            MetadataValue::String(s) if s.len() > 200 => {
                println!("{key} = {:?}... ({} chars)", &s[..200], s.len())
            }
            other => println!("{key} = {other:?}"),
        }
    }
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    for info in file.tensors() {
        *by_type.entry(format!("{:?}", info.ggml_type)).or_default() += 1;
    }
    println!("{} tensors by type: {by_type:?}", file.tensors().len());
    for info in file
        .tensors()
        .iter()
        .filter(|t| !t.name.starts_with("blk.") || t.name.starts_with("blk.0."))
    {
        println!("  {} {:?} {:?}", info.name, info.ggml_type, info.shape());
    }
    Ok(())
}
