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

use std::cell::Cell;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, Value, context};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{ModelError, Result};

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

/// The most bytes one render may print through `{{ … }}` (counted as printed, also inside a
/// `{% set %}` block, a macro or a filter block whose text is captured before it reaches the
/// output) and the most bytes its output may hold. A real prompt is a few hundred kilobytes at
/// most (a request body is at most 8 MiB); a template that prints gigabytes (a loop over a
/// repeated string) stops here instead of exhausting memory.
pub const MAX_RENDER_BYTES: usize = 64 << 20;

/// The longest one render may take by default ([`ChatTemplate::with_time_limit`]), checked
/// whenever it prints. Fuel bounds instructions (20 million run in a second or two in a release
/// build, in tens of seconds in a loaded debug build); this bounds instructions that are each
/// expensive (copying large strings), which fuel does not.
pub const MAX_RENDER_TIME: Duration = Duration::from_secs(60);

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
        source
            .map(|s| {
                Self::compile(
                    &s,
                    Some(origin),
                    config.bos_token.as_deref().unwrap_or(""),
                    config.eos_token.as_deref().unwrap_or(""),
                )
            })
            .transpose()
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

/// A bound of [`MAX_RENDER_BYTES`] or [`MAX_RENDER_TIME`] that a render ran past: the source of
/// the minijinja error that stops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RenderLimit {
    Bytes,
    Time(Duration),
}

impl std::fmt::Display for RenderLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderLimit::Bytes => write!(
                f,
                "printed more than {} MiB (does it loop forever?)",
                MAX_RENDER_BYTES >> 20
            ),
            RenderLimit::Time(limit) => write!(
                f,
                "ran past {} s (does it loop forever?)",
                limit.as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for RenderLimit {}

/// The limit in `e`'s chain of sources, if a render ran past one.
fn limit_of(e: &Error) -> Option<RenderLimit> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(limit) = s.downcast_ref::<RenderLimit>() {
            return Some(*limit);
        }
        // An `io::Error`'s `source()` skips the error it wraps: look inside.
        if let Some(limit) = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<RenderLimit>())
        {
            return Some(*limit);
        }
        source = s.source();
    }
    None
}

/// What the render on this thread has printed so far, and when it must end. Renders are
/// synchronous, so a thread-local is the render's own.
#[derive(Debug, Clone, Copy)]
struct Budget {
    printed: usize,
    deadline: Instant,
    limit: Duration,
}

thread_local! {
    static BUDGET: Cell<Option<Budget>> = const { Cell::new(None) };
}

/// The budget of one render, from [`RenderBudget::start`] until dropped (a render inside another
/// one, which no template can start, would get its own and restore the outer one's).
struct RenderBudget(Option<Budget>);

impl RenderBudget {
    fn start(limit: Duration) -> Self {
        Self(BUDGET.replace(Some(Budget {
            printed: 0,
            deadline: Instant::now() + limit,
            limit,
        })))
    }
}

impl Drop for RenderBudget {
    fn drop(&mut self) {
        BUDGET.set(self.0);
    }
}

/// Counts `bytes` printed against the render's budget; an error once past a bound.
fn charge(bytes: usize) -> std::result::Result<(), RenderLimit> {
    let Some(mut budget) = BUDGET.get() else {
        return Ok(());
    };
    budget.printed = budget.printed.saturating_add(bytes);
    BUDGET.set(Some(budget));
    if budget.printed > MAX_RENDER_BYTES {
        Err(RenderLimit::Bytes)
    } else if Instant::now() > budget.deadline {
        Err(RenderLimit::Time(budget.limit))
    } else {
        Ok(())
    }
}

