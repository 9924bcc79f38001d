//! llama-server's `n_indent` (for code completion): once the output has a newline, every new
//! line must begin with at least `n` spaces or tabs; the first line that does not ends the
//! output (a length stop), cut where its indentation ends, so the newline and the whitespace
//! before the offending character stay and the rest is dropped. As in llama-server, a line is
//! judged by its first character that is not a space or a tab, a newline included (an empty
//! line is a line indented 0), and the text before the output's first newline is not judged.
//!
//! llama-server judges a line a token or two after it appears and then cuts the final text (the
//! tokens it streamed meanwhile stay sent); here a line is judged in the token that completes
//! its indentation and nothing past the cut is emitted, so the text streamed is the text
//! llama-server answers without streaming.

/// One sequence's indentation rule in progress.
#[derive(Debug, Clone)]
pub(super) struct IndentStop {
    min: usize,
    state: Line,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Line {
    /// Before the output's first newline: not judged.
    First,
    /// In a new line's leading whitespace, this many characters of it so far.
    Indent(usize),
    /// Past a judged line's indentation.
    Body,
}

impl IndentStop {
    /// The rule for `min` characters of indentation; `None` for 0 (no rule).
    pub(super) fn new(min: usize) -> Option<Self> {
        (min > 0).then_some(Self {
            min,
            state: Line::First,
        })
    }

    /// Reads the next `piece` of output text: the byte offset in it where the output ends (the
    /// first character of a line indented less than the minimum), or `None` to keep it whole.
    pub(super) fn cut(&mut self, piece: &str) -> Option<usize> {
        for (at, c) in piece.char_indices() {
            self.state = match (self.state, c) {
                (Line::Indent(n), ' ' | '\t') => Line::Indent(n + 1),
                (Line::Indent(n), _) if n < self.min => return Some(at),
                (_, '\n') => Line::Indent(0),
                (Line::First, _) => Line::First,
                _ => Line::Body,
            };
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The output `pieces` give under a minimum of `min`: the text kept, and whether it ended.
    fn run(min: usize, pieces: &[&str]) -> (String, bool) {
        let mut rule = IndentStop::new(min).unwrap();
        let mut kept = String::new();
        for piece in pieces {
            if let Some(at) = rule.cut(piece) {
                kept.push_str(&piece[..at]);
                return (kept, true);
            }
            kept.push_str(piece);
        }
        (kept, false)
    }

    #[test]
    fn a_line_indented_less_than_the_minimum_ends_the_output_at_its_first_character() {
        // The first line (the rest of the cursor's line) is not judged.
        assert_eq!(
            run(4, &["x = 1", "\n    y", " = 2\n", "  z", " = 3\n"]),
            ("x = 1\n    y = 2\n  ".into(), true)
        );
        // Whitespace split across pieces counts together; tabs count as one each.
        assert_eq!(
            run(2, &["a\n", " ", " b\n\t", "\tc\nd"]),
            ("a\n  b\n\t\tc\n".into(), true)
        );
        // An empty line is a line indented 0.
        assert_eq!(run(1, &["a\n b\n", "\n c"]), ("a\n b\n".into(), true));
        // Indented enough throughout: nothing is cut.
        assert_eq!(
            run(2, &["if x:\n  a\n", "  b"]),
            ("if x:\n  a\n  b".into(), false)
        );
        // Whitespace alone (no character after it yet) is not judged.
        assert_eq!(run(4, &["a\n", "  "]), ("a\n  ".into(), false));
        assert!(IndentStop::new(0).is_none());
    }
}
