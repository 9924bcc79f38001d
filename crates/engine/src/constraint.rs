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

use crate::constraint_trigger::{AwaitingTrigger, ConstraintTrigger, Replay};
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

/// The most digits a JSON output's number may have in its integral part, its fraction or its
/// exponent, as llama.cpp's JSON-schema grammars allow (`[1-9][0-9]{0,15}`, `[0-9]{1,16}`).
/// llguidance's number lexemes are unbounded, so a model that repeats a digit ("0.000…") would
/// fill its budget with them; masks of JSON outputs refuse the tokens that pass the bound.
const JSON_MAX_DIGITS: u16 = 16;

/// Where a JSON output's text stands, as far as a number's digits go: inside a string (and after
/// a backslash there), or the length of the digit run the number being written is in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct JsonDigits {
    in_string: bool,
    escaped: bool,
    /// Digits so far in the current part (integral, fraction, exponent) of a number; `None`
    /// outside a number.
    run: Option<u16>,
}

impl JsonDigits {
    /// The state after `bytes`, and the longest digit run that one of their digits ends.
    fn advance(mut self, bytes: &[u8]) -> (Self, u16) {
        let mut longest = 0;
        for &byte in bytes {
            if self.in_string {
                match byte {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            self.run = match (byte, self.run) {
                (b'0'..=b'9', run) => {
                    let run = run.map_or(1, |n| n.saturating_add(1));
                    longest = longest.max(run);
                    Some(run)
                }
                (b'-', None) => Some(0),
                (b'.' | b'e' | b'E' | b'+' | b'-', Some(_)) => Some(0),
                (b'"', _) => {
                    self.in_string = true;
                    None
                }
                _ => None,
            };
        }
        (self, longest)
    }
}

/// The vocabulary's bytes, for following a JSON output's digits: every token's, and the tokens
/// that hold a digit (the only ones the bound can refuse).
struct DigitVocabulary {
    words: Vec<Vec<u8>>,
    with_digits: Vec<u32>,
}

/// A JSON output's digit state and the vocabulary to advance it with.
struct DigitBound {
    state: JsonDigits,
    vocabulary: Arc<DigitVocabulary>,
}

impl DigitBound {
    /// Refuses in `mask` the tokens that would take a digit run past the bound from `state`,
    /// unless that would leave no token at all (a schema whose numbers need more digits keeps
    /// llguidance's mask).
    fn apply(state: JsonDigits, vocabulary: &DigitVocabulary, mask: &mut SimpleVob) {
        let refused: Vec<u32> = vocabulary
            .with_digits
            .iter()
            .copied()
            .filter(|&token| {
                mask.is_allowed(token)
                    && state.advance(&vocabulary.words[token as usize]).1 > JSON_MAX_DIGITS
            })
            .collect();
        if !refused.is_empty() && refused.len() < mask.num_set() {
            for token in refused {
                mask.disallow_token(token);
            }
        }
    }
}

/// `schema` with mlxcel's JSON compile options (the bounded whitespace above), unless it chooses
/// its own (llguidance's `x-guidance` key) or is not an object (`true`, `false`), and with its
/// objects closed ([`close_objects`]). Constraints from JSON schemas get them; a Lark grammar's
/// `%json {…}` schemas get them through this.
pub fn with_json_options(mut schema: Value) -> Value {
    close_objects(&mut schema);
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

/// The keywords that let an object have properties it does not name.
const OPEN_OBJECT_KEYWORDS: [&str; 3] = [
    "additionalProperties",
    "unevaluatedProperties",
    "patternProperties",
];

/// Closes the objects of `schema` that name their properties and say nothing of others: they
/// get `"additionalProperties": false`, as llama.cpp's JSON-schema grammars and vLLM's default
/// (XGrammar's strict mode) read such schemas and OpenAI's strict mode requires them. (JSON
/// Schema itself allows any other key there, and a small model writes more keys until its budget
/// runs out.) A schema that wants other keys says so with `additionalProperties`,
/// `unevaluatedProperties` or `patternProperties`.
///
/// Where objects combine (members of `allOf`, a `$ref` or `anyOf`/`oneOf` beside the object's
/// own `properties`), closing a part would refuse its siblings' keys, so: an `allOf` of plain
/// object parts is closed as a whole, over the union of their property names; definitions that
/// are combined with something are left open, as is anything under `not`, `if`/`then`/`else`
/// or other keywords this walk does not know.
pub(crate) fn close_objects(schema: &mut Value) {
    let mut combined = Vec::new();
    combined_refs(schema, &mut combined);
    close(schema, true, &combined);
}

/// The `$ref`s that are combined with something: `allOf` members, or beside other keywords.
fn combined_refs(schema: &Value, refs: &mut Vec<String>) {
    match schema {
        Value::Object(object) => {
            if let Some(Value::String(target)) = object.get("$ref")
                && object.keys().any(|k| {
                    !is_annotation(k) && !matches!(k.as_str(), "$ref" | "$defs" | "definitions")
                })
            {
                refs.push(target.clone());
            }
            if let Some(Value::Array(members)) = object.get("allOf") {
                for member in members {
                    if let Some(Value::String(target)) = member.get("$ref") {
                        refs.push(target.clone());
                    }
                }
            }
            object.values().for_each(|v| combined_refs(v, refs));
        }
        Value::Array(items) => items.iter().for_each(|v| combined_refs(v, refs)),
        _ => {}
    }
}

/// Keywords that do not constrain a value.
fn is_annotation(key: &str) -> bool {
    matches!(
        key,
        "title"
            | "description"
            | "examples"
            | "default"
            | "$comment"
            | "deprecated"
            | "$schema"
            | "$id"
            | "readOnly"
            | "writeOnly"
    )
}

fn close(schema: &mut Value, closable: bool, combined: &[String]) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let has_properties = object.get("properties").is_some_and(Value::is_object);
    let open = OPEN_OBJECT_KEYWORDS.iter().any(|k| object.contains_key(*k));
    let alternatives = object.contains_key("anyOf") || object.contains_key("oneOf");
    let has_all_of = object.contains_key("allOf");
    let has_ref = object.contains_key("$ref");

    // Subschemas that stand alone.
    for key in ["properties", "patternProperties"] {
        if let Some(Value::Object(map)) = object.get_mut(key) {
            map.values_mut().for_each(|v| close(v, true, combined));
        }
    }
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(map)) = object.get_mut(key) {
            for (name, definition) in map.iter_mut() {
                let pointer = format!("#/{key}/{name}");
                close(definition, !combined.contains(&pointer), combined);
            }
        }
    }
    for key in [
        "items",
        "additionalProperties",
        "additionalItems",
        "unevaluatedProperties",
    ] {
        match object.get_mut(key) {
            Some(Value::Array(items)) => items.iter_mut().for_each(|v| close(v, true, combined)),
            Some(item @ Value::Object(_)) => close(item, true, combined),
            _ => {}
        }
    }
    if let Some(Value::Array(items)) = object.get_mut("prefixItems") {
        items.iter_mut().for_each(|v| close(v, true, combined));
    }
    // Alternatives are closed one by one when nothing beside them adds keys.
    let members_closable = closable && !has_properties && !has_all_of && !has_ref;
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(members)) = object.get_mut(key) {
            members
                .iter_mut()
                .for_each(|v| close(v, members_closable, combined));
        }
    }
    let mut all_of_names = Vec::new();
    let mut all_of_plain = true;
    if let Some(Value::Array(members)) = object.get_mut("allOf") {
        for member in members.iter_mut() {
            close(member, false, combined);
            match member.as_object() {
                Some(part) if plain_object_part(part) => {
                    if let Some(Value::Object(properties)) = part.get("properties") {
                        all_of_names.extend(properties.keys().cloned());
                    }
                }
                _ => all_of_plain = false,
            }
        }
    }

    if !closable || open || alternatives || has_ref {
        return;
    }
    if has_all_of {
        if !all_of_plain || all_of_names.is_empty() {
            return;
        }
        let properties = object
            .entry("properties")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(properties) = properties {
            for name in all_of_names {
                properties.entry(name).or_insert(Value::Bool(true));
            }
        }
    } else if !has_properties {
        return;
    }
    object.insert("additionalProperties".into(), Value::Bool(false));
}

