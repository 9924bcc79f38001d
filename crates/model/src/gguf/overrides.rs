//! llama.cpp's `--override-kv KEY=TYPE:VALUE[,...]`: typed replacements of a GGUF file's
//! metadata, applied by the importer before the config, tokenizer and tensor plan are derived
//! from it.
//!
//! The spelling is llama.cpp's (`common/common.cpp`'s `string_parse_kv_override`): a key under
//! 128 bytes, `=`, a type `int`, `float`, `bool` or `str`, `:` and the value (`true`/`false` for
//! a bool, at most 127 bytes for a string); one flag value may hold several, comma-separated (a
//! field in double quotes may hold commas, `""` is a quote), and the flag may repeat. Unlike
//! llama.cpp, which reads `int:abc` as 0 (`atol`), a number that does not parse is refused. A
//! value whose type differs from the file's value of that key (an `int` where the file holds a
//! float) is refused, as llama.cpp refuses it when the key is read.

use std::fmt;

use crate::error::{ModelError, Result};
use crate::gguf::reader::{GgufFile, GgufValue};

/// The flag every error names.
pub const OVERRIDE_KV_FLAG: &str = "--override-kv";

/// One override: the metadata `key` takes `value`. `spec` is the text it was parsed from.
#[derive(Debug, Clone, PartialEq)]
pub struct KvOverride {
    pub key: String,
    pub value: GgufValue,
    pub spec: String,
}

fn refuse(item: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Override {
        flag: format!("{OVERRIDE_KV_FLAG} {item}"),
        reason: reason.into(),
    }
}

/// llama.cpp's CSV row: fields split at commas outside double quotes; a quote opens a quoted
/// field only at the field's start (elsewhere it is literal), and `""` inside one is a quote.
fn csv_fields(input: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = input.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' if quoted => quoted = false,
            '"' if field.is_empty() => quoted = true,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

impl KvOverride {
    /// Parses one `KEY=TYPE:VALUE`.
    pub fn parse(item: &str) -> Result<Self> {
        let expected = "expected KEY=TYPE:VALUE with TYPE int, float, bool or str \
                        (tokenizer.ggml.add_bos_token=bool:false)";
        let (key, typed) = item.split_once('=').ok_or_else(|| refuse(item, expected))?;
        if key.is_empty() || key.len() >= 128 {
            return Err(refuse(
                item,
                format!("the key must be 1 to 127 bytes; {expected}"),
            ));
        }
        let (kind, text) = typed
            .split_once(':')
            .ok_or_else(|| refuse(item, expected))?;
        let value = match kind {
            "int" => GgufValue::I64(
                text.trim()
                    .parse()
                    .map_err(|_| refuse(item, format!("`{text}` is not an integer")))?,
            ),
            "float" => {
                let v: f64 = text
                    .trim()
                    .parse()
                    .map_err(|_| refuse(item, format!("`{text}` is not a number")))?;
                GgufValue::F64(v)
            }
            "bool" => match text {
                "true" => GgufValue::Bool(true),
                "false" => GgufValue::Bool(false),
                _ => return Err(refuse(item, format!("`{text}` is not true or false"))),
            },
            "str" if text.len() > 127 => {
                return Err(refuse(item, "a string value cannot exceed 127 bytes"));
            }
            "str" => GgufValue::String(text.to_owned()),
            other => {
                return Err(refuse(item, format!("`{other}` is not a type; {expected}")));
            }
        };
        Ok(Self {
            key: key.to_owned(),
            value,
            spec: item.to_owned(),
        })
    }

    /// Parses one flag value: comma-separated overrides (llama.cpp's CSV row).
    pub fn parse_list(value: &str) -> Result<Vec<Self>> {
        csv_fields(value).iter().map(|f| Self::parse(f)).collect()
    }

    /// The type word of the override (`int`, `float`, `bool`, `str`).
    fn kind(&self) -> &'static str {
        kind_of(&self.value).unwrap_or("array")
    }
}

impl fmt::Display for KvOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec)
    }
}

