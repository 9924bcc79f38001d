//! A sequence's state in llama.cpp's hashed n-gram proposers (`ngram-map-k`, `ngram-map-k4v`,
//! `ngram-mod`) and which proposer drafted what the sequence verifies next. The proposers are
//! [`crate::ngram_map`]'s and [`crate::ngram_mod`]'s; the order they are tried in is
//! llama.cpp's (the scheduler tries prompt lookup before them and the draft model after).
//! [`hashed_drafts`] replays them over a known greedy continuation, as llama.cpp's
//! `common_speculative` would run them (`scripts/check-ngram-proposers` compares the two).

use crate::ngram_map::NgramMap;
use crate::ngram_mod::{NgramModState, NgramModTable};
use crate::speculative::SpeculativeConfig;

/// Which proposer drafted a sequence's proposals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Prompt lookup (`ngram-simple`).
    Lookup,
    MapK,
    MapK4v,
    Mod,
    /// The draft model (`draft-simple`).
    Draft,
}

impl Source {
    /// Whether the draft is verified whole, as llama.cpp verifies it (the hashed proposers,
    /// whose own feedback sizes their drafts), rather than cut to the adaptive draft length.
    pub fn verified_whole(self) -> bool {
        matches!(self, Self::MapK | Self::MapK4v | Self::Mod)
    }
}

/// The ngram-mod tables, one per n-gram length: shared by every sequence, and kept from
/// request to request, as llama.cpp keeps its one table for the server's life.
#[derive(Debug, Default)]
pub(crate) struct ModTables(Vec<NgramModTable>);

impl ModTables {
    fn table(&mut self, n: usize) -> &mut NgramModTable {
        let index = match self.0.iter().position(|t| t.n() == n) {
            Some(index) => index,
            None => {
                self.0.push(NgramModTable::new(n));
                self.0.len() - 1
            }
        };
        &mut self.0[index]
    }
}

/// One sequence's hashed proposers.
#[derive(Debug, Default)]
pub(crate) struct HashedState {
    begun: bool,
    map_k: Option<NgramMap>,
    map_k4v: Option<NgramMap>,
    ngram_mod: NgramModState,
    /// The proposer of the draft awaiting verification, if any.
    pub(crate) pending: Option<Source>,
}

impl HashedState {
    /// Starts the proposers on the sequence's `prompt` once, at its first decode step (where
    /// llama.cpp starts them, after the prompt's evaluation).
    pub(crate) fn begin(
        &mut self,
        config: &SpeculativeConfig,
        prompt: &[u32],
        tables: &mut ModTables,
    ) {
        if self.begun {
            return;
        }
        self.begun = true;
        let map = |settings, key_only| {
            let mut map = NgramMap::new(settings, key_only);
            map.begin(prompt);
            map
        };
        self.map_k = config.ngram_map_k.map(|c| map(c, true));
        self.map_k4v = config.ngram_map_k4v.map(|c| map(c, false));
        if let Some(settings) = config.ngram_mod {
            let table = tables.table(usize::from(settings.n_match));
            self.ngram_mod.begin(table, prompt);
        }
    }

    /// The first draft of `ngram-map-k`, `ngram-map-k4v` and `ngram-mod` (that order, each
    /// asked only if the ones before it proposed nothing) after `tokens` (the history, then the
    /// token just sampled).
    pub(crate) fn draft(
        &mut self,
        config: &SpeculativeConfig,
        tokens: &[u32],
        tables: &mut ModTables,
    ) -> Option<(Source, Vec<u32>)> {
        let (&sampled, history) = tokens.split_last()?;
        let maps = [
            (self.map_k.as_mut(), Source::MapK),
            (self.map_k4v.as_mut(), Source::MapK4v),
        ];
        for (map, source) in maps {
            if let Some(map) = map {
                let draft = map.draft(history, sampled);
                if !draft.is_empty() {
                    return Some((source, draft));
                }
            }
        }
        let settings = config.ngram_mod?;
        let table = tables.table(usize::from(settings.n_match));
        let draft = self.ngram_mod.draft(table, settings, history, sampled);
        (!draft.is_empty()).then_some((Source::Mod, draft))
    }

    /// After the verification of a draft of `source`'s: `accepted` of its proposals were
    /// accepted (the feedback goes to that proposer alone, as in llama.cpp).
    pub(crate) fn accept(
        &mut self,
        config: &SpeculativeConfig,
        source: Source,
        accepted: usize,
        tables: &mut ModTables,
    ) {
        let map = match source {
            Source::MapK => self.map_k.as_mut(),
            Source::MapK4v => self.map_k4v.as_mut(),
            Source::Mod => {
                if let Some(settings) = config.ngram_mod {
                    let table = tables.table(usize::from(settings.n_match));
                    self.ngram_mod.accept(table, accepted);
                }
                None
            }
            Source::Lookup | Source::Draft => None,
        };
        if let Some(map) = map {
            map.accept(accepted);
        }
    }
}

/// One step of [`hashed_drafts`]: the history's length (prompt and output so far, before the
/// token just sampled), the proposer that drafted, and its draft (cut to the output left).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashedDraft {
    pub history: usize,
    pub source: Option<Source>,
    pub draft: Vec<u32>,
}

/// What `config`'s hashed proposers draft over a known greedy continuation `output` of `prompt`,
/// one sequence alone on a fresh server (a fresh ngram-mod table): `output[0]` comes from the
/// prompt's evaluation; then at each step, while two or more tokens are left, the proposers are
/// asked in llama.cpp's order with the draft cut to the tokens left less one (llama-server's
/// `n_draft_max` with `n_predict` = the output's length), greedy verification accepts the
/// draft's longest prefix that the output continues with, the proposer that drafted is told how
/// many, and the sequence moves past them and the token after. Prompt lookup and the draft model
/// are not asked (`ngram-simple` and `draft-simple` are left out of the chain).
pub fn hashed_drafts(
    config: &SpeculativeConfig,
    prompt: &[u32],
    output: &[u32],
) -> Vec<HashedDraft> {
    let mut tables = ModTables::default();
    let mut state = HashedState::default();
    state.begin(config, prompt, &mut tables);
    let mut tokens: Vec<u32> = prompt.iter().chain(output.first()).copied().collect();
    let mut steps = Vec::new();
    let mut i = 1;
    while i + 1 < output.len() {
        let room = output.len() - i - 1;
        let found = state.draft(config, &tokens, &mut tables);
        let (source, mut draft) = match found {
            Some((source, draft)) => (Some(source), draft),
            None => (None, Vec::new()),
        };
        draft.truncate(room);
        let accepted = draft
            .iter()
            .zip(&output[i..])
            .take_while(|(d, o)| d == o)
            .count();
        steps.push(HashedDraft {
            history: tokens.len() - 1,
            source,
            draft: draft.clone(),
        });
        if let (Some(source), false) = (source, draft.is_empty()) {
            state.accept(config, source, accepted, &mut tables);
        }
        tokens.extend_from_slice(&output[i..i + accepted + 1]);
        i += accepted + 1;
    }
    steps
}