/// An `allOf` member whose keys are all known to be closed over by their property names.
fn plain_object_part(part: &serde_json::Map<String, Value>) -> bool {
    part.iter().all(|(key, value)| match key.as_str() {
        "properties" | "required" | "type" | "minProperties" | "maxProperties" => true,
        "additionalProperties" | "unevaluatedProperties" => value == &Value::Bool(false),
        key => is_annotation(key),
    })
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
    digits: Arc<DigitVocabulary>,
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
        let with_digits = (0..words.len() as u32)
            .filter(|&token| {
                let word = &words[token as usize];
                word.first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER)
                    && word.iter().any(u8::is_ascii_digit)
            })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| EngineError::InvalidConstraint {
                kind: "vocabulary",
                message: format!("cannot build the token trie: {e}"),
            })?;
        factory.quiet();
        let digits = Arc::new(DigitVocabulary { words, with_digits });
        Ok(Self { factory, digits })
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
        // Numbers' digits are bounded in outputs that are JSON throughout (a Lark grammar's
        // `%json` parts sit among other text, whose digits are not a number's).
        let digits = matches!(
            constraint,
            Constraint::JsonSchema(_) | Constraint::JsonObject
        )
        .then(|| DigitBound {
            state: JsonDigits::default(),
            vocabulary: Arc::clone(&self.digits),
        });
        Ok(ConstrainedOutput::new(matcher, digits))
    }
}

