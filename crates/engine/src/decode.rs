//! Turning tokens back into text, one token at a time.

/// Makes incremental decoders; implemented over the checkpoint's tokenizer.
pub trait TextDecoder: Send + Sync {
    /// A decoder for one new sequence. `prompt` is the sequence so far, for decoders whose output
    /// depends on context (leading-space handling, byte pieces).
    fn stream(&self, prompt: &[u32]) -> Box<dyn DecodeStream>;
}

/// Incremental detokenization for one sequence.
pub trait DecodeStream: Send {
    /// Adds a token and returns the text it completes: only whole UTF-8 characters, possibly empty
    /// while a character's bytes are still arriving.
    fn push(&mut self, token: u32) -> String;

    /// Returns whatever is still held back when the sequence ends.
    fn flush(&mut self) -> String {
        String::new()
    }

    /// Whether the tokens pushed so far end in the middle of a character (its bytes still
    /// arriving): a reasoning budget waits for the character before it ends the block.
    fn holds_partial_character(&self) -> bool {
        false
    }
}
