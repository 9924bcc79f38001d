//! llama.cpp's ngram-simple sizes (`--spec-ngram-simple-size-n`, `--spec-ngram-simple-size-m`)
//! on the engine's prompt-lookup proposer, and the flags of its hashed n-gram proposers
//! (`--spec-default`, `--spec-ngram-mod-*`, `--spec-ngram-map-k-*`, `--spec-ngram-map-k4v-*`).

use mlxcel_engine::SpeculativeConfig;

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
    let Some(config) = speculative.filter(|c| c.proposer.looks_up()) else {
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

/// llama.cpp's hashed n-gram proposers' flags (`--spec-default`, `--spec-ngram-mod-*`,
/// `--spec-ngram-map-k-*`, `--spec-ngram-map-k4v-*`), shared by `serve` and the CLI.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct HashedSpecArgs {
    /// llama.cpp's default speculation: adds `ngram-mod` to `--spec-type` at n-match 24, n-min
    /// 48, n-max 64 (its defaults; the `--spec-ngram-mod-*` flags still set them, wherever
    /// they stand).
    #[arg(long = "spec-default")]
    pub spec_default: bool,

    /// `ngram-mod`: the n-gram hashed (1 to 1024; default 24).
    #[arg(long = "spec-ngram-mod-n-match")]
    pub spec_ngram_mod_n_match: Option<u32>,

    /// `ngram-mod`: drafts shorter than this are dropped (0 to 1024; default 48).
    #[arg(long = "spec-ngram-mod-n-min")]
    pub spec_ngram_mod_n_min: Option<u32>,

    /// `ngram-mod`: the longest draft (0 to 1024; default 64).
    #[arg(long = "spec-ngram-mod-n-max")]
    pub spec_ngram_mod_n_max: Option<u32>,

    /// `ngram-map-k`: the key n-gram's length (1 to 1024; default 12).
    #[arg(long = "spec-ngram-map-k-size-n")]
    pub spec_ngram_map_k_size_n: Option<u32>,

    /// `ngram-map-k`: the most tokens proposed after a key (1 to 1024; default 48).
    #[arg(long = "spec-ngram-map-k-size-m")]
    pub spec_ngram_map_k_size_m: Option<u32>,

    /// `ngram-map-k`: accepted as llama.cpp accepts it (at least 1; default 1), but, as in
    /// llama.cpp, the key-only map proposes from a key's first repeat whatever its value.
    #[arg(long = "spec-ngram-map-k-min-hits")]
    pub spec_ngram_map_k_min_hits: Option<u32>,

    /// `ngram-map-k4v`: the key n-gram's length (1 to 1024; default 12).
    #[arg(long = "spec-ngram-map-k4v-size-n")]
    pub spec_ngram_map_k4v_size_n: Option<u32>,

    /// `ngram-map-k4v`: the most tokens proposed after a key (1 to 1024; default 48).
    #[arg(long = "spec-ngram-map-k4v-size-m")]
    pub spec_ngram_map_k4v_size_m: Option<u32>,

    /// `ngram-map-k4v`: the key's occurrences before it proposes (at least 1; default 1).
    #[arg(long = "spec-ngram-map-k4v-min-hits")]
    pub spec_ngram_map_k4v_min_hits: Option<u32>,
}

impl HashedSpecArgs {
    /// Sets the sizes given on `speculative`'s hashed proposers; a flag of a type that is not
    /// on is refused by name, and so is a value out of llama.cpp's range.
    pub fn apply(&self, speculative: Option<&mut SpeculativeConfig>) -> Result<(), String> {
        let narrow = |flag: &str, value: Option<u32>, least: u32, most: u32| match value {
            Some(v) if !(least..=most).contains(&v) => {
                Err(format!("{flag} {v}: expected {least} to {most}"))
            }
            // In range, so it fits.
            value => Ok(value.map(|v| v as u16)),
        };
        let n_match = narrow(
            "--spec-ngram-mod-n-match",
            self.spec_ngram_mod_n_match,
            1,
            1024,
        )?;
        let n_min = narrow("--spec-ngram-mod-n-min", self.spec_ngram_mod_n_min, 0, 1024)?;
        let n_max = narrow("--spec-ngram-mod-n-max", self.spec_ngram_mod_n_max, 0, 1024)?;
        let mut maps = Vec::new();
        for (prefix, size_n, size_m, min_hits) in [
            (
                "--spec-ngram-map-k",
                self.spec_ngram_map_k_size_n,
                self.spec_ngram_map_k_size_m,
                self.spec_ngram_map_k_min_hits,
            ),
            (
                "--spec-ngram-map-k4v",
                self.spec_ngram_map_k4v_size_n,
                self.spec_ngram_map_k4v_size_m,
                self.spec_ngram_map_k4v_min_hits,
            ),
        ] {
            maps.push((
                prefix,
                narrow(&format!("{prefix}-size-n"), size_n, 1, 1024)?,
                narrow(&format!("{prefix}-size-m"), size_m, 1, 1024)?,
                narrow(&format!("{prefix}-min-hits"), min_hits, 1, 65535)?,
            ));
        }
        let mut config = speculative;
        let mod_given = [n_match, n_min, n_max].iter().any(Option::is_some);
        match config.as_deref_mut().and_then(|c| c.ngram_mod.as_mut()) {
            Some(settings) => {
                settings.n_match = n_match.unwrap_or(settings.n_match);
                settings.n_min = n_min.unwrap_or(settings.n_min);
                settings.n_max = n_max.unwrap_or(settings.n_max);
            }
            None if mod_given => {
                return Err(
                    "--spec-ngram-mod-n-match/-n-min/-n-max set the ngram-mod proposer: \
                            they need ngram-mod in --spec-type (or --spec-default)"
                        .into(),
                );
            }
            None => {}
        }
        for (i, (prefix, size_n, size_m, min_hits)) in maps.into_iter().enumerate() {
            let map = config.as_deref_mut().and_then(|c| {
                if i == 0 {
                    c.ngram_map_k.as_mut()
                } else {
                    c.ngram_map_k4v.as_mut()
                }
            });
            match map {
                Some(settings) => {
                    settings.size_n = size_n.unwrap_or(settings.size_n);
                    settings.size_m = size_m.unwrap_or(settings.size_m);
                    settings.min_hits = min_hits.unwrap_or(settings.min_hits);
                }
                None if size_n.or(size_m).or(min_hits).is_some() => {
                    let kind = &prefix["--spec-".len()..];
                    return Err(format!(
                        "{prefix}-size-n/-size-m/-min-hits set the {kind} proposer: they need \
                         {kind} in --spec-type"
                    ));
                }
                None => {}
            }
        }
        Ok(())
    }
}
