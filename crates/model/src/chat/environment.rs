//! Hugging Face's jinja environment: its syntax options, printing as Python does, its globals
//! (`raise_exception`, `strftime_now`) and filters.

use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};

use super::limits::charge;
use super::python::{float, int, is_python_space, join, python_methods, python_str, round};
use super::strftime::strftime;
use super::tojson::tojson;

/// Hugging Face's environment, less the clock (see [`set_clock`]).
pub(super) fn hf_environment() -> Environment<'static> {
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

pub(super) fn is_raised(e: &Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<RaisedByTemplate>())
}

/// `strftime_now(format)`: the local time (or the pinned one) formatted as Python's
/// `datetime.now().strftime(format)`.
pub(super) fn set_clock(env: &mut Environment<'static>, fixed: Option<jiff::civil::DateTime>) {
    env.add_function("strftime_now", move |format: &str| -> String {
        let now = fixed.unwrap_or_else(|| jiff::Zoned::now().datetime());
        strftime(&now, format)
    });
}