/// The render's output, refused past [`MAX_RENDER_BYTES`] or [`MAX_RENDER_TIME`].
struct BoundedOutput(Vec<u8>);

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len().saturating_add(buf.len()) > MAX_RENDER_BYTES {
            return Err(std::io::Error::other(RenderLimit::Bytes));
        }
        if let Some(budget) = BUDGET.get()
            && Instant::now() > budget.deadline
        {
            return Err(std::io::Error::other(RenderLimit::Time(budget.limit)));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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

/// Hugging Face's environment, less the clock (see [`set_clock`]).
fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters with trim_blocks and lstrip_blocks"),
    );
    // jinja2 autoescapes nothing unless asked; minijinja would escape by the template's name.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_formatter(|out, _state, value| {
        let mut text = String::new();
        python_str(value, &mut text);
        charge(text.len()).map_err(|limit| {
            Error::new(ErrorKind::InvalidOperation, limit.to_string()).with_source(limit)
        })?;
        out.write_str(&text).map_err(Error::from)
    });
    env.set_unknown_method_callback(python_methods);
    env.add_function("raise_exception", raise_exception);
    env.add_filter("tojson", tojson);
    // jinja2's `string` and `join` convert with Python's `str()`, minijinja's with its own display.
    env.add_filter("string", |value: &Value| {
        let mut text = String::new();
        python_str(value, &mut text);
        text
    });
    env.add_filter("join", join);
    env.add_filter("trim", |value: &Value, chars: Option<&str>| {
        let mut text = String::new();
        python_str(value, &mut text);
        match chars {
            Some(chars) => text.trim_matches(|c| chars.contains(c)).to_owned(),
            None => text.trim_matches(is_python_space).to_owned(),
        }
    });
    env.add_filter("round", round);
    env.add_filter("int", int);
    env.add_filter("float", float);
    env
}

/// The error `raise_exception` raises, told apart from the engine's own by this source.
#[derive(Debug)]
struct RaisedByTemplate;

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("raised by the template")
    }
}

impl std::error::Error for RaisedByTemplate {}

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message).with_source(RaisedByTemplate))
}

fn is_raised(e: &Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<RaisedByTemplate>())
}

/// `strftime_now(format)`: the local time (or the pinned one) formatted as Python's
/// `datetime.now().strftime(format)`.
fn set_clock(env: &mut Environment<'static>, fixed: Option<jiff::civil::DateTime>) {
    env.add_function("strftime_now", move |format: &str| -> String {
        let now = fixed.unwrap_or_else(|| jiff::Zoned::now().datetime());
        strftime(&now, format)
    });
}

/// Appends Python's `str(value)`: what jinja2 prints for `{{ value }}`.
fn python_str(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => python_repr(value, out),
    }
}

/// Appends Python's `repr(value)`.
fn python_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => match float_of(value) {
            Some(f) => out.push_str(&python_float(f, "nan", "inf")),
            None => {
                let _ = write!(out, "{value}");
            }
        },
        ValueKind::String => python_repr_str(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            // minijinja 3 keeps tuples apart from lists, as Python prints them: `(1, 2)`, `(1,)`.
            let (open, close) = if value.is_tuple() {
                ('(', ')')
            } else {
                ('[', ']')
            };
            out.push(open);
            let mut count = 0;
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    python_repr(&item, out);
                    count = i + 1;
                }
            }
            if value.is_tuple() && count == 1 {
                out.push(',');
            }
            out.push(close);
        }
        ValueKind::Map => match value.as_object().and_then(|o| o.try_iter_pairs()) {
            Some(pairs) => {
                out.push('{');
                for (i, (key, item)) in pairs.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    python_repr(&key, out);
                    out.push_str(": ");
                    python_repr(&item, out);
                }
                out.push('}');
            }
            None => {
                let _ = write!(out, "{value}");
            }
        },
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// The value as an `f64` if it is a float (not an integer).
fn float_of(value: &Value) -> Option<f64> {
    if value.kind() == ValueKind::Number && !value.is_integer() {
        f64::try_from(value.clone()).ok()
    } else {
        None
    }
}

