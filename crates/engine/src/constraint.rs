//! Structured output: what a request's output must match (a JSON Schema, any JSON object, a Lark
//! grammar, a regular expression), enforced token by token with llguidance.
//!
//! Before each sampled token, the sequence's matcher computes which tokens can continue a valid
//! output; every other logit becomes −∞, so the sampler (greedy or not) can only pick a valid one,
//! and the model's end-of-sequence tokens are allowed exactly when the output is complete. The mask
//! is computed per sequence in the engine, so it works on every backend and with batching:
//! constrained and free sequences share a step.

use std::sync::{Arc, Mutex, OnceLock, mpsc};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use mlxcel_model::Tokenizer;
use serde_json::Value;
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::EngineError;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON value valid under this JSON Schema (`response_format` `json_schema`, llama-server's
    /// `json_schema`).
    JsonSchema(Value),
    /// Any JSON object (`response_format` `json_object`).
    JsonObject,
    /// A Lark grammar in llguidance's dialect (its `start` rule is the output).
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

/// The whitespace a JSON output may have between two tokens (llguidance's default is any run of
/// it, which lets a model that repeats itself fill its budget with blanks): one space, or one or
/// two line breaks and up to 20 spaces or tabs of indentation, as llama.cpp's JSON-schema
/// grammars allow.
const JSON_WHITESPACE: &str = r"(?: |\n{1,2}[ \t]{0,20})";

/// `schema` with mlxcel's JSON compile options (the bounded whitespace above), unless it chooses
/// its own (llguidance's `x-guidance` key) or is not an object (`true`, `false`). Constraints
/// from JSON schemas get them; a Lark grammar's `%json {…}` schemas get them through this.
pub fn with_json_options(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut()
        && !object.contains_key("x-guidance")
    {
        object.insert(
            "x-guidance".into(),
            serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }),
        );
    }
    schema
}

impl Constraint {
    pub(crate) fn grammar(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_json_options(schema.clone()))
            }
            Self::JsonObject => TopLevelGrammar::from_json_schema(with_json_options(
                serde_json::json!({ "type": "object" }),
            )),
            Self::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }

    /// The name used in errors: the request field's kind.
    fn kind(&self) -> &'static str {
        match self {
            Self::JsonSchema(_) => "JSON schema",
            Self::JsonObject => "JSON object",
            Self::Lark(_) => "grammar",
            Self::Regex(_) => "regex",
        }
    }
}

/// Compiles constraints for one model's vocabulary (built once, on the first constrained
/// request: the token trie of the whole vocabulary).
pub(crate) struct Constraints {
    factory: ParserFactory,
}

impl std::fmt::Debug for Constraints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraints").finish_non_exhaustive()
    }
}

/// The vocabulary as llguidance sees it: each token's bytes (special tokens behind the trie's
/// marker byte, so that no text matches them) and our tokenizer for the few strings it encodes.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false, false)
                .unwrap_or_default()
        })
    }
}

impl Constraints {
    /// The trie of `tokenizer`'s vocabulary padded to the model's `vocab_size` (rows past the
    /// tokenizer's are never allowed); `eos` is the token that ends a complete output.
    pub(crate) fn new(
        tokenizer: Arc<Tokenizer>,
        eos: u32,
        vocab_size: usize,
    ) -> Result<Self, EngineError> {
        let mut words: Vec<Vec<u8>> = tokenizer
            .token_bytes()
            .into_iter()
            .map(|t| {
                if t.special {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend(t.bytes);
                    marked
                } else {
                    t.bytes
                }
            })
            .collect();
        words.resize(vocab_size.max(words.len()), Vec::new());
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| EngineError::InvalidConstraint {
                kind: "vocabulary",
                message: format!("cannot build the token trie: {e}"),
            })?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// A fresh matcher for `constraint`, or the reason llguidance refuses it.
    pub(crate) fn matcher(
        &self,
        constraint: &Constraint,
    ) -> Result<ConstrainedOutput, EngineError> {
        let parser = self
            .factory
            .create_parser(constraint.grammar())
            .map_err(|e| EngineError::InvalidConstraint {
                kind: constraint.kind(),
                message: e.to_string(),
            })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(EngineError::InvalidConstraint {
                kind: constraint.kind(),
                message: error,
            });
        }
        Ok(ConstrainedOutput::new(matcher))
    }
}