/// The override type that may replace a value of the file's type (`None` for arrays).
fn kind_of(value: &GgufValue) -> Option<&'static str> {
    Some(match value {
        GgufValue::U8(_)
        | GgufValue::I8(_)
        | GgufValue::U16(_)
        | GgufValue::I16(_)
        | GgufValue::U32(_)
        | GgufValue::I32(_)
        | GgufValue::U64(_)
        | GgufValue::I64(_) => "int",
        GgufValue::F32(_) | GgufValue::F64(_) => "float",
        GgufValue::Bool(_) => "bool",
        GgufValue::String(_) => "str",
        GgufValue::Array(_) => return None,
    })
}

/// Replaces `gguf`'s metadata values by `overrides` (a key the file lacks is added); the last
/// override of a key wins, as in llama.cpp.
pub(crate) fn apply(gguf: &mut GgufFile, overrides: &[KvOverride]) -> Result<()> {
    for o in overrides {
        if let Some(found) = gguf.metadata.get(&o.key) {
            let held = kind_of(found);
            if held != Some(o.kind()) {
                return Err(refuse(
                    &o.spec,
                    format!(
                        "{} holds {} for `{}`; an override must be of the same type ({})",
                        gguf.path().display(),
                        held.map_or("an array".to_owned(), |k| format!("a {k}")),
                        o.key,
                        held.map_or("arrays cannot be overridden".to_owned(), |k| format!(
                            "{k}:"
                        )),
                    ),
                ));
            }
        }
        gguf.metadata.insert(o.key.clone(), o.value.clone());
    }
    Ok(())
}

/// The overrides whose key the importer never read from `gguf` (they change nothing).
pub(crate) fn unread(gguf: &GgufFile, overrides: &[KvOverride]) -> Vec<String> {
    let read = gguf.read_keys();
    let mut keys: Vec<String> = overrides
        .iter()
        .filter(|o| !read.contains(&o.key))
        .map(|o| o.key.clone())
        .collect();
    keys.dedup();
    keys
}

/// A short, stable name for a set of overrides: the cache directory of a GGUF prepared with them.
pub(crate) fn fingerprint(overrides: &[KvOverride]) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for o in overrides {
        hash.update(o.spec.as_bytes());
        hash.update([0]);
    }
    hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_spellings_parse() {
        let list = KvOverride::parse_list(
            "tokenizer.ggml.add_bos_token=bool:false,llama.context_length=int:4096,\
             llama.rope.freq_base=float:5e4,general.name=str:a b",
        )
        .unwrap();
        let values: Vec<_> = list
            .iter()
            .map(|o| (o.key.as_str(), o.value.clone()))
            .collect();
        assert_eq!(
            values,
            [
                ("tokenizer.ggml.add_bos_token", GgufValue::Bool(false)),
                ("llama.context_length", GgufValue::I64(4096)),
                ("llama.rope.freq_base", GgufValue::F64(50000.0)),
                ("general.name", GgufValue::String("a b".into())),
            ]
        );
        // A quoted field keeps its commas; "" is a quote.
        let quoted = KvOverride::parse_list(r#""general.name=str:a,""b""",x=int:-3"#).unwrap();
        assert_eq!(quoted[0].value, GgufValue::String("a,\"b\"".into()));
        assert_eq!(quoted[1].value, GgufValue::I64(-3));
    }

    #[test]
    fn malformed_overrides_are_refused_naming_the_flag() {
        for (item, says) in [
            ("no-equals", "expected KEY=TYPE:VALUE"),
            ("=int:1", "1 to 127 bytes"),
            ("k=int", "expected KEY=TYPE:VALUE"),
            ("k=int:abc", "not an integer"),
            ("k=float:x", "not a number"),
            ("k=bool:yes", "not true or false"),
            ("k=u32:1", "`u32` is not a type"),
        ] {
            let err = KvOverride::parse(item).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("--override-kv {item}: ")) && err.contains(says),
                "{item}: {err}"
            );
        }
        let long = format!("k=str:{}", "x".repeat(128));
        assert!(KvOverride::parse(&long).is_err());
        assert!(KvOverride::parse(&format!("{}=int:1", "k".repeat(128))).is_err());
    }

    #[test]
    fn fingerprints_tell_override_sets_apart() {
        let a = KvOverride::parse_list("a=int:1").unwrap();
        let b = KvOverride::parse_list("a=int:2").unwrap();
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_eq!(fingerprint(&a).len(), 16);
    }
}