/// Python's `repr(float)` (also `json.dumps`'s, with its own names for NaN and infinity): the
/// shortest digits that read back the same, in positional notation for exponents -4..16 (always
/// with a fractional part) and scientific notation otherwise (`1e-05`, `1.5e+16`).
fn python_float(f: f64, nan: &str, inf: &str) -> String {
    if f.is_nan() {
        return nan.to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            inf.to_owned()
        } else {
            format!("-{inf}")
        };
    }
    // Rust's `{:e}` prints the shortest round-trip digits, as `d.ddde<exp>`.
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exponent) {
        let (int, frac) = if exponent >= 0 {
            let int_len = exponent as usize + 1;
            if digits.len() <= int_len {
                (format!("{digits:0<int_len$}"), "0".to_owned())
            } else {
                (digits[..int_len].to_owned(), digits[int_len..].to_owned())
            }
        } else {
            let zeros = "0".repeat((-exponent - 1) as usize);
            ("0".to_owned(), format!("{zeros}{digits}"))
        };
        format!("{sign}{int}.{frac}")
    } else {
        let mantissa = match digits.len() {
            1 => digits,
            _ => format!("{}.{}", &digits[..1], &digits[1..]),
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exponent.abs())
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`, escapes for the
/// backslash, the quote, `\n`, `\r`, `\t` and the characters Python does not print.
fn python_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !python_printable(c) => {
                let code = c as u32;
                let _ = match code {
                    0..=0xff => write!(out, "\\x{code:02x}"),
                    0x100..=0xffff => write!(out, "\\u{code:04x}"),
                    _ => write!(out, "\\U{code:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character: not a control, format, separator (other than
/// the space) or private-use character. Unassigned code points, which Python also escapes, print.
fn python_printable(c: char) -> bool {
    !(c.is_control()
        || matches!(c,
            '\u{a0}' | '\u{ad}' | '\u{600}'..='\u{605}' | '\u{61c}' | '\u{6dd}' | '\u{70f}'
            | '\u{1680}' | '\u{180e}' | '\u{2000}'..='\u{200f}' | '\u{2028}'..='\u{202f}'
            | '\u{205f}'..='\u{2064}' | '\u{2066}'..='\u{206f}' | '\u{3000}' | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}' | '\u{e000}'..='\u{f8ff}' | '\u{f0000}'..='\u{10ffff}'))
}

/// jinja2's `join(value, d='', attribute=None)`, converting items with Python's `str()`.
fn join(
    value: &Value,
    separator: Option<&str>,
    kwargs: Kwargs,
) -> std::result::Result<String, Error> {
    let attribute: Option<&str> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    let mut text = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            text.push_str(separator.unwrap_or(""));
        }
        let item = match attribute {
            Some(path) => attribute_path(&item, path),
            None => item,
        };
        python_str(&item, &mut text);
    }
    Ok(text)
}

/// jinja2's `round(value, precision=0, method='common')`: Python's `round` (half to even, on the
/// exact binary value; an integer stays one) or `math.ceil`/`math.floor` at that precision; a float.
fn round(value: &Value, args: &[Value], kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let [precision, method] = python_args("round", ["precision", "method"], args, kwargs)?;
    let precision = precision.and_then(|p| p.as_i64()).unwrap_or(0);
    let method = method
        .as_ref()
        .and_then(Value::as_str)
        .unwrap_or("common")
        .to_owned();
    if value.is_integer() && method == "common" && precision >= 0 {
        return Ok(value.clone());
    }
    let f = f64::try_from(value.clone())?;
    let scale = 10f64.powi(precision.clamp(-400, 400) as i32);
    let rounded = match method.as_str() {
        "common" if precision >= 0 => format!("{f:.0$}", precision as usize).parse().unwrap_or(f),
        "common" => (f * scale).round_ties_even() / scale,
        "ceil" => (f * scale).ceil() / scale,
        "floor" => (f * scale).floor() / scale,
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "method must be common, ceil or floor",
            ));
        }
    };
    Ok(Value::from(rounded))
}

/// jinja2's `int(value, default=0, base=10)`: Python's `int()`, else `int(float())`, else the
/// default.
fn int(value: &Value, args: &[Value], kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let [default, base] = python_args("int", ["default", "base"], args, kwargs)?;
    let default = default.unwrap_or(Value::from(0));
    let base = base.and_then(|b| b.as_i64()).unwrap_or(10);
    Ok(match value.kind() {
        ValueKind::Number if value.is_integer() => value.clone(),
        ValueKind::Bool => Value::from(i64::from(value.is_true())),
        ValueKind::Number => match f64::try_from(value.clone()) {
            Ok(f) if f.is_finite() => Value::from(f.trunc() as i128),
            _ => default,
        },
        ValueKind::String => {
            let text = value.as_str().unwrap_or_default().trim().replace('_', "");
            let parsed = u32::try_from(base)
                .ok()
                .filter(|b| (2..=36).contains(b))
                .and_then(|b| i128::from_str_radix(&text, b).ok());
            match parsed {
                Some(n) => Value::from(n),
                None => match python_float_from_str(&text) {
                    Some(f) if f.is_finite() => Value::from(f.trunc() as i128),
                    _ => default,
                },
            }
        }
        _ => default,
    })
}

/// jinja2's `float(value, default=0.0)`: Python's `float()`, else the default.
fn float(value: &Value, args: &[Value], kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let [default] = python_args("float", ["default"], args, kwargs)?;
    let converted = match value.kind() {
        ValueKind::Number => f64::try_from(value.clone()).ok(),
        ValueKind::Bool => Some(if value.is_true() { 1.0 } else { 0.0 }),
        ValueKind::String => python_float_from_str(value.as_str().unwrap_or_default()),
        _ => None,
    };
    Ok(converted.map_or_else(|| default.unwrap_or(Value::from(0.0)), Value::from))
}

/// Python's `float(str)`: surrounding whitespace, underscores between digits, `inf`/`nan`.
fn python_float_from_str(text: &str) -> Option<f64> {
    text.trim().replace('_', "").parse().ok()
}

/// A Python call's arguments by position, then by keyword: `names[i]` from `args[i]` or from
/// the keyword argument of that name (both is an error, as is an unknown keyword).
fn python_args<const N: usize>(
    function: &str,
    names: [&str; N],
    args: &[Value],
    kwargs: Kwargs,
) -> std::result::Result<[Option<Value>; N], Error> {
    if args.len() > N {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            format!("{function} takes at most {N} arguments"),
        ));
    }
    let mut given: [Option<Value>; N] = std::array::from_fn(|i| args.get(i).cloned());
    for (slot, name) in given.iter_mut().zip(names) {
        if let Some(arg) = kwargs.get::<Option<Value>>(name)? {
            if slot.is_some() {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{function} got multiple values for argument '{name}'"),
                ));
            }
            *slot = Some(arg);
        }
    }
    kwargs.assert_all_used()?;
    Ok(given)
}

/// jinja2's attribute getter: `a.b.0` looks up `a`, then `b`, then item 0.
fn attribute_path(value: &Value, path: &str) -> Value {
    path.split('.').fold(value.clone(), |value, part| {
        let key = match part.parse::<i64>() {
            Ok(index) => Value::from(index),
            Err(_) => Value::from(part),
        };
        value.get_item(&key).unwrap_or(Value::UNDEFINED)
    })
}

/// Python methods on strings, lists and dicts: the ones below, then minijinja-contrib's. Ours
/// replace contrib's where Python differs: its whitespace (`\x1c`..`\x1f` included) for `split`,
/// `strip` and friends, and `title`, which capitalizes after digits too (`2Nd`).
fn python_methods(
    state: &mut State<'_, '_>,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "split" | "rsplit" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) =
                    minijinja::value::from_args(args)?;
                let maxsplit = maxsplit.and_then(|n| usize::try_from(n).ok());
                let parts = python_split(s, sep, maxsplit, method == "rsplit")?;
                return Ok(parts.into_iter().map(Value::from).collect());
            }
            "strip" | "lstrip" | "rstrip" if args.first().is_none_or(Value::is_none) => {
                let () = minijinja::value::from_args(&args[args.len().min(1)..])?;
                return Ok(Value::from(match method {
                    "strip" => s.trim_matches(is_python_space),
                    "lstrip" => s.trim_start_matches(is_python_space),
                    _ => s.trim_end_matches(is_python_space),
                }));
            }
            "title" => {
                let () = minijinja::value::from_args(args)?;
                return Ok(Value::from(python_title(s)));
            }
            "removeprefix" | "removesuffix" => {
                let (affix,): (&str,) = minijinja::value::from_args(args)?;
                let stripped = if method == "removeprefix" {
                    s.strip_prefix(affix)
                } else {
                    s.strip_suffix(affix)
                };
                return Ok(Value::from(stripped.unwrap_or(s)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.isspace` for one character.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `str.split(sep, maxsplit)` (or `rsplit` with `from_right`): on `sep`, or without it on runs of
/// whitespace, ignoring whitespace at the ends; at most `maxsplit` splits.
fn python_split<'a>(
    s: &'a str,
    sep: Option<&str>,
    maxsplit: Option<usize>,
    from_right: bool,
) -> std::result::Result<Vec<&'a str>, Error> {
    let mut parts: Vec<&str> = match (sep, maxsplit, from_right) {
        (Some(""), _, _) => {
            return Err(Error::new(ErrorKind::InvalidOperation, "empty separator"));
        }
        (Some(sep), Some(n), false) => s.splitn(n + 1, sep).collect(),
        (Some(sep), None, false) => s.split(sep).collect(),
        (Some(sep), Some(n), true) => s.rsplitn(n + 1, sep).collect(),
        (Some(sep), None, true) => s.rsplit(sep).collect(),
        (None, _, false) => {
            let mut parts = Vec::new();
            let mut rest = s.trim_start_matches(is_python_space);
            while !rest.is_empty() {
                let at = match rest.find(is_python_space) {
                    Some(at) if maxsplit != Some(parts.len()) => at,
                    _ => {
                        parts.push(rest);
                        break;
                    }
                };
                parts.push(&rest[..at]);
                rest = rest[at..].trim_start_matches(is_python_space);
            }
            parts
        }
        (None, _, true) => {
            let mut parts = Vec::new();
            let mut rest = s.trim_end_matches(is_python_space);
            while !rest.is_empty() {
                let at = match rest.rfind(is_python_space) {
                    Some(at) if maxsplit != Some(parts.len()) => at,
                    _ => {
                        parts.push(rest);
                        break;
                    }
                };
                let space = rest[at..].chars().next().map_or(1, char::len_utf8);
                parts.push(&rest[at + space..]);
                rest = rest[..at].trim_end_matches(is_python_space);
            }
            parts
        }
    };
    if from_right {
        parts.reverse();
    }
    Ok(parts)
}

