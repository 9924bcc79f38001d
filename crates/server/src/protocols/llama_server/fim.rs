//! llama-server's `/infill` prompt: the text before and after the cursor (and, optionally, other
//! files of the project) arranged around the model's fill-in-the-middle tokens, with
//! llama-server's truncation rules. Pure: the route (`completion.rs`) tokenizes and hands the
//! tokens here.
//!
//! The layout, prefix-suffix-middle (PSM, the default) or suffix-prefix-middle (`--spm-infill`):
//!
//! ```text
//! [extra context] [BOS] <PRE> prefix prompt <SUF> suffix <MID>      (PSM)
//! [extra context] [BOS] <SUF> suffix <PRE> prefix prompt <MID>      (SPM)
//! ```
//!
//! where the extra context is, with a repository token, `<REP>myproject\n`, then per chunk
//! `<SEP>{filename}\n{text}` (or, without a file separator token, `\n\n--- snippet ---\n\n{text}`),
//! then `<SEP>filename\n` when there is a separator token. Truncation keeps the last
//! `3 * (n_batch / 4)` prefix tokens, the first `n_batch / 4 - 2 - prompt` suffix tokens, and the
//! last `n_ctx - n_batch - 2 * n_predict` tokens of the extra context.

/// The tokens that frame an infill prompt.
#[derive(Debug, Clone)]
pub(crate) struct FimFrame {
    pub pre: u32,
    pub suf: u32,
    pub mid: u32,
    /// The repository token (`<|repo_name|>`, `<reponame>` ...), if the vocabulary has one.
    pub rep: Option<u32>,
    /// The file separator (`<|file_sep|>`), if the vocabulary has one.
    pub sep: Option<u32>,
    /// What the tokenizer puts before a text (a BOS), placed after the extra context.
    pub bos: Vec<u32>,
    /// Suffix first (`--spm-infill`).
    pub spm: bool,
}

/// The sizes llama-server truncates by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InfillLimits {
    /// llama-server's logical batch (`-b`, 2048 by default): a quarter of it holds the suffix and
    /// the prompt, three quarters the prefix.
    pub n_batch: usize,
    /// The server's `--n-predict` (`-1`: unlimited), which llama-server uses here rather than the
    /// request's budget.
    pub n_predict: i64,
    /// The context of one request.
    pub n_ctx: usize,
}

/// llama-server's default logical batch size, which sizes the prefix and suffix (`-b` has no
/// effect on this engine, so it is always this).
pub(crate) const N_BATCH: usize = 2048;

/// The separator of extra chunks when the vocabulary has no file separator token.
pub(crate) const SNIPPET_SEPARATOR: &str = "\n\n--- snippet ---\n\n";

/// One extra chunk, tokenized: its file name line (`"{filename}\n"`) and its text.
#[derive(Debug, Clone)]
pub(crate) struct ExtraTokens {
    pub filename_line: Vec<u32>,
    pub text: Vec<u32>,
}

/// The extra context: `<REP>myproject\n`, then each chunk after `<SEP>{filename}\n` (or after the
/// snippet separator's tokens, `separator`), then `<SEP>filename\n`. `project` and `current` are
/// the tokens of `"myproject\n"` and `"filename\n"`, the names llama-server writes.
pub(crate) fn extra_context(
    frame: &FimFrame,
    project: &[u32],
    chunks: &[ExtraTokens],
    separator: &[u32],
    current: &[u32],
) -> Vec<u32> {
    let mut out = Vec::new();
    if let Some(rep) = frame.rep {
        out.push(rep);
        out.extend_from_slice(project);
    }
    for chunk in chunks {
        match frame.sep {
            Some(sep) => {
                out.push(sep);
                out.extend_from_slice(&chunk.filename_line);
            }
            None => out.extend_from_slice(separator),
        }
        out.extend_from_slice(&chunk.text);
    }
    if let Some(sep) = frame.sep {
        out.push(sep);
        out.extend_from_slice(current);
    }
    out
}

