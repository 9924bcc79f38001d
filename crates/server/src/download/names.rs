//! What a repository's file names say: `<user>/<model>[:quant]` references, the quantization tag
//! of a GGUF's name, its split parts (`-00001-of-00003.gguf`), and which file of a repository
//! `-hf` loads when no `-hff` names one. Pure functions of strings, as llama-server reads them.

use super::error::DownloadError;

/// A `<user>/<model>[:quant]` reference split into the repository and the tag (empty: none).
pub fn split_repo_tag(reference: &str) -> Result<(String, String), DownloadError> {
    let (repo, tag) = match reference.split_once(':') {
        Some((repo, tag)) if !tag.contains(':') => (repo, tag),
        Some(_) => return Err(DownloadError::bad_reference(reference)),
        None => (reference, ""),
    };
    if !is_valid_repo_id(repo) {
        return Err(DownloadError::bad_reference(reference));
    }
    Ok((repo.to_owned(), tag.to_owned()))
}

/// `user/model`: letters, digits and `_`, with `/`, `.` and `-` only between them, exactly one
/// `/`, at most 256 characters (as the Hub names repositories).
pub fn is_valid_repo_id(repo: &str) -> bool {
    if repo.is_empty() || repo.len() > 256 {
        return false;
    }
    let mut slashes = 0;
    // Whether the previous character was a separator (true at the start: none may lead).
    let mut after_separator = true;
    for c in repo.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            after_separator = false;
        } else if matches!(c, '/' | '.' | '-') {
            if after_separator {
                return false;
            }
            slashes += usize::from(c == '/');
            after_separator = true;
        } else {
            return false;
        }
    }
    !after_separator && slashes == 1
}

/// A GGUF file name read as `<prefix>[-<index>-of-<count>].gguf`, the prefix ending in its
/// quantization tag (`…-Q4_K_M`, upper-cased here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufName {
    /// The name without `.gguf` and without the split suffix (the tag included).
    pub prefix: String,
    /// The text after the prefix's last `-` or `.` when it is letters, digits and `_`; empty
    /// otherwise.
    pub tag: String,
    /// 1-based part number (1 for a file that is not split).
    pub index: u32,
    /// How many parts (1 for a file that is not split).
    pub count: u32,
}

/// Reads `path` as a GGUF file name; `None` when it does not end in `.gguf`.
pub fn gguf_name(path: &str) -> Option<GgufName> {
    let mut prefix = path.strip_suffix(".gguf")?.to_owned();
    let (mut index, mut count) = (1, 1);
    if let Some((head, index_part, count_part)) = split_suffix(&prefix) {
        index = index_part;
        count = count_part;
        prefix = head;
    }
    let last = prefix.rfind(['-', '.']).map_or("", |at| &prefix[at + 1..]);
    let tag = if !last.is_empty() && last.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        last.to_ascii_uppercase()
    } else {
        String::new()
    };
    Some(GgufName {
        prefix,
        tag,
        index,
        count,
    })
}

/// `<head>-NNNNN-of-MMMMM` (five digits each, case-insensitive `of`) → (head, N, M).
fn split_suffix(name: &str) -> Option<(String, u32, u32)> {
    // "-00001-of-00003" is 15 bytes, all ASCII; the head must be non-empty.
    let bytes = name.as_bytes();
    if bytes.len() < 16 {
        return None;
    }
    let tail = &name[name.len() - 15..];
    let t = tail.as_bytes();
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    if t[0] != b'-' || !digits(&t[1..6]) || !tail[6..10].eq_ignore_ascii_case("-of-") {
        return None;
    }
    if !digits(&t[10..15]) {
        return None;
    }
    let index = tail[1..6].parse().ok()?;
    let count = tail[10..15].parse().ok()?;
    Some((name[..name.len() - 15].to_owned(), index, count))
}

/// A GGUF file that is a model, not a projector, importance matrix or draft head.
pub fn is_model_gguf(path: &str) -> bool {
    if !path.ends_with(".gguf") {
        return false;
    }
    let file = path.rsplit('/').next().unwrap_or(path);
    !["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"]
        .iter()
        .any(|word| file.contains(word))
}

/// Whether `path` contains `tag` (ASCII case-insensitive) followed by `.` or `-`.
fn names_tag(path: &str, tag: &str) -> bool {
    if tag.is_empty() {
        return false;
    }
    let path = path.to_ascii_lowercase();
    let tag = tag.to_ascii_lowercase();
    path.match_indices(&tag)
        .any(|(at, _)| matches!(path.as_bytes().get(at + tag.len()), Some(b'.' | b'-')))
}

