//! `edit_file`'s replacements, as llama-server applies them: every `old_text` is matched against
//! the original content (exactly, or, when one has no exact match, after both sides are
//! normalized line by line: trailing blanks dropped, typographic quotes, dashes and spaces made
//! ASCII); each must be unique (counted on the normalized text) and the edits must not overlap.
//! After a normalized match the lines no edit touches are kept byte for byte.

/// One replacement.
#[derive(Debug, Clone)]
pub struct Edit {
    pub old_text: String,
    pub new_text: String,
}

/// One line made comparable: trailing spaces, tabs and `\r` dropped, look-alike characters made
/// ASCII.
fn normalize_line(line: &str) -> String {
    let line = line.trim_end_matches([' ', '\t', '\r']);
    line.chars()
        .map(|c| match c {
            '\u{2018}'..='\u{201B}' => '\'',
            '\u{201C}'..='\u{201F}' => '"',
            '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
            '\u{00A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
            c => c,
        })
        .collect()
}

/// Every line of `text` normalized; the line breaks (and so the line count) are kept.
pub fn normalize(text: &str) -> String {
    text.split('\n')
        .map(normalize_line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Non-overlapping occurrences of `needle` in `hay`.
fn count(hay: &str, needle: &str) -> usize {
    if needle.is_empty() {
        0
    } else {
        hay.matches(needle).count()
    }
}

#[derive(Debug, Clone)]
struct Matched {
    index: usize,
    at: usize,
    len: usize,
    new_text: String,
}

/// The lines of `text`, each with its `\n`.
fn lines_with_endings(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// Replaces the (sorted, disjoint) matches within `text`, whose first byte is at `offset`.
fn replace(text: &str, reps: &[Matched], offset: usize) -> String {
    let mut out = text.to_owned();
    for m in reps.iter().rev() {
        let at = m.at - offset;
        out.replace_range(at..at + m.len, &m.new_text);
    }
    out
}

/// The replacements of a normalized match on `base`, with the untouched lines of `original`.
fn replace_keeping_lines(original: &str, base: &str, reps: &[Matched]) -> String {
    let original_lines = lines_with_endings(original);
    let mut spans = Vec::new();
    let mut offset = 0;
    for line in lines_with_endings(base) {
        spans.push((offset, offset + line.len()));
        offset += line.len();
    }
    // Groups of replacements over the same lines: (first line, end line, replacements).
    let mut groups: Vec<(usize, usize, Vec<Matched>)> = Vec::new();
    for m in reps {
        let (start, end) = (m.at, m.at + m.len);
        let Some(first) = spans.iter().position(|&(s, e)| start >= s && start < e) else {
            continue;
        };
        let mut last = first;
        while last < spans.len() && spans[last].1 < end {
            last += 1;
        }
        if last >= spans.len() {
            continue;
        }
        match groups.last_mut() {
            Some(g) if first < g.1 => {
                g.1 = g.1.max(last + 1);
                g.2.push(m.clone());
            }
            _ => groups.push((first, last + 1, vec![m.clone()])),
        }
    }
    let mut out = String::new();
    let mut next = 0;
    for (first, end, reps) in groups {
        for line in &original_lines[next..first] {
            out.push_str(line);
        }
        let (from, to) = (spans[first].0, spans[end - 1].1);
        out.push_str(&replace(&base[from..to], &reps, from));
        next = end;
    }
    for line in &original_lines[next.min(original_lines.len())..] {
        out.push_str(line);
    }
    out
}

/// The content after `edits`, or the error message llama-server gives.
pub fn apply(original: &str, edits: &[Edit], path: &str) -> Result<String, String> {
    let normalized = normalize(original);
    let mut fuzzy = false;
    for (i, e) in edits.iter().enumerate() {
        if original.contains(&e.old_text) {
            continue;
        }
        if !normalized.contains(&normalize(&e.old_text)) {
            return Err(format!(
                "could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
            ));
        }
        fuzzy = true;
    }
    let base = if fuzzy {
        normalized.clone()
    } else {
        original.to_owned()
    };
    let mut matched = Vec::new();
    for (i, e) in edits.iter().enumerate() {
        let needle = if fuzzy {
            normalize(&e.old_text)
        } else {
            e.old_text.clone()
        };
        let n = count(&normalized, &normalize(&e.old_text));
        if n > 1 {
            return Err(format!(
                "found {n} occurrences of edits[{i}].old_text in {path}, it must be unique"
            ));
        }
        let at = base.find(&needle).unwrap_or(0);
        matched.push(Matched {
            index: i,
            at,
            len: needle.len(),
            new_text: e.new_text.clone(),
        });
    }
    matched.sort_by_key(|m| m.at);
    for pair in matched.windows(2) {
        if pair[0].at + pair[0].len > pair[1].at {
            return Err(format!(
                "edits[{}] and edits[{}] overlap in {path}; merge them into one edit or target disjoint regions",
                pair[0].index, pair[1].index
            ));
        }
    }
    let content = if fuzzy {
        replace_keeping_lines(original, &base, &matched)
    } else {
        replace(&base, &matched, 0)
    };
    if content == original {
        return Err("no changes made: the replacement(s) produced identical content".into());
    }
    Ok(content)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(old: &str, new: &str) -> Edit {
        Edit {
            old_text: old.into(),
            new_text: new.into(),
        }
    }

    #[test]
    fn exact_edits_apply_against_the_original() {
        let out = apply(
            "line1\nline2\nline3\n",
            &[
                edit("line2", "line2-edited"),
                edit("line3\n", "line3\nline4\n"),
            ],
            "f",
        );
        assert_eq!(out.unwrap(), "line1\nline2-edited\nline3\nline4\n");
    }

    #[test]
    fn duplicates_overlaps_misses_and_no_ops_are_refused() {
        let err = apply("dup\ndup\n", &[edit("dup", "x")], "f").unwrap_err();
        assert_eq!(
            err,
            "found 2 occurrences of edits[0].old_text in f, it must be unique"
        );
        let err = apply(
            "line1\nline2\n",
            &[edit("line1\nline2", "a"), edit("line2", "b")],
            "f",
        )
        .unwrap_err();
        assert!(err.contains("overlap"), "{err}");
        let err = apply("abc", &[edit("zzz", "y")], "f").unwrap_err();
        assert!(
            err.starts_with("could not find edits[0].old_text in f"),
            "{err}"
        );
        let err = apply("abc", &[edit("b", "b")], "f").unwrap_err();
        assert!(err.starts_with("no changes made"), "{err}");
    }

    #[test]
    fn a_normalized_match_keeps_the_untouched_lines_as_they_were() {
        let original = "keep \u{201C}this\u{201D}  \nsay \u{201C}hi\u{201D}   \nend\t\n";
        let out = apply(original, &[edit("say \"hi\"", "say \"bye\"")], "f").unwrap();
        assert_eq!(out, "keep \u{201C}this\u{201D}  \nsay \"bye\"\nend\t\n");
    }
}