/// Python's `str.title`: a cased character is upper case after an uncased one (a space, a digit,
/// an apostrophe), lower case after a cased one.
fn python_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut after_cased = false;
    for c in s.chars() {
        if after_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        after_cased = c.is_lowercase() || c.is_uppercase();
    }
    out
}

/// Hugging Face's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// which is `json.dumps` with those arguments.
fn tojson(value: &Value, args: &[Value], kwargs: Kwargs) -> std::result::Result<String, Error> {
    let [ensure_ascii, indent, separators, sort_keys] = python_args(
        "tojson",
        ["ensure_ascii", "indent", "separators", "sort_keys"],
        args,
        kwargs,
    )?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => " ".repeat(v.as_i64().unwrap_or(0).max(0) as usize),
        }),
    };
    let (item_separator, key_separator) = match separators.filter(|s| !s.is_none()) {
        Some(pair) => {
            let pair: Vec<Value> = pair.try_iter()?.collect();
            match pair.as_slice() {
                [item, key] => (
                    item.as_str().unwrap_or(",").to_owned(),
                    key.as_str().unwrap_or(":").to_owned(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson's separators must be a pair",
                    ));
                }
            }
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let options = JsonOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    write_json(value, &options, 0, &mut out)?;
    Ok(out)
}

