//! Embedding mlxcel: load the default model, stream a chat reply, then run a blocking generation.
//!
//! ```sh
//! cargo run --release -p mlxcel-engine --example chat -- "Why is the sky blue?"
//! ```

use std::io::Write;

use mlxcel_engine::{
    ChatMessage, Engine, EngineOptions, Event, GenerationRequest, MaxNewTokens, SamplingParams,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let question = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "What is the capital of France?".to_owned());
    let engine = Engine::load(None, EngineOptions::default())?;

    // Streaming: text arrives as complete UTF-8 pieces; the stream ends with `Finished`.
    let mut request = GenerationRequest::new(Vec::new(), MaxNewTokens::Limited(64));
    request.sampling = SamplingParams {
        seed: Some(7),
        ..SamplingParams::default()
    };
    let stream = engine.chat(&[ChatMessage::new("user", question.as_str())], request)?;
    for event in stream {
        match event {
            Event::Token { text, .. } => {
                print!("{text}");
                std::io::stdout().flush()?;
            }
            Event::Finished { reason, usage, .. } => {
                println!(
                    "\n[{}; {} prompt + {} generated tokens]",
                    reason.as_str(),
                    usage.prompt_tokens,
                    usage.completion_tokens
                );
            }
        }
    }

    // Blocking: the whole completion at once, greedy.
    let prompt = engine.tokenize("The capital of France is")?;
    let completion = engine.generate(GenerationRequest {
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::new(prompt, MaxNewTokens::Limited(8))
    })?;
    println!("{:?}", completion.text);
    Ok(())
}