/// One sequence's constraint in progress. Its next mask is computed ahead, on a worker thread, as
/// soon as the state it depends on is known (at creation, and after each accepted token), so that
/// the computation overlaps the forward pass that produces the logits it will mask; `mask` then
/// waits for it (usually done) and applies it.
pub(crate) struct ConstrainedOutput {
    matcher: Arc<Mutex<Matcher>>,
    /// The mask for the current state, being computed by a worker.
    next: Option<mpsc::Receiver<MaskOutcome>>,
}

/// The tokens a state allows, and whether the output so far is complete.
type MaskOutcome = Result<(SimpleVob, bool), String>;

impl std::fmt::Debug for ConstrainedOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstrainedOutput").finish_non_exhaustive()
    }
}

/// `matcher`'s allowed tokens (end of sequence when nothing else can come) and completeness.
fn compute_mask(matcher: &Mutex<Matcher>) -> MaskOutcome {
    let mut matcher = matcher.lock().unwrap_or_else(|e| e.into_inner());
    let mask = matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
    let accepting = matcher.is_accepting().map_err(|e| e.to_string())?;
    Ok((mask, accepting))
}

type Job = Box<dyn FnOnce() + Send>;

/// The threads that compute masks ahead: one per core, shared by every sequence (a mask is a
/// walk of the vocabulary's trie, tens to hundreds of microseconds).
fn mask_workers() -> &'static Mutex<mpsc::Sender<Job>> {
    static WORKERS: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    WORKERS.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        for index in 0..threads {
            let receiver = Arc::clone(&receiver);
            let spawned = std::thread::Builder::new()
                .name(format!("mlxcel-mask-{index}"))
                .spawn(move || {
                    loop {
                        let job = receiver.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => break,
                        }
                    }
                });
            // A thread that cannot start is left out; with none, the channel has no receiver,
            // sends fail, and each mask is computed where it is needed.
            drop(spawned);
        }
        Mutex::new(sender)
    })
}

impl ConstrainedOutput {
    fn new(matcher: Matcher) -> Self {
        let mut output = Self {
            matcher: Arc::new(Mutex::new(matcher)),
            next: None,
        };
        output.prepare();
        output
    }

    /// Starts computing the current state's mask on a worker.
    fn prepare(&mut self) {
        let (sender, receiver) = mpsc::channel();
        let matcher = Arc::clone(&self.matcher);
        let job: Job = Box::new(move || {
            // The receiver may be gone (the request ended): nothing to deliver.
            let _ = sender.send(compute_mask(&matcher));
        });
        let queued = mask_workers()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .is_ok();
        self.next = queued.then_some(receiver);
    }

    /// Sets every logit the constraint forbids to −∞; `stop_tokens` (the model's end tokens)
    /// are allowed exactly when the output so far is complete.
    pub(crate) fn mask(&mut self, logits: &mut [f32], stop_tokens: &[u32]) -> Result<(), String> {
        // The mask computed ahead, or (no worker could take it) computed here.
        let outcome = match self.next.take().map(|r| r.recv()) {
            Some(Ok(outcome)) => outcome,
            _ => compute_mask(&self.matcher),
        };
        let (mask, accepting) = outcome?;
        // Usually few tokens are allowed: copy those into a row of −∞ (the mask's set bits are
        // visited a machine word at a time) rather than testing every token.
        let mut masked = vec![f32::NEG_INFINITY; logits.len()];
        let mut any = false;
        mask.iter_set_entries(|token| {
            if token < logits.len() && !stop_tokens.contains(&(token as u32)) {
                masked[token] = logits[token];
                any = true;
            }
        });
        if accepting {
            for &token in stop_tokens {
                if let Some(&logit) = logits.get(token as usize) {
                    masked[token as usize] = logit;
                    any = true;
                }
            }
        }
        if !any {
            return Err("the constraint allows no token here".into());
        }
        logits.copy_from_slice(&masked);
        Ok(())
    }