#[derive(Debug)]
struct JsonOptions {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", value.kind()),
    )
}

fn write_json(
    value: &Value,
    options: &JsonOptions,
    level: usize,
    out: &mut String,
) -> std::result::Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match float_of(value) {
            Some(f) => out.push_str(&python_float(f, "NaN", "Infinity")),
            None => {
                let _ = write!(out, "{value}");
            }
        },
        ValueKind::String => json_string(value.as_str().unwrap_or_default(), options, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(
                ('[', ']'),
                items.len(),
                options,
                level,
                out,
                |i, level, out| write_json(&items[i], options, level, out),
            )?;
        }
        ValueKind::Map => {
            let Some(pairs) = value.as_object().and_then(|o| o.try_iter_pairs()) else {
                return Err(not_serializable(value));
            };
            let mut pairs: Vec<(String, Value)> = pairs
                .map(|(k, v)| json_key(&k).map(|k| (k, v)))
                .collect::<std::result::Result<_, _>>()?;
            if options.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                ('{', '}'),
                pairs.len(),
                options,
                level,
                out,
                |i, level, out| {
                    json_string(&pairs[i].0, options, out);
                    out.push_str(&options.key_separator);
                    write_json(&pairs[i].1, options, level, out)
                },
            )?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// A container as json.dumps writes it: `[]`/`{}` when empty; otherwise, with an indent, each item
