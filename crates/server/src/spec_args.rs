//! llama.cpp's ngram-simple sizes (`--spec-ngram-simple-size-n`, `--spec-ngram-simple-size-m`)
//! on the engine's prompt-lookup proposer.

use mlxcel_engine::{Proposer, SpeculativeConfig};

use crate::error::ServerError;

/// Sets the n-gram looked up (`size_n`: only that length) and the tokens proposed after it
/// (`size_m`) on `speculative`, 1 to 1024 each as llama.cpp takes them; refused without
/// `--spec-type ngram-simple`.
pub(crate) fn ngram_simple_sizes(
    size_n: Option<usize>,
    size_m: Option<usize>,
    speculative: Option<&mut SpeculativeConfig>,
) -> Result<(), ServerError> {
    let sizes = [
        ("--spec-ngram-simple-size-n", size_n),
        ("--spec-ngram-simple-size-m", size_m),
    ];
    for (flag, size) in sizes {
        if let Some(size) = size.filter(|s| !(1..=1024).contains(s)) {
            return Err(ServerError::Flag(format!(
                "{flag} {size}: expected 1 to 1024"
            )));
        }
    }
    let Some(config) = speculative.filter(|c| c.proposer == Proposer::Ngram) else {
        if let Some((flag, _)) = sizes.iter().find(|(_, size)| size.is_some()) {
            return Err(ServerError::Flag(format!(
                "{flag} sets the prompt-lookup proposer: it needs --spec-type ngram-simple"
            )));
        }
        return Ok(());
    };
    if let Some(n) = size_n {
        config.ngram_max = n;
        config.ngram_min = n;
    }
    if let Some(m) = size_m {
        config.draft_max = m;
        config.draft_min = config.draft_min.min(m);
    }
    Ok(())
}