    /// Advances past the sampled `token` (not a stop token); `true` when the constraint can
    /// take nothing more (the output is complete). Otherwise the next mask starts computing.
    pub(crate) fn accept(&mut self, token: u32) -> Result<bool, String> {
        // A mask still being computed for the old state must end before the state moves on.
        if let Some(pending) = self.next.take() {
            let _ = pending.recv();
        }
        let stopped = {
            let mut matcher = self.matcher.lock().unwrap_or_else(|e| e.into_inner());
            matcher.consume_token(token).map_err(|e| e.to_string())?;
            matcher.is_stopped()
        };
        if !stopped {
            self.prepare();
        }
        Ok(stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level vocabulary of JSON pieces: `{` `}` space newline `"a"` `:` `1` tab, and the
    /// end token 8.
    fn constraints() -> Constraints {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 8, "content": "</s>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "unk_token": "</s>", "vocab": {
                "{": 0, "}": 1, "▁": 2, "<0x0A>": 3, "\"a\"": 4, ":": 5, "1": 6, "<0x09>": 7,
                "</s>": 8
            }}
        });
        std::fs::write(&path, json.to_string()).unwrap();
        let tokenizer = Arc::new(Tokenizer::from_file(&path).unwrap());
        Constraints::new(tokenizer, 8, 9).unwrap()
    }

    const SPACE: u32 = 2;
    const NEWLINE: u32 = 3;
    const TAB: u32 = 7;

    /// Whether `output`'s next mask allows `token`.
    fn allows(output: &mut ConstrainedOutput, token: u32) -> bool {
        let mut logits = vec![0.0; 9];
        output.mask(&mut logits, &[8]).unwrap();
        logits[token as usize] == 0.0
    }

    #[test]
    fn json_whitespace_between_tokens_is_bounded_as_llama_cpp_bounds_it() {
        let constraints = constraints();
        let mut output = constraints.matcher(&Constraint::JsonObject).unwrap();
        assert!(allows(&mut output, 0));
        output.accept(0).unwrap(); // {
        assert!(allows(&mut output, SPACE));
        output.accept(SPACE).unwrap();
        // One space, then a key or the end of the object: no second blank.
        assert!(!allows(&mut output, SPACE) && !allows(&mut output, NEWLINE));
        assert!(allows(&mut output, 4) && allows(&mut output, 1));
        output.accept(4).unwrap(); // "a"
        output.accept(5).unwrap(); // :
        // Two line breaks, then 20 spaces or tabs of indentation, and no more.
        output.accept(NEWLINE).unwrap();
        output.accept(NEWLINE).unwrap();
        assert!(!allows(&mut output, NEWLINE));
        for k in 0..20 {
            let blank = if k % 2 == 0 { SPACE } else { TAB };
            assert!(allows(&mut output, blank), "indentation {k}");
            output.accept(blank).unwrap();
        }
        assert!(!allows(&mut output, SPACE) && !allows(&mut output, TAB));
        assert!(allows(&mut output, 6));
        output.accept(6).unwrap(); // 1
        output.accept(1).unwrap(); // }
        assert!(allows(&mut output, 8), "complete: the end token");
    }

    #[test]
    fn a_schema_keeps_its_own_json_options() {
        let constraints = constraints();
        let schema = serde_json::json!({
            "type": "object",
            "x-guidance": {"whitespace_flexible": false}
        });
        let mut output = constraints
            .matcher(&Constraint::JsonSchema(schema))
            .unwrap();
        output.accept(0).unwrap(); // {
        assert!(!allows(&mut output, SPACE) && allows(&mut output, 1));
        // A schema that is not an object compiles unchanged.
        assert!(
            constraints
                .matcher(&Constraint::JsonSchema(serde_json::json!(true)))
                .is_ok()
        );
    }
}