/// on its own line one level deeper and the closing bracket on a line of its own.
fn write_container(
    (open, close): (char, char),
    len: usize,
    options: &JsonOptions,
    level: usize,
    out: &mut String,
    mut item: impl FnMut(usize, usize, &mut String) -> std::result::Result<(), Error>,
) -> std::result::Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for i in 0..len {
        if i > 0 {
            out.push_str(&options.item_separator);
        }
        newline(out, level + 1);
        item(i, level + 1, out)?;
    }
    newline(out, level);
    out.push(close);
    Ok(())
}

/// A map key as json.dumps converts it: strings as they are, numbers, booleans and None as JSON.
fn json_key(key: &Value) -> std::result::Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::Number => match float_of(key) {
            Some(f) => python_float(f, "NaN", "Infinity"),
            None => key.to_string(),
        },
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "keys must be str, int, float, bool or None, not {}",
                    key.kind()
                ),
            ));
        }
    })
}

/// A JSON string as json.dumps writes it: `"`, `\` and control characters escaped (`\n`, `\r`,
/// `\t`, `\b`, `\f`, else `\u00XX`), and with `ensure_ascii` every non-ASCII character as
/// `\uXXXX` (UTF-16, so surrogate pairs beyond the BMP).
fn json_string(s: &str, options: &JsonOptions, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (options.ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `t.strftime(format)` as CPython on glibc computes it for a naive datetime: Python itself
/// expands `%f` and empties `%z`/`%Z` (no time zone), glibc does the rest in the C locale,
/// including the flags `-` (no padding), `_` (spaces), `0` (zeros), `^` (upper case), `#` (swap
/// case) and a field width. An unknown directive is copied as it is.
fn strftime(t: &jiff::civil::DateTime, format: &str) -> String {
    let mut out = String::new();
    let mut rest = format;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let spec = &rest[at..];
        let (consumed, text) = directive(t, spec);
        out.push_str(&text);
        rest = &spec[consumed..];
    }
    out.push_str(rest);
    out
}

/// One directive at the start of `spec` (which starts with `%`): how many bytes it spans and what
/// it prints.
fn directive(t: &jiff::civil::DateTime, spec: &str) -> (usize, String) {
    let bytes = spec.as_bytes();
    let mut i = 1;
    let mut pad: Option<char> = None;
    let mut no_pad = false;
    let mut upper = false;
    let mut swap_case = false;
    while let Some(&flag) = bytes.get(i) {
        match flag {
            b'-' => no_pad = true,
            b'_' => (pad, no_pad) = (Some(' '), false),
            b'0' => (pad, no_pad) = (Some('0'), false),
            b'^' => upper = true,
            b'#' => swap_case = true,
            _ => break,
        }
        i += 1;
    }
    let width_start = i;
    while bytes.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    let width: usize = spec[width_start..i].parse().unwrap_or(0);
    // The C locale ignores the E and O modifiers.
    while matches!(bytes.get(i), Some(b'E' | b'O')) && bytes.get(i + 1).is_some() {
        i += 1;
    }
    let Some(conversion) = spec[i..].chars().next() else {
        return (spec.len(), spec.to_owned());
    };
    let end = i + conversion.len_utf8();
    let plain = end == 2;
    let weekday = t.weekday().to_sunday_zero_offset() as usize;
    let yday = t.day_of_year() as i64 - 1;
    let hour12 = match t.hour() % 12 {
        0 => 12,
        h => h as i64,
    };
    let iso = t.date().iso_week_date();
    // (digits, default padding, default width) or text.
    enum Field {
        Number(i64, char, usize),
        Text(String),
    }
    let field = match conversion {
        'a' => Field::Text(WEEKDAYS[weekday][..3].to_owned()),
        'A' => Field::Text(WEEKDAYS[weekday].to_owned()),
        'b' | 'h' => Field::Text(MONTHS[t.month() as usize - 1][..3].to_owned()),
        'B' => Field::Text(MONTHS[t.month() as usize - 1].to_owned()),
        'c' => Field::Text(strftime(t, "%a %b %e %H:%M:%S %Y")),
        'C' => Field::Number(t.year() as i64 / 100, '0', 2),
        'd' => Field::Number(t.day() as i64, '0', 2),
        'D' | 'x' => Field::Text(strftime(t, "%m/%d/%y")),
        'e' => Field::Number(t.day() as i64, ' ', 2),
        'F' => Field::Text(strftime(t, "%Y-%m-%d")),
        'g' => Field::Number((iso.year() as i64).rem_euclid(100), '0', 2),
        'G' => Field::Number(iso.year() as i64, '0', 1),
        'H' => Field::Number(t.hour() as i64, '0', 2),
        'I' => Field::Number(hour12, '0', 2),
        'j' => Field::Number(yday + 1, '0', 3),
        'k' => Field::Number(t.hour() as i64, ' ', 2),
        'l' => Field::Number(hour12, ' ', 2),
        'm' => Field::Number(t.month() as i64, '0', 2),
        'M' => Field::Number(t.minute() as i64, '0', 2),
        'n' => Field::Text("\n".to_owned()),
        'p' | 'P' => {
            let am_pm = if t.hour() < 12 { "AM" } else { "PM" };
            let lower = conversion == 'P' || swap_case;
            Field::Text(if lower {
                am_pm.to_lowercase()
            } else {
                am_pm.to_owned()
            })
        }
        'r' => Field::Text(strftime(t, "%I:%M:%S %p")),
        'R' => Field::Text(strftime(t, "%H:%M")),
        's' => match t.to_zoned(jiff::tz::TimeZone::system()) {
            Ok(zoned) => Field::Number(zoned.timestamp().as_second(), '0', 1),
            Err(_) => Field::Text(spec[..end].to_owned()),
        },
        'S' => Field::Number(t.second() as i64, '0', 2),
        't' => Field::Text("\t".to_owned()),
        'T' | 'X' => Field::Text(strftime(t, "%H:%M:%S")),
        'u' => Field::Number(t.weekday().to_monday_one_offset() as i64, '0', 1),
        'U' => Field::Number((yday + 7 - weekday as i64) / 7, '0', 2),
        'V' => Field::Number(iso.week() as i64, '0', 2),
        'w' => Field::Number(weekday as i64, '0', 1),
        'W' => Field::Number((yday + 7 - (weekday as i64 + 6) % 7) / 7, '0', 2),
        'y' => Field::Number((t.year() as i64).rem_euclid(100), '0', 2),
        'Y' => Field::Number(t.year() as i64, '0', 1),
        // Python's own: no time zone on a naive datetime, and microseconds (only as plain `%f`).
        'z' | 'Z' => Field::Text(String::new()),
        'f' if plain => Field::Text(format!("{:06}", t.subsec_nanosecond() / 1000)),
        '%' if plain => Field::Text("%".to_owned()),
        _ => Field::Text(spec[..end].to_owned()),
    };
    let text = match field {
        Field::Number(n, default_pad, default_width) => {
            let digits = n.abs().to_string();
            let sign = if n < 0 { "-" } else { "" };
            let width = if no_pad { 0 } else { width.max(default_width) };
            let fill = pad.unwrap_or(default_pad);
            let len = sign.len() + digits.len();
            let padding: String = std::iter::repeat_n(fill, width.saturating_sub(len)).collect();
            if fill == '0' {
                format!("{sign}{padding}{digits}")
            } else {
                format!("{padding}{sign}{digits}")
            }
        }
        Field::Text(text) => {
            let text = if upper || (swap_case && matches!(conversion, 'a' | 'A' | 'b' | 'B' | 'h'))
            {
                text.to_uppercase()
            } else {
                text
            };
            let fill = pad.unwrap_or(' ');
            let padding: String =
                std::iter::repeat_n(fill, width.saturating_sub(text.chars().count())).collect();
            format!("{padding}{text}")
        }
    };
    (end, text)
}

/// The parts of `tokenizer_config.json` we use.
#[derive(Debug, Default)]
pub(crate) struct TokenizerConfig {
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl TokenizerConfig {
    pub(crate) fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer_config.json");
        if !path.is_file() {
            return Ok(Self::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let json: Json = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        let chat_template = match json.get("chat_template") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Json::as_str)
                .map(str::to_owned),
            Some(_) => {
                return Err(ModelError::invalid(
                    &path,
                    "chat_template",
                    "expected a string or a list of {name, template}",
                ));
            }
        };
        Ok(Self {
            chat_template,
            bos_token: special_token(json.get("bos_token")),
            eos_token: special_token(json.get("eos_token")),
        })
    }
}

/// A special token given as a string or as an AddedToken object (`{"content": ...}`).
fn special_token(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}