/// The file `-hf <repo>[:tag]` loads out of `paths` (in the repository's order): the first model
/// GGUF naming `tag`, or without a tag the first naming Q4_K_M, else Q8_0, else the first model
/// GGUF; of a split file only its first part qualifies. `None` when nothing matches.
pub fn best_model<'a>(paths: &[&'a str], tag: &str) -> Option<&'a str> {
    let tags: &[&str] = if tag.is_empty() {
        &["Q4_K_M", "Q8_0"]
    } else {
        &[tag]
    };
    let first_part = |path: &&&str| gguf_name(path).is_some_and(|n| n.count <= 1 || n.index == 1);
    for t in tags {
        if let Some(found) = paths
            .iter()
            .filter(|p| is_model_gguf(p) && names_tag(p, t))
            .find(first_part)
        {
            return Some(found);
        }
    }
    if tag.is_empty() {
        return paths
            .iter()
            .filter(|p| is_model_gguf(p))
            .find(first_part)
            .copied();
    }
    None
}

/// Every part of the split file `primary` found in `paths` (just `primary` when it is not split).
pub fn split_parts<'a>(paths: &[&'a str], primary: &'a str) -> Vec<&'a str> {
    let Some(name) = gguf_name(primary).filter(|n| n.count > 1) else {
        return vec![primary];
    };
    paths
        .iter()
        .filter(|p| gguf_name(p).is_some_and(|n| n.count == name.count && n.prefix == name.prefix))
        .copied()
        .collect()
}

/// The file name a URL downloads to: its last path segment, without query or fragment.
pub fn url_file_name(url: &str) -> Option<&str> {
    let path = url.split('#').next()?.split('?').next()?;
    let name = path.rsplit('/').next()?;
    (!name.is_empty() && name != "." && name != "..").then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_repository_and_tag() {
        assert_eq!(
            split_repo_tag("ggml-org/gemma-3-1b-it-GGUF:q4_k_m").unwrap(),
            ("ggml-org/gemma-3-1b-it-GGUF".into(), "q4_k_m".into())
        );
        assert_eq!(
            split_repo_tag("a_b/c.d-e").unwrap(),
            ("a_b/c.d-e".into(), String::new())
        );
        for bad in [
            "model", "a/b/c", "a//b", "/a", "a/", "a/b:c:d", "a/b c", "-a/b", "a/.b",
        ] {
            assert!(split_repo_tag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn gguf_names_give_tag_and_parts() {
        let n = gguf_name("dir/Qwen3-30B-A3B-Q4_K_M-00002-of-00003.gguf").unwrap();
        assert_eq!(n.prefix, "dir/Qwen3-30B-A3B-Q4_K_M");
        assert_eq!(n.tag, "Q4_K_M");
        assert_eq!((n.index, n.count), (2, 3));
        let n = gguf_name("SmolLM2-135M-Instruct.q8_0.gguf").unwrap();
        assert_eq!(n.tag, "Q8_0");
        assert_eq!((n.index, n.count), (1, 1));
        assert_eq!(gguf_name("model.safetensors"), None);
        // The split suffix needs five digits each side.
        assert_eq!(gguf_name("m-Q4_0-1-of-3.gguf").unwrap().count, 1);
    }

    #[test]
    fn the_best_model_follows_the_tag_then_q4_k_m_then_q8_0_then_the_first() {
        let files = [
            "README.md",
            "m-mmproj-F16.gguf",
            "m-Q8_0.gguf",
            "m-Q4_K_M-00002-of-00002.gguf",
            "m-Q4_K_M-00001-of-00002.gguf",
            "m-Q4_0.gguf",
        ];
        assert_eq!(best_model(&files, ""), Some("m-Q4_K_M-00001-of-00002.gguf"));
        assert_eq!(best_model(&files, "q4_0"), Some("m-Q4_0.gguf"));
        assert_eq!(
            best_model(&files, "F16"),
            None,
            "a projector is not a model"
        );
        assert_eq!(best_model(&files, "Q5_K"), None);
        let plain = ["b-F16.gguf", "a-BF16.gguf"];
        assert_eq!(best_model(&plain, ""), Some("b-F16.gguf"));
        assert_eq!(
            split_parts(&files, "m-Q4_K_M-00001-of-00002.gguf"),
            [
                "m-Q4_K_M-00002-of-00002.gguf",
                "m-Q4_K_M-00001-of-00002.gguf"
            ]
        );
        assert_eq!(split_parts(&files, "m-Q8_0.gguf"), ["m-Q8_0.gguf"]);
    }

    #[test]
    fn url_names() {
        assert_eq!(
            url_file_name("https://h/x/model-Q4_0.gguf?download=true#x"),
            Some("model-Q4_0.gguf")
        );
        assert_eq!(url_file_name("https://h/x/"), None);
    }
}