/// The whole prompt, as llama-server assembles it.
pub(crate) fn assemble(
    frame: &FimFrame,
    limits: InfillLimits,
    prefix: &[u32],
    suffix: &[u32],
    prompt: &[u32],
    extra: &[u32],
) -> Vec<u32> {
    let quarter = limits.n_batch / 4;
    let prefix_take = prefix.len().min(3 * quarter);
    let suffix_take = suffix.len().min(quarter.saturating_sub(2 + prompt.len()));
    let extra_room = limits.n_ctx as i64 - limits.n_batch as i64 - 2 * limits.n_predict;
    let extra_take = extra.len().min(extra_room.max(0) as usize);

    let mut with_prefix = vec![frame.pre];
    with_prefix.extend_from_slice(&prefix[prefix.len() - prefix_take..]);
    with_prefix.extend_from_slice(prompt);
    let mut with_suffix = vec![frame.suf];
    with_suffix.extend_from_slice(&suffix[..suffix_take]);
    let (first, second) = if frame.spm {
        (with_suffix, with_prefix)
    } else {
        (with_prefix, with_suffix)
    };
    let mut out = extra[extra.len() - extra_take..].to_vec();
    out.extend_from_slice(&frame.bos);
    out.extend(first);
    out.extend(second);
    out.push(frame.mid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRE: u32 = 1001;
    const SUF: u32 = 1002;
    const MID: u32 = 1003;
    const REP: u32 = 1004;
    const SEP: u32 = 1005;

    fn frame() -> FimFrame {
        FimFrame {
            pre: PRE,
            suf: SUF,
            mid: MID,
            rep: None,
            sep: None,
            bos: Vec::new(),
            spm: false,
        }
    }

    const ROOMY: InfillLimits = InfillLimits {
        n_batch: 2048,
        n_predict: -1,
        n_ctx: 8192,
    };

    #[test]
    fn prefix_suffix_middle_with_the_prompt_after_the_prefix() {
        let out = assemble(&frame(), ROOMY, &[1, 2], &[3, 4], &[5], &[]);
        assert_eq!(out, [PRE, 1, 2, 5, SUF, 3, 4, MID]);
        let spm = FimFrame {
            spm: true,
            bos: vec![7],
            ..frame()
        };
        let out = assemble(&spm, ROOMY, &[1, 2], &[3, 4], &[5], &[9, 9]);
        assert_eq!(out, [9, 9, 7, SUF, 3, 4, PRE, 1, 2, 5, MID]);
    }

    /// Worked by hand from llama-server's rules with n_batch 16: the prefix keeps its last
    /// 3 * 4 = 12 tokens, the suffix its first 4 - (2 + 1) = 1, and with n_ctx 24 and
    /// n_predict 2 the extra context its last 24 - 16 - 4 = 4.
    #[test]
    fn truncation_keeps_the_end_of_the_prefix_and_the_start_of_the_suffix() {
        let limits = InfillLimits {
            n_batch: 16,
            n_predict: 2,
            n_ctx: 24,
        };
        let prefix: Vec<u32> = (0..20).collect();
        let suffix: Vec<u32> = (100..110).collect();
        let extra: Vec<u32> = (200..210).collect();
        let out = assemble(&frame(), limits, &prefix, &suffix, &[50], &extra);
        let mut expected = vec![206, 207, 208, 209, PRE];
        expected.extend(8..20);
        expected.extend([50, SUF, 100, MID]);
        assert_eq!(out, expected);
        // A prompt that fills the suffix's quarter leaves no suffix; no room leaves no extra.
        let tight = InfillLimits {
            n_ctx: 16,
            ..limits
        };
        let out = assemble(&frame(), tight, &[1], &[2, 3], &[4, 5], &extra);
        assert_eq!(out, [PRE, 1, 4, 5, SUF, MID]);
    }

    #[test]
    fn extra_context_with_and_without_repository_tokens() {
        let chunks = [
            ExtraTokens {
                filename_line: vec![10],
                text: vec![11, 12],
            },
            ExtraTokens {
                filename_line: vec![20],
                text: vec![21],
            },
        ];
        let repo = FimFrame {
            rep: Some(REP),
            sep: Some(SEP),
            ..frame()
        };
        assert_eq!(
            extra_context(&repo, &[30], &chunks, &[40], &[50]),
            [REP, 30, SEP, 10, 11, 12, SEP, 20, 21, SEP, 50]
        );
        assert_eq!(
            extra_context(&frame(), &[30], &chunks, &[40], &[50]),
            [40, 11, 12, 40, 21]
        );
        // No chunks: the repository and the current file's lines are still written.
        assert_eq!(
            extra_context(&repo, &[30], &[], &[40], &[50]),
            [REP, 30, SEP, 50]
        );
    }
}
