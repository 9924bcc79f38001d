//! llama-server's preset files: INI text, read line by line so that every error names its line.
//!
//! A line is blank, a comment (`;` or `#` first), a section header `[name]`, or `key = value`
//! (a key starts with a letter or `_` and holds letters, digits, `_`, `.` and `-`; a value ends
//! at a `;` or `#` comment). Keys before the first header belong to the section `default`.

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: String,
    /// 1-based.
    pub line: usize,
}

/// One `[name]` section, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    /// The header's line (0 for the implicit `default` section).
    pub line: usize,
    pub entries: Vec<Entry>,
}

/// The implicit section of keys that come before any header.
pub const DEFAULT_SECTION: &str = "default";

/// Parses `text`; an error is `line N: what is wrong`.
pub fn parse(text: &str) -> Result<Vec<Section>, String> {
    let mut sections = vec![Section {
        name: DEFAULT_SECTION.to_owned(),
        line: 0,
        entries: Vec::new(),
    }];
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('[') {
            let Some(close) = rest.find(']') else {
                return Err(format!(
                    "line {line}: `{trimmed}`: a section header ends with `]`"
                ));
            };
            let name = rest[..close].trim();
            let after = strip_comment(&rest[close + 1..]);
            if name.is_empty() {
                return Err(format!("line {line}: `{trimmed}`: the section has no name"));
            }
            if !after.is_empty() {
                return Err(format!(
                    "line {line}: `{trimmed}`: nothing may follow a section header but a comment"
                ));
            }
            if sections.iter().any(|s| s.name == name) {
                return Err(format!("line {line}: section `[{name}]` appears twice"));
            }
            sections.push(Section {
                name: name.to_owned(),
                line,
                entries: Vec::new(),
            });
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(format!(
                "line {line}: `{trimmed}`: expected `[section]`, `key = value` or a comment"
            ));
        };
        let key = key.trim();
        if !valid_key(key) {
            return Err(format!(
                "line {line}: `{key}` is not a key (a letter or `_`, then letters, digits, `_`, \
                 `.` or `-`)"
            ));
        }
        let value = strip_comment(value).to_owned();
        let Some(section) = sections.last_mut() else {
            continue;
        };
        if section.entries.iter().any(|e| e.key == key) {
            return Err(format!(
                "line {line}: `{key}` is set twice in section `[{}]`",
                section.name
            ));
        }
        section.entries.push(Entry {
            key: key.to_owned(),
            value,
            line,
        });
    }
    Ok(sections)
}

/// `text` without a trailing `;` or `#` comment, trimmed.
fn strip_comment(text: &str) -> &str {
    let end = text.find([';', '#']).unwrap_or(text.len());
    text[..end].trim()
}

fn valid_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_keys_and_comments() {
        let text =
            "; top\nversion = 1\n[*]\nctx-size = 512 # every model\n\n[a:Q4]\nmodel = /m/a.gguf\n";
        let sections = parse(text).unwrap();
        assert_eq!(sections.len(), 3);
        assert_eq!(sections[0].entries[0].key, "version");
        assert_eq!(sections[1].name, "*");
        assert_eq!(sections[1].entries[0].value, "512");
        assert_eq!(sections[2].name, "a:Q4");
        assert_eq!(sections[2].entries[0].line, 7);
    }

    #[test]
    fn errors_name_the_line() {
        assert!(parse("[a]\nmodel /x\n").unwrap_err().starts_with("line 2:"));
        assert!(parse("[a\n").unwrap_err().starts_with("line 1:"));
        assert!(parse("[a]\n[a]\n").unwrap_err().starts_with("line 2:"));
        assert!(parse("[a]\n1x = 2\n").unwrap_err().starts_with("line 2:"));
        assert!(
            parse("[a]\nk = 1\nk = 2\n")
                .unwrap_err()
                .starts_with("line 3:")
        );
    }
}
