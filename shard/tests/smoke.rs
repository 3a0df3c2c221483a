mod common;

use common::*;
use sonde_tokenizer::ModelTokenizer;

#[test]
fn greedy_chat_answer_names_paris() {
    let path = gguf_path();
    let tok = ModelTokenizer::from_gguf_file(&path).unwrap();
    let prompt =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let ids = tok.encode(prompt, true).unwrap();
    let mut engine = engine(&path, 4096);
    let t = std::time::Instant::now();
    let out = run_one(&mut engine, Req::new(1, &ids, 16));
    eprintln!("{:?} in {:?}", out.ids(), t.elapsed());
    let text = tok.decode(&out.ids(), true).unwrap();
    eprintln!("{text}");
    assert!(text.contains("Paris"), "{text}");
}
