//! Python's printing (`str`, `repr`), the Python methods and filters templates call on strings,
//! lists and dicts that minijinja-contrib lacks, and their argument parsing.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

/// Appends Python's `str(value)`: what jinja2 prints for `{{ value }}`.
pub(super) fn python_str(value: &Value, out: &mut String) {
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
pub(super) fn float_of(value: &Value) -> Option<f64> {
    if value.kind() == ValueKind::Number && !value.is_integer() {
        f64::try_from(value.clone()).ok()
    } else {
        None
    }
}

/// Python's `repr(float)` (also `json.dumps`'s, with its own names for NaN and infinity): the
/// shortest digits that read back the same, in positional notation for exponents -4..16 (always
/// with a fractional part) and scientific notation otherwise (`1e-05`, `1.5e+16`).
pub(super) fn python_float(f: f64, nan: &str, inf: &str) -> String {
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
pub(super) fn join(
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
pub(super) fn round(
    value: &Value,
    args: &[Value],
    kwargs: Kwargs,
) -> std::result::Result<Value, Error> {
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
pub(super) fn int(
    value: &Value,
    args: &[Value],
    kwargs: Kwargs,
) -> std::result::Result<Value, Error> {
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
pub(super) fn float(
    value: &Value,
    args: &[Value],
    kwargs: Kwargs,
) -> std::result::Result<Value, Error> {
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
pub(super) fn python_args<const N: usize>(
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
pub(super) fn python_methods(
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
pub(super) fn is_python_space(c: char) -> bool {
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
