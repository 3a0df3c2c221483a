//! Shows how a model tokenizes a text, and how fast.
//!
//! ```sh
//! cargo run --release -p sonde-tokenizer --example tokenize -- MODEL [TEXT]
//! ```
//! MODEL is a `.gguf` file or a Hugging Face folder; TEXT defaults to standard input.
//! Prints the load time, every token (id, bytes, special or not), the decoded text, and
//! the encode speed measured over repeated runs of the same text (so with the BPE
//! word cache warm, as it is for a server that sees similar text all day).

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use sonde_tokenizer::ModelTokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args.next().ok_or("usage: tokenize MODEL [TEXT]")?;
    let text = match args.next() {
        Some(text) => text,
        None => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text)?;
            text
        }
    };

    let start = Instant::now();
    let path = Path::new(&model);
    let tokenizer = if path.is_dir() {
        ModelTokenizer::from_hf_dir(path)?
    } else {
        ModelTokenizer::from_gguf_file(path)?
    };
    println!("loaded {model} in {:.1?}", start.elapsed());
    println!("special tokens: {:?}", tokenizer.special_tokens());

    let ids = tokenizer.encode(&text, true)?;
    for &id in ids.iter().take(64) {
        let bytes = tokenizer.token_bytes(id).unwrap_or_default();
        let marker = if tokenizer.is_special(id) {
            " (special)"
        } else {
            ""
        };
        println!("{id:>8} {:?}{marker}", String::from_utf8_lossy(bytes));
    }
    if ids.len() > 64 {
        println!("… {} tokens in all", ids.len());
    }
    println!("decoded: {:?}", tokenizer.decode(&ids, false)?);

    // Encode the text repeatedly for about a second (word cache warm after the first run).
    let mut runs = 0u32;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        std::hint::black_box(tokenizer.encode(&text, true)?);
        runs += 1;
    }
    let per_run = start.elapsed() / runs;
    let secs = per_run.as_secs_f64();
    println!(
        "encode: {per_run:.1?} per run, {:.0} tokens/s, {:.1} MB/s ({runs} runs)",
        ids.len() as f64 / secs,
        text.len() as f64 / secs / 1e6
    );
    Ok(())
}
