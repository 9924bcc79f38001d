//! Chat templates: Hugging Face Jinja templates rendered with `minijinja` as `apply_chat_template`
//! renders them with jinja2.
//!
//! Hugging Face compiles a template in an immutable sandbox with `trim_blocks`, `lstrip_blocks` and
//! loop controls, replaces jinja's `tojson` with `json.dumps` (no HTML escaping; `indent`,
//! `separators`, `sort_keys`, `ensure_ascii`), adds the `raise_exception` and `strftime_now`
//! globals, and renders with `messages`, `tools` and `documents` (`None` when absent),
//! `add_generation_prompt`, the special tokens and any other keyword argument. We do the same, and
//! print values as Python does (`None`, `True`, `['a', 1]`), with Python's string, list and dict
//! methods from `minijinja-contrib` plus the few it lacks. `scripts/check-chat-templates` proves a
//! corpus of templates against jinja2 itself; docs/model.md lists what still differs.

pub(crate) mod caps;
mod environment;
mod limits;
mod python;
mod strftime;
mod tojson;
mod tokenizer_config;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use minijinja::value::{Serde, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

use environment::{hf_environment, is_raised, set_clock};
use limits::{BoundedOutput, RenderBudget, limit_of};
pub use limits::{MAX_RENDER_BYTES, MAX_RENDER_TIME};
pub(crate) use tokenizer_config::TokenizerConfig;

use crate::error::{ModelError, Result};

/// The current local time formatted as Python's `datetime.now().strftime(format)`, as a
/// template's `strftime_now(format)` reads it unpinned: for variables a server gives templates
/// (llama-server's `date_string` and `datetime`).
pub fn strftime_now(format: &str) -> String {
    strftime::strftime(&jiff::Zoned::now().datetime(), format)
}

/// One chat message with text content. Richer messages (content parts, tool calls, tool results)
/// go through [`ChatTemplate::render_with`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template came from, for error messages; `None` for [`ChatTemplate::new`].
    origin: Option<String>,
    bos_token: String,
    eos_token: String,
    /// The longest one render may take.
    time_limit: Duration,
    /// The checkpoint's separate template for requests with tools (the `tool_use` entry of
    /// `tokenizer_config.json`'s named templates), if it has one.
    tool_use: Option<Box<ChatTemplate>>,
}

const TEMPLATE_NAME: &str = "chat_template";

/// The most instructions one render may execute. jinja2 has no such bound, but a template can
/// recurse without end (a macro calling itself) or nest ranges into billions of steps; this stops
/// it after a few seconds with an error naming the line, instead of holding a request forever. A
/// real template uses a few hundred instructions per message.
const FUEL: u64 = 20_000_000;

/// The deepest one render may nest macro calls, recursive loops and includes. minijinja's own
/// bound is 500; real templates nest a few levels (a macro over a tool's JSON schema recurses once
/// per level of the schema). Lower keeps a debug build's 2 MiB thread stack safe.
const MAX_RECURSION: usize = 200;

impl ChatTemplate {
    /// The text of the beginning-of-sequence token the template renders as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The text of the end-of-sequence token the template renders as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// The template's source text (to tell which tool-call format the model was trained on).
    pub fn source(&self) -> String {
        self.env
            .get_template(TEMPLATE_NAME)
            .map(|t| t.source().to_owned())
            .unwrap_or_default()
    }

