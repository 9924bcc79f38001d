//! The `tojson` filter as Hugging Face defines it: Python's `json.dumps` with its arguments.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use super::python::{float_of, python_args, python_float};

/// Hugging Face's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// which is `json.dumps` with those arguments.
pub(super) fn tojson(
    value: &Value,
    args: &[Value],
    kwargs: Kwargs,
) -> std::result::Result<String, Error> {
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