/// One sequence's constraint in progress. Its next mask is computed ahead, on a worker thread, as
/// soon as the state it depends on is known (at creation, and after each accepted token), so that
/// the computation overlaps the forward pass that produces the logits it will mask; `mask` then
/// waits for it (usually done) and applies it.
pub(crate) struct ConstrainedOutput {
    matcher: Arc<Mutex<Matcher>>,
    /// For JSON outputs: where the text stands in a number's digits.
    digits: Option<DigitBound>,
    /// The mask for the current state, being computed by a worker.
    next: Option<mpsc::Receiver<MaskOutcome>>,
    /// A lazy constraint before its trigger: no mask until then.
    awaiting: Option<AwaitingTrigger>,
}

/// The tokens a state allows, and whether the output so far is complete.
type MaskOutcome = Result<(SimpleVob, bool), String>;

impl std::fmt::Debug for ConstrainedOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstrainedOutput").finish_non_exhaustive()
    }
}

/// `matcher`'s allowed tokens (end of sequence when nothing else can come), less those that
/// pass a JSON number's digit bound, and completeness.
fn compute_mask(
    matcher: &Mutex<Matcher>,
    digits: Option<(JsonDigits, &DigitVocabulary)>,
) -> MaskOutcome {
    let mut matcher = matcher.lock().unwrap_or_else(|e| e.into_inner());
    let mut mask = matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
    let accepting = matcher.is_accepting().map_err(|e| e.to_string())?;
    if let Some((state, vocabulary)) = digits {
        DigitBound::apply(state, vocabulary, &mut mask);
    }
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
    fn new(matcher: Matcher, digits: Option<DigitBound>) -> Self {
        let mut output = Self {
            matcher: Arc::new(Mutex::new(matcher)),
            digits,
            next: None,
            awaiting: None,
        };
        output.prepare();
        output
    }

    /// Makes the constraint lazy: it applies once one of `triggers` appears in the output
    /// ([`crate::constraint_trigger`]); no triggers keep it applying from the start.
    pub(crate) fn lazy(mut self, triggers: &[ConstraintTrigger]) -> Result<Self, EngineError> {
        if triggers.is_empty() {
            return Ok(self);
        }
        let awaiting =
            AwaitingTrigger::new(triggers).map_err(|message| EngineError::InvalidConstraint {
                kind: "grammar trigger",
                message,
            })?;
        // The mask computed ahead for the start is not needed before the trigger.
        if let Some(pending) = self.next.take() {
            let _ = pending.recv();
        }
        self.awaiting = Some(awaiting);
        Ok(self)
    }

    /// Before the trigger, `token` goes to the trigger search; once it fires, the constraint
    /// consumes what the trigger replays. `Some(done)` while waiting (not done) and when the
    /// trigger fires; `None` when the constraint was already applying.
    fn observe_trigger(&mut self, token: u32) -> Option<Result<bool, String>> {
        let awaiting = self.awaiting.as_mut()?;
        let replay = {
            let matcher = self.matcher.lock().unwrap_or_else(|e| e.into_inner());
            let env = match matcher.tok_env() {
                Ok(env) => env,
                Err(e) => return Some(Err(e.to_string())),
            };
            let bytes = env.tok_trie().token(token);
            let piece = bytes
                .strip_prefix(&[TokTrie::SPECIAL_TOKEN_MARKER])
                .unwrap_or(bytes);
            let Some(parts) = awaiting.observe(token, piece) else {
                return Some(Ok(false));
            };
            let mut tokens = Vec::new();
            for part in parts {
                match part {
                    Replay::Token(token) => tokens.push(token),
                    Replay::Text(text) => tokens.extend(env.tokenize_bytes(&text)),
                }
            }
            tokens
        };
        self.awaiting = None;
        let stopped = {
            let mut matcher = self.matcher.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = matcher.consume_tokens(&replay) {
                return Some(Err(e.to_string()));
            }
            matcher.is_stopped()
        };
        if let Some(digits) = &mut self.digits {
            for token in &replay {
                if let Some(word) = digits.vocabulary.words.get(*token as usize) {
                    digits.state = digits.state.advance(word).0;
                }
            }
        }
        if !stopped {
            self.prepare();
        }
        Some(Ok(stopped))
    }

    /// Starts computing the current state's mask on a worker.
    fn prepare(&mut self) {
        let (sender, receiver) = mpsc::channel();
        let matcher = Arc::clone(&self.matcher);
        let digits = self
            .digits
            .as_ref()
            .map(|d| (d.state, Arc::clone(&d.vocabulary)));
        let job: Job = Box::new(move || {
            let digits = digits.as_ref().map(|(state, v)| (*state, &**v));
            // The receiver may be gone (the request ended): nothing to deliver.
            let _ = sender.send(compute_mask(&matcher, digits));
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
        if self.awaiting.is_some() {
            return Ok(());
        }
        // The mask computed ahead, or (no worker could take it) computed here.
        let outcome = match self.next.take().map(|r| r.recv()) {
            Some(Ok(outcome)) => outcome,
            _ => compute_mask(
                &self.matcher,
                self.digits.as_ref().map(|d| (d.state, &*d.vocabulary)),
            ),
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
        if let Some(decided) = self.observe_trigger(token) {
            return decided;
        }
        // A mask still being computed for the old state must end before the state moves on.
        if let Some(pending) = self.next.take() {
            let _ = pending.recv();
        }
        let stopped = {
            let mut matcher = self.matcher.lock().unwrap_or_else(|e| e.into_inner());
            matcher.consume_token(token).map_err(|e| e.to_string())?;
            matcher.is_stopped()
        };
        if let Some(digits) = &mut self.digits
            && let Some(word) = digits.vocabulary.words.get(token as usize)
        {
            digits.state = digits.state.advance(word).0;
        }
        if !stopped {
            self.prepare();
        }
        Ok(stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level vocabulary of JSON pieces: `{` `}` space newline `"a"` `:` `1` tab, the end
    /// token 8, then `.` `11` `"`.
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
                "</s>": 8, ".": 9, "11": 10, "\"": 11
            }}
        });
        std::fs::write(&path, json.to_string()).unwrap();
        let tokenizer = Arc::new(Tokenizer::from_file(&path).unwrap());
        Constraints::new(tokenizer, 8, VOCABULARY).unwrap()
    }

    const VOCABULARY: usize = 12;
    const END: u32 = 8;
    const ONE: u32 = 6;
    const DOT: u32 = 9;
    const ONE_ONE: u32 = 10;
    const QUOTE: u32 = 11;

    const SPACE: u32 = 2;
    const NEWLINE: u32 = 3;
    const TAB: u32 = 7;

    /// Whether `output`'s next mask allows `token`.
    fn allows(output: &mut ConstrainedOutput, token: u32) -> bool {
        let mut logits = vec![0.0; VOCABULARY];
        output.mask(&mut logits, &[END]).unwrap();
        logits[token as usize] == 0.0
    }

    #[test]
    fn a_lazy_constraint_applies_from_its_trigger_on() {
        let constraints = constraints();
        // Triggered by the `{` token: before it, nothing is masked and nothing is consumed.
        let mut output = constraints
            .matcher(&Constraint::JsonObject)
            .unwrap()
            .lazy(&[ConstraintTrigger::Token(0)])
            .unwrap();
        assert!(allows(&mut output, ONE) && allows(&mut output, QUOTE));
        assert_eq!(output.accept(ONE), Ok(false));
        assert_eq!(output.accept(1), Ok(false)); // `}`: free text before the trigger
        assert_eq!(output.accept(0), Ok(false)); // `{`: the object starts here
        assert!(!allows(&mut output, ONE) && allows(&mut output, 4));
        assert_eq!(output.accept(1), Ok(true), "`{{}}` is a complete object");
        // Triggered by a word: the text from the word on is the constraint's first input.
        let mut output = constraints
            .matcher(&Constraint::JsonObject)
            .unwrap()
            .lazy(&[ConstraintTrigger::Word("{\"a\"".into())])
            .unwrap();
        assert_eq!(output.accept(0), Ok(false)); // `{`
        assert_eq!(output.accept(4), Ok(false)); // `"a"`: fires on `{"a"`
        assert!(
            allows(&mut output, 5) && !allows(&mut output, 1),
            "`:` next"
        );
        // A pattern that does not compile is refused, named.
        let err = constraints
            .matcher(&Constraint::JsonObject)
            .unwrap()
            .lazy(&[ConstraintTrigger::Pattern("(".into())])
            .unwrap_err();
        assert!(err.to_string().contains("`(`"), "{err}");
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

    /// Accepts `token` `n` times, each allowed.
    fn accept_times(output: &mut ConstrainedOutput, token: u32, n: usize) {
        for k in 0..n {
            assert!(allows(output, token), "repeat {k} of token {token}");
            output.accept(token).unwrap();
        }
    }

    #[test]
    fn json_number_digits_are_bounded_as_llama_cpp_bounds_them() {
        let constraints = constraints();
        let schema = serde_json::json!({"type": "number"});
        let mut output = constraints
            .matcher(&Constraint::JsonSchema(schema))
            .unwrap();
        accept_times(&mut output, ONE, 15);
        // A token of two digits would make 17; one more makes 16, the last the bound allows.
        assert!(!allows(&mut output, ONE_ONE));
        accept_times(&mut output, ONE, 1);
        assert!(!allows(&mut output, ONE));
        assert!(allows(&mut output, DOT) && allows(&mut output, END));
        output.accept(DOT).unwrap();
        accept_times(&mut output, ONE_ONE, 8);
        assert!(!allows(&mut output, ONE));
        assert!(allows(&mut output, END), "complete: 16 digits each side");
        // Any JSON object's numbers are bounded too.
        let mut output = constraints.matcher(&Constraint::JsonObject).unwrap();
        for token in [0, 4, 5] {
            output.accept(token).unwrap(); // {"a":
        }
        accept_times(&mut output, ONE_ONE, 8);
        assert!(!allows(&mut output, ONE) && allows(&mut output, 1));
    }

    #[test]
    fn digits_outside_json_numbers_are_not_bounded() {
        let constraints = constraints();
        // In a JSON string.
        let schema = serde_json::json!({"type": "string"});
        let mut output = constraints
            .matcher(&Constraint::JsonSchema(schema))
            .unwrap();
        output.accept(QUOTE).unwrap();
        accept_times(&mut output, ONE_ONE, 20);
        // In a regex's output.
        let mut output = constraints
            .matcher(&Constraint::Regex("[0-9]+".into()))
            .unwrap();
        accept_times(&mut output, ONE, 40);
        // A number that needs more digits than the bound keeps them: the bound never leaves a
        // schema without a way to continue.
        let schema = serde_json::json!({"type": "integer", "minimum": 100_000_000_000_000_000_i64});
        let mut output = constraints
            .matcher(&Constraint::JsonSchema(schema))
            .unwrap();
        accept_times(&mut output, ONE, 18);
        assert!(allows(&mut output, END));
    }

    #[test]
    fn objects_that_name_their_properties_are_closed() {
        use serde_json::json;
        let closed = |mut schema: Value| {
            close_objects(&mut schema);
            schema
        };
        // Nested objects, array items and alternatives without properties beside them.
        let schema = json!({"type": "object", "properties": {
            "o": {"type": "object", "properties": {"x": {}}},
            "list": {"type": "array", "items": {"properties": {"y": {}}}},
            "either": {"anyOf": [{"properties": {"z": {}}}, {"type": "null"}]}
        }});
        let schema = closed(schema);
        for pointer in [
            "",
            "/properties/o",
            "/properties/list/items",
            "/properties/either/anyOf/0",
        ] {
            assert_eq!(
                schema.pointer(&format!("{pointer}/additionalProperties")),
                Some(&json!(false)),
                "{pointer}"
            );
        }
        // A schema that says other keys may come keeps them; one naming no properties is left.
        for open in [
            json!({"properties": {"a": {}}, "additionalProperties": true}),
            json!({"properties": {"a": {}}, "patternProperties": {"^x": {}}}),
            json!({"properties": {"a": {}}, "unevaluatedProperties": {"type": "string"}}),
            json!({"type": "object"}),
        ] {
            assert_eq!(closed(open.clone()), open);
        }
        // allOf of plain parts: closed as a whole over the union of their names.
        let schema = closed(json!({"allOf": [
            {"type": "object", "properties": {"a": {}}, "required": ["a"]},
            {"properties": {"b": {}}}
        ]}));
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(schema["properties"], json!({"a": true, "b": true}));
        assert!(schema["allOf"][0].get("additionalProperties").is_none());
        // Parts combined with a $ref, or alternatives beside the object's own properties, stay
        // open (closing one would refuse the other's keys).
        for combined in [
            json!({"$defs": {"base": {"properties": {"a": {}}}},
                   "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {}}}]}),
            json!({"$defs": {"base": {"properties": {"a": {}}}},
                   "$ref": "#/$defs/base", "properties": {"b": {}}}),
            json!({"properties": {"a": {}}, "anyOf": [{"properties": {"b": {}}}]}),
        ] {
            assert_eq!(closed(combined.clone()), combined);
        }
        // A definition used alone is closed.
        let schema = closed(json!({"$defs": {"node": {"properties": {"v": {}}}},
                                   "$ref": "#/$defs/node"}));
        assert_eq!(
            schema["$defs"]["node"]["additionalProperties"],
            json!(false)
        );
    }

    #[test]
    fn a_closed_object_refuses_keys_it_does_not_name() {
        let constraints = constraints();
        let key = |schema: Value| {
            let mut output = constraints
                .matcher(&Constraint::JsonSchema(schema))
                .unwrap();
            output.accept(0).unwrap(); // {
            allows(&mut output, 4) // "a"
        };
        let named_b = serde_json::json!({"type": "integer"});
        assert!(!key(serde_json::json!({"properties": {"b": named_b}})));
        assert!(key(serde_json::json!({"properties": {"b": named_b},
                                       "additionalProperties": true})));
        assert!(key(serde_json::json!({"properties": {"a": named_b}})));
        // An allOf closed over its parts' names still takes each part's keys.
        let parts = |first: &str| {
            serde_json::json!({"allOf": [
                {"properties": {first: {"type": "integer"}}, "required": [first]},
                {"properties": {"c": {"type": "boolean"}}}
            ]})
        };
        assert!(key(parts("a")));
        assert!(!key(parts("b")));
    }
}
