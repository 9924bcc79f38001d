//! The glob of the file tools' `include`/`exclude` (llama.cpp's `glob_match` semantics): `*`
//! matches within one path segment, `**` across segments, `?` one character other than `/`,
//! `[...]` a class (`!` or `^` negates, `a-z` ranges, a leading `]` or `-` is literal). A pattern
//! without `/` matches the basename at any depth; one with `/` the whole relative path, anchored
//! with `**/` unless it already starts with `**` or `/`.

/// Whether `pattern` matches all of `text` (bytes; classes compare bytes).
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let Some((&first, rest)) = pattern.split_first() else {
        return text.is_empty();
    };
    if first == b'*' && rest.first() == Some(&b'*') {
        let after = &rest[1..];
        return (0..=text.len()).any(|i| glob_match(after, &text[i..]));
    }
    if first == b'*' {
        let mut i = 0;
        loop {
            if glob_match(rest, &text[i..]) {
                return true;
            }
            if i == text.len() || text[i] == b'/' {
                return false;
            }
            i += 1;
        }
    }
    if first == b'?' {
        return matches!(text.first(), Some(&c) if c != b'/') && glob_match(rest, &text[1..]);
    }
    if first == b'[' {
        let mut end = 0;
        if matches!(rest.first(), Some(b']' | b'-')) {
            end = 1;
        }
        while end < rest.len() && rest[end] != b']' {
            end += 1;
        }
        if end < rest.len() {
            let Some(&c) = text.first() else {
                return false;
            };
            return class_match(c, &rest[..end]) && glob_match(&rest[end + 1..], &text[1..]);
        }
        return text.first() == Some(&b'[') && glob_match(rest, &text[1..]);
    }
    text.first() == Some(&first) && glob_match(rest, &text[1..])
}

/// Whether `c` is in the class body `class` (between `[` and `]`).
fn class_match(c: u8, mut class: &[u8]) -> bool {
    let negated = matches!(class.first(), Some(b'!' | b'^'));
    if negated {
        class = &class[1..];
    }
    if let Some(&lead) = class.first()
        && (lead == b']' || lead == b'-')
    {
        if lead == c {
            return !negated;
        }
        class = &class[1..];
    }
    let mut matched = false;
    let mut i = 0;
    while i < class.len() {
        if i + 2 < class.len() && class[i + 1] == b'-' && class[i + 2] != b']' {
            if (class[i]..=class[i + 2]).contains(&c) {
                matched = true;
                break;
            }
            i += 3;
        } else {
            if class[i] == c {
                matched = true;
                break;
            }
            i += 1;
        }
    }
    matched != negated
}

/// `pattern` against a `/`-separated relative path, as the file tools match it.
pub fn path_glob_match(pattern: &str, rel: &str) -> bool {
    if !pattern.contains('/') {
        let base = rel.rsplit('/').next().unwrap_or(rel);
        return glob_match(pattern.as_bytes(), base.as_bytes());
    }
    if pattern == "**" || pattern.starts_with("**/") || pattern.starts_with('/') {
        return glob_match(pattern.as_bytes(), rel.as_bytes());
    }
    glob_match(format!("**/{pattern}").as_bytes(), rel.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_classes_and_anchoring() {
        assert!(path_glob_match("*.rs", "src/a/b.rs"));
        assert!(!path_glob_match("*.rs", "src/a/b.rsx"));
        assert!(path_glob_match("**", "a/b/c"));
        assert!(path_glob_match("a/*.rs", "x/a/b.rs"));
        assert!(!path_glob_match("a/*.rs", "a/c/b.rs"));
        assert!(path_glob_match("a/**/*.rs", "x/a/c/d/b.rs"));
        // As llama.cpp's: the `**/` put in front needs a `/` before the pattern.
        assert!(!path_glob_match("a/**/*.rs", "a/c/d/b.rs"));
        assert!(path_glob_match("*proj*", "project-alpha"));
        assert!(path_glob_match("file[0-9].txt", "d/file7.txt"));
        assert!(!path_glob_match("file[!0-9].txt", "file7.txt"));
        assert!(path_glob_match("file[!0-9].txt", "filex.txt"));
        assert!(path_glob_match("[]x]", "]"));
        assert!(path_glob_match("?.c", "a.c"));
        assert!(!glob_match(b"a?b", b"a/b"));
        assert!(glob_match(b"a[b", b"a[b"));
        // a leading '/' anchors at a root the relative paths never have
        assert!(!path_glob_match("/a.rs", "a.rs"));
    }
}
