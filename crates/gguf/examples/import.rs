//! Imports a GGUF into a Hugging Face-layout directory.
//!
//! `cargo run --release -p gguf --example import -- model.gguf OUT_DIR`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(gguf), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: import FILE.gguf OUT_DIR".into());
    };
    let start = std::time::Instant::now();
    let report = gguf::import_hf_dir(gguf.as_ref(), out.as_ref())?;
    println!("{report:#?}");
    println!("took {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}
