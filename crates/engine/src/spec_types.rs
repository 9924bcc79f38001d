//! llama.cpp's `--spec-type` list (and `--spec-default`) read into a [`SpeculativeConfig`].
//!
//! llama.cpp takes a comma-separated list of types and tries the ones listed in a fixed order
//! (whatever order the list gives): `ngram-simple`, `ngram-map-k`, `ngram-map-k4v`, `ngram-mod`,
//! then `draft-simple`; the first that proposes a draft for a sequence at a step is the one
//! verified, and the acceptance feedback goes to it.

use crate::error::EngineError;
use crate::ngram_map::NgramMapConfig;
use crate::ngram_mod::NgramModConfig;
use crate::speculative::{Proposer, SpeculativeConfig};

/// The types mlxcel runs.
const TYPES: &str = "none, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod or draft-simple";
/// llama.cpp's other types, refused by name.
const NOT_HERE: [&str; 5] = [
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-cache",
];

/// The types a `--spec-type` value (and `--spec-default`) turn on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Types {
    ngram_simple: bool,
    ngram_map_k: bool,
    ngram_map_k4v: bool,
    ngram_mod: bool,
    draft_simple: bool,
    /// The value said `none` (which, as in llama.cpp, makes the whole value none).
    none: bool,
}

impl Types {
    fn parse(value: Option<&str>, spec_default: bool) -> Result<Self, EngineError> {
        let mut types = Self::default();
        for name in value.into_iter().flat_map(|v| v.split(',')) {
            let on = match name {
                "none" => &mut types.none,
                "ngram-simple" => &mut types.ngram_simple,
                "ngram-map-k" => &mut types.ngram_map_k,
                "ngram-map-k4v" => &mut types.ngram_map_k4v,
                "ngram-mod" => &mut types.ngram_mod,
                "draft-simple" => &mut types.draft_simple,
                other if NOT_HERE.contains(&other) => {
                    return Err(EngineError::InvalidSpeculation(format!(
                        "--spec-type {other}: llama.cpp's {other} is not implemented here; \
                         expected {TYPES} (a comma-separated list)"
                    )));
                }
                other => {
                    return Err(EngineError::InvalidSpeculation(format!(
                        "--spec-type {other}: expected {TYPES} (a comma-separated list)"
                    )));
                }
            };
            *on = true;
        }
        if types.none {
            types = Self {
                none: true,
                ..Self::default()
            };
        }
        // `--spec-default` adds ngram-mod at its default sizes (llama.cpp appends it to the list,
        // even after `none`).
        types.ngram_mod |= spec_default;
        Ok(types)
    }

    fn any(&self) -> bool {
        self.ngram_simple
            || self.ngram_map_k
            || self.ngram_map_k4v
            || self.ngram_mod
            || self.draft_simple
    }
}

impl SpeculativeConfig {
    /// The settings llama.cpp's flags ask for (`--spec-type`, `--spec-default`, whether
    /// `--spec-draft-model` is given, `--spec-draft-n-max`, `--spec-draft-n-min`,
    /// `--spec-draft-p-min`), `None` without speculation. `--spec-type` is a comma-separated
    /// list of `none`, `ngram-simple`, `ngram-map-k`, `ngram-map-k4v`, `ngram-mod` and
    /// `draft-simple` (tried in that order); the hashed types start at llama.cpp's default sizes
    /// (set by their own flags afterwards). As in llama.cpp, a draft model without a type selects
    /// `draft-simple`; a draft model that no listed type would use is refused, as are the other
    /// contradictions, naming the flags.
    pub fn from_flags(
        spec_type: Option<&str>,
        spec_default: bool,
        draft_model: bool,
        n_max: usize,
        n_min: usize,
        p_min: f32,
    ) -> Result<Option<Self>, EngineError> {
        let refuse = |m: &str| Err(EngineError::InvalidSpeculation(m.to_owned()));
        let mut types = Types::parse(spec_type, spec_default)?;
        if draft_model && !types.draft_simple {
            if types.any() {
                return refuse(&format!(
                    "--spec-draft-model is for --spec-type draft-simple, not {}{}: add \
                     draft-simple to the list, or leave the draft model out",
                    spec_type.unwrap_or("ngram-mod"),
                    if spec_default {
                        " (--spec-default)"
                    } else {
                        ""
                    }
                ));
            }
            if types.none {
                return refuse(
                    "--spec-draft-model needs --spec-type draft-simple (or no --spec-type)",
                );
            }
            types.draft_simple = true;
        }
        if types.draft_simple && !draft_model {
            return refuse("--spec-type draft-simple needs --spec-draft-model FILE");
        }
        if !types.any() {
            return Ok(None);
        }
        let proposer = match (types.ngram_simple, types.draft_simple) {
            (true, false) => Proposer::Ngram,
            (false, true) => Proposer::DraftModel,
            (true, true) => Proposer::NgramThenDraft,
            (false, false) => Proposer::Hashed,
        };
        if n_max == 0 {
            return refuse("--spec-draft-n-max 0: propose at least 1 token");
        }
        if n_min > n_max {
            return Err(EngineError::InvalidSpeculation(format!(
                "--spec-draft-n-min {n_min} is above --spec-draft-n-max {n_max}"
            )));
        }
        if !(0.0..=1.0).contains(&p_min) {
            return Err(EngineError::InvalidSpeculation(format!(
                "--spec-draft-p-min {p_min} is not a probability: give a value in [0, 1]"
            )));
        }
        let config = Self {
            proposer,
            draft_max: n_max,
            draft_min: n_min,
            p_min,
            ngram_map_k: types.ngram_map_k.then(NgramMapConfig::default),
            ngram_map_k4v: types.ngram_map_k4v.then(NgramMapConfig::default),
            ngram_mod: types.ngram_mod.then(NgramModConfig::default),
            ..Self::default()
        };
        config.validate()?;
        Ok(Some(config))
    }
}