    /// Compiles `source`; `bos_token`/`eos_token` are the strings the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::compile(source, None, bos_token, eos_token)
    }

    fn compile(
        source: &str,
        origin: Option<String>,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self> {
        // jinja2 reads `\r\n` and `\r` as `\n`, in text and in string literals alike.
        let source = rewrite_generation_tags(&source.replace("\r\n", "\n").replace('\r', "\n"));
        let mut env = hf_environment();
        set_clock(&mut env, None);
        let mut template = Self {
            env,
            origin,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            time_limit: MAX_RENDER_TIME,
            tool_use: None,
        };
        if let Err(e) = template
            .env
            .add_template_owned(TEMPLATE_NAME, source.clone())
        {
            return Err(template.error(&e, &source, Stage::Compile));
        }
        template.env.set_fuel(Some(FUEL));
        template.env.set_recursion_limit(MAX_RECURSION);
        Ok(template)
    }

    /// Loads the template of the checkpoint in `dir`: `chat_template.jinja`, else
    /// `tokenizer_config.json`'s `chat_template` (a string, or a list whose `default` entry is used;
    /// a converted GGUF's `tokenizer.chat_template` is there). `Ok(None)` when the checkpoint has none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let config = TokenizerConfig::from_dir(dir)?;
        let jinja = dir.join("chat_template.jinja");
        let (source, origin) = if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?;
            (Some(source), jinja.display().to_string())
        } else {
            let path = dir.join("tokenizer_config.json");
            (
                config.chat_template,
                format!("{} `chat_template`", path.display()),
            )
        };
        let (bos, eos) = (
            config.bos_token.as_deref().unwrap_or(""),
            config.eos_token.as_deref().unwrap_or(""),
        );
        let tool_use = config
            .chat_template_tool_use
            .map(|s| {
                let origin = format!(
                    "{} `chat_template` `tool_use`",
                    dir.join("tokenizer_config.json").display()
                );
                Self::compile(&s, Some(origin), bos, eos)
            })
            .transpose()?;
        source
            .map(|s| -> Result<Self> {
                let mut template = Self::compile(&s, Some(origin), bos, eos)?;
                template.tool_use = tool_use.map(Box::new);
                Ok(template)
            })
            .transpose()
    }

    /// The checkpoint's separate template for requests with tools, if it has one.
    pub fn tool_use(&self) -> Option<&ChatTemplate> {
        self.tool_use.as_deref()
    }

    /// Pins the clock `strftime_now` reads to `local`, a date and time as Python's
    /// `datetime.fromisoformat` reads them (`2026-03-07T09:05:07`, optionally with `.ffffff`), for
    /// tests and reproducible prompts. Otherwise it reads the current local time, as Python does.
    pub fn with_fixed_now(mut self, local: &str) -> Result<Self> {
        let now = local
            .parse::<jiff::civil::DateTime>()
            .map_err(|e| ModelError::ChatTemplate {
                reason: format!("strftime_now's fixed clock `{local}`: {e}"),
            })?;
        set_clock(&mut self.env, Some(now));
        Ok(self)
    }

    /// Bounds the time of each render to `limit` instead of [`MAX_RENDER_TIME`].
    pub fn with_time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = limit;
        self
    }

    /// Renders `messages`; with `add_generation_prompt`, ends with the assistant's turn header.
    /// Templates write their own special tokens (BOS included): tokenize the result with
    /// `add_special = false`, as Hugging Face does after `apply_chat_template`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(&context! {
            messages => Value::from(Serde(messages)),
            add_generation_prompt => add_generation_prompt,
        })
    }

    /// Renders with the variables of Hugging Face's `apply_chat_template(messages, tools=...,
    /// documents=..., add_generation_prompt=..., **kwargs)`: `context` serializes to a map with
    /// `messages` (each a map: `role`, `content` as a string or a list of parts, `tool_calls`,
    /// `tool_call_id`, `name`, ...) and optionally `tools` (JSON schemas), `documents`,
    /// `add_generation_prompt` and any other keyword argument (`enable_thinking`, ...). As in
    /// Hugging Face, `tools` and `documents` are `none` and `add_generation_prompt` is false when
    /// absent, and `bos_token`/`eos_token` are the checkpoint's unless given.
    ///
    /// Maps keep the order in which `context` serializes them, which `tojson` reproduces: pass
    /// types that keep the order of the request (structs, `minijinja::Value` deserialized from
    /// JSON), not a `serde_json::Value`, whose maps come out sorted.
    pub fn render_with<C: Serialize + ?Sized>(&self, context: &C) -> Result<String> {
        let given = Value::from(Serde(context));
        let has_messages = given.kind() == ValueKind::Map
            && given.get_attr("messages").is_ok_and(|m| !m.is_undefined());
        if !has_messages {
            return Err(ModelError::ChatTemplate {
                reason: "the render context must be a map with `messages`".to_owned(),
            });
        }
        let defaults = context! {
            tools => (),
            documents => (),
            add_generation_prompt => false,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let template =
            self.env
                .get_template(TEMPLATE_NAME)
                .map_err(|e| ModelError::ChatTemplate {
                    reason: e.to_string(),
                })?;
        let _budget = RenderBudget::start(self.time_limit);
        let mut out = BoundedOutput(Vec::new());
        // A backstop: minijinja 2.24 panicked on some inputs (a negative-step slice of an empty
        // string or list, `''[::-1]`, found by the chat_template fuzzer; fixed in minijinja 3).
        // A template from a checkpoint must not take the process down, so a panic while
        // rendering (the renderer's or one of our filters') is an error that names the
        // template. (Rendering reads the template and the context only; nothing is left
        // half-updated by the unwinding.)
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            template.render_captured_to(context! { ..given, ..defaults }, &mut out)
        }));
        match rendered {
            Ok(result) => {
                result.map_err(|e| self.error(&e, template.source(), Stage::Render))?;
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("no message");
                let origin = self
                    .origin
                    .as_ref()
                    .map_or_else(String::new, |o| format!("{o}: "));
                return Err(ModelError::ChatTemplate {
                    reason: format!(
                        "{origin}the template renderer (minijinja) failed on this template: \
                         {message}"
                    ),
                });
            }
        }
        // minijinja writes only `str`s, so this never loses anything.
        Ok(String::from_utf8(out.0)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// `origin: [does not compile: ]line N: what (in `the line`)`, from a minijinja error.
    fn error(&self, e: &Error, source: &str, stage: Stage) -> ModelError {
        let what = if is_raised(e) {
            e.detail().unwrap_or_default().to_owned()
        } else if e.kind() == ErrorKind::OutOfFuel {
            format!("ran past {FUEL} instructions (does it loop forever?)")
        } else if let Some(limit) = limit_of(e) {
            limit.to_string()
        } else {
            match e.detail() {
                Some(detail) => format!("{}: {detail}", e.kind()),
                None => e.kind().to_string(),
            }
        };
        let mut reason = match &self.origin {
            Some(origin) => format!("{origin}: "),
            None => String::new(),
        };
        if stage == Stage::Compile {
            reason.push_str("does not compile: ");
        }
        match e.line() {
            Some(line) => {
                let _ = write!(reason, "line {line}: {what}");
                if let Some(text) = source.lines().nth(line.saturating_sub(1)) {
                    let text = text.trim();
                    if !text.is_empty() {
                        let _ = write!(reason, " (in `{}`)", truncate(text, 120));
                    }
                }
            }
            None => reason.push_str(&what),
        }
        ModelError::ChatTemplate { reason }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Compile,
    Render,
}

/// Hugging Face's `{% generation %}…{% endgeneration %}`, which marks the assistant's tokens for
/// training masks and renders its body unchanged, as a block minijinja knows with the same
/// whitespace control and its own scope: `{% filter string %}…{% endfilter %}`. Lines keep their
/// numbers.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        // The closing `%}` comes after the opening `{%` (in `{%}` they share the `%`).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            rest = tag;
            break;
        };
        let inner = &tag[2..end];
        let (open, inner) = match inner.strip_prefix(['-', '+']) {
            Some(stripped) => (&inner[..1], stripped),
            None => ("", inner),
        };
        let (inner, close) = match inner.strip_suffix(['-', '+']) {
            Some(stripped) => (stripped, &inner[inner.len() - 1..]),
            None => (inner, ""),
        };
        match inner.trim() {
            "generation" => {
                let _ = write!(out, "{{%{open} filter string {close}%}}");
            }
            "endgeneration" => {
                let _ = write!(out, "{{%{open} endfilter {close}%}}");
            }
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