#[cfg(test)]
mod tests {
    use crate::speculative::{Proposer, SpeculativeConfig};

    /// The list turns on the types named, in llama.cpp's order whatever the list's; `none`
    /// makes the value none; `--spec-default` adds ngram-mod; llama.cpp's other types and
    /// unknown names are refused by name; a draft model no listed type uses is refused.
    #[test]
    fn spec_type_lists_turn_on_each_type() {
        let flags = |t: Option<&str>, default: bool, draft: bool| {
            SpeculativeConfig::from_flags(t, default, draft, 16, 1, 0.0)
        };
        let config = flags(Some("ngram-mod,ngram-map-k4v,ngram-map-k"), false, false)
            .unwrap()
            .unwrap();
        assert_eq!(config.proposer, Proposer::Hashed);
        assert!(config.ngram_map_k.is_some() && config.ngram_map_k4v.is_some());
        let ngram_mod = config.ngram_mod.unwrap();
        assert_eq!(
            (ngram_mod.n_match, ngram_mod.n_min, ngram_mod.n_max),
            (24, 48, 64)
        );
        let map = config.ngram_map_k.unwrap();
        assert_eq!((map.size_n, map.size_m, map.min_hits), (12, 48, 1));
        assert!(config.is_chain());

        let both = flags(Some("draft-simple,ngram-simple"), false, true)
            .unwrap()
            .unwrap();
        assert_eq!(both.proposer, Proposer::NgramThenDraft);
        assert!(both.is_chain() && !both.hashed());
        let simple = flags(Some("ngram-simple"), false, false).unwrap().unwrap();
        assert!(!simple.is_chain());

        assert_eq!(flags(Some("none,ngram-mod"), false, false).unwrap(), None);
        let default = flags(None, true, false).unwrap().unwrap();
        assert_eq!(default.proposer, Proposer::Hashed);
        assert!(default.ngram_mod.is_some() && default.ngram_map_k.is_none());
        let after_none = flags(Some("none"), true, false).unwrap().unwrap();
        assert!(after_none.ngram_mod.is_some());

        for (t, default, draft, named) in [
            (Some("ngram-cache"), false, false, "--spec-type ngram-cache"),
            (Some("ngram-mod,draft-eagle3"), false, false, "draft-eagle3"),
            (Some("ngram-mod,"), false, false, "--spec-type :"),
            (Some("ngram-mod"), false, true, "--spec-draft-model"),
            (None, true, true, "--spec-default"),
            (
                Some("ngram-map-k,draft-simple"),
                false,
                false,
                "--spec-draft-model FILE",
            ),
        ] {
            let err = flags(t, default, draft).unwrap_err().to_string();
            assert!(err.contains(named), "{t:?}: {err}");
        }
        let chained = flags(Some("ngram-map-k,draft-simple"), false, true)
            .unwrap()
            .unwrap();
        assert_eq!(chained.proposer, Proposer::DraftModel);
        assert!(chained.is_chain());
    }
}
