//! Per-sequence recurrent state of a hybrid model's linear-attention layers (gated DeltaNet): for
//! each such layer, the last inputs of its causal convolution and its f32 matrix state. A
//! [`crate::KvCache`] carries one beside its key/value blocks, so that the state is created,
//! stepped and freed with its sequence, and counted with its memory.
//!
//! Unlike keys and values, the state summarises every position it has consumed: it is the state
//! *after* exactly [`RecurrentState::position`] tokens. To go back to fewer positions (a cached
//! prefix, a speculative step's rejected proposals) it keeps copies of itself at earlier
//! positions:
//!
//! - *snapshots*, when asked ([`RecurrentState::set_keep_snapshots`]: the prefix cache is on):
//!   the state after every multiple of the snapshot interval (the KV cache's block), kept with
//!   the blocks they end and shared with them, so a sequence that takes a cached prefix of whole
//!   blocks resumes from the state its source had there;
//! - *checkpoints*, when asked for one step ([`RecurrentState::checkpoint_next_step`]: a
//!   speculative verification): the state after each of that step's positions, kept until the
//!   next step, so the rejected proposals can be rolled back to the last accepted token.
//!
//! A step records them layer by layer ([`RecurrentState::cuts`] says where it cuts its run,
//! [`RecurrentState::record`] takes each layer's state there) and they are filed when the step
//! ends ([`RecurrentState::advance`]).

use std::sync::Arc;

/// The sizes of one linear-attention layer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerStateShape {
    /// f32 values of the convolution's tail: `(taps - 1) × channels`.
    pub(crate) conv: usize,
    /// f32 values of the matrix state: `value_heads × value_dim × key_dim` (0 for a layer of
    /// convolution only).
    pub(crate) matrix: usize,
}

/// One linear-attention layer's state for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LayerState {
    /// The convolution's last `taps - 1` input rows, `[taps - 1, channels]`.
    pub(crate) conv: Vec<f32>,
    /// The delta rule's state, `[value_heads, value_dim, key_dim]`.
    pub(crate) matrix: Vec<f32>,
}

/// Every linear-attention layer's state at one position, in layer order.
type Layers = Vec<LayerState>;

/// Every linear-attention layer's state for one sequence, in layer order.
#[derive(Debug, Clone)]
pub struct RecurrentState {
    layers: Layers,
    /// Tokens the state has consumed.
    position: usize,
    /// Positions between snapshots (a multiple of the delta rule's chunk, so that a run cut at
    /// a snapshot computes the chunks an uncut one does).
    interval: usize,
    /// Whether steps keep the state after each multiple of `interval`.
    keep_snapshots: bool,
    /// `snapshots[i]`: the state after `(i + 1) · interval` positions (shared with the caches
    /// a prefix was copied to).
    snapshots: Vec<Arc<Layers>>,
    /// Whether the next step keeps the state after each of its positions.
    checkpoint_next: bool,
    /// The state after each position of the last step that asked for checkpoints:
    /// `(position, layers)`, dropped when the next step ends.
    checkpoints: Vec<(usize, Arc<Layers>)>,
    /// The step in progress's cuts, as its layers record them: `(position, layers so far)`.
    recording: Vec<(usize, Layers)>,
}

impl RecurrentState {
    /// A new sequence's state (zeros), one per linear-attention layer, with snapshots (when
    /// kept) every `interval` positions.
    pub(crate) fn new(shapes: &[LayerStateShape], interval: usize) -> Self {
        Self {
            layers: shapes
                .iter()
                .map(|s| LayerState {
                    conv: vec![0.0; s.conv],
                    matrix: vec![0.0; s.matrix],
                })
                .collect(),
            position: 0,
            interval: interval.max(1),
            keep_snapshots: false,
            snapshots: Vec::new(),
            checkpoint_next: false,
            checkpoints: Vec::new(),
            recording: Vec::new(),
        }
    }

    /// Tokens consumed: the state is the one after exactly this many positions.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes the state holds (f32 values of every layer), snapshots and checkpoints apart.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| 4 * (l.conv.len() + l.matrix.len()))
            .sum()
    }

    /// f32 values of the state ([`RecurrentState::export`]'s length).
    pub fn floats(&self) -> usize {
        self.bytes() / 4
    }

    /// Keeps (or stops keeping) a snapshot at each multiple of the interval from the next step
    /// on; stopping drops the ones held.
    pub(crate) fn set_keep_snapshots(&mut self, keep: bool) {
        self.keep_snapshots = keep;
        if !keep {
            self.snapshots.clear();
        }
    }

    /// Makes the next step keep the state after each of its positions.
    pub(crate) fn checkpoint_next_step(&mut self) {
        self.checkpoint_next = true;
    }

    /// Where a step of `n` tokens from `position` cuts its run to record the state (indices
    /// into its tokens, ascending, the state after that many of them), and whether it runs
    /// token by token (checkpointing every position, with decode's arithmetic).
    pub(crate) fn cuts(&self, position: usize, n: usize) -> (Vec<usize>, bool) {
        if self.checkpoint_next {
            return ((1..=n).collect(), true);
        }
        if !self.keep_snapshots {
            return (Vec::new(), false);
        }
        let cuts = (1..=n)
            .filter(|r| (position + r).is_multiple_of(self.interval))
            .collect();
        (cuts, false)
    }

    /// Records linear-attention layer `index`'s state after `position` positions (a cut of the
    /// step in progress; layers record in order).
    pub(crate) fn record(&mut self, index: usize, position: usize, state: LayerState) {
        let at = match self.recording.iter().position(|(p, _)| *p == position) {
            Some(at) => at,
            None => {
                self.recording.push((position, Vec::new()));
                self.recording.len() - 1
            }
        };
        let layers = &mut self.recording[at].1;
        if layers.len() == index {
            layers.push(state);
        }
    }

    /// Linear-attention layer `index`'s state (its place among the linear layers).
    pub(crate) fn layer_mut(&mut self, index: usize) -> &mut LayerState {
        &mut self.layers[index]
    }

    /// Records that a step consumed `n` more tokens in every layer, and files what it recorded:
    /// snapshots at multiples of the interval, checkpoints (replacing the last step's) if it
    /// was asked for them.
    pub(crate) fn advance(&mut self, n: usize) {
        let start = self.position;
        self.position = self.position.saturating_add(n);
        let checkpointing = std::mem::take(&mut self.checkpoint_next);
        let mut checkpoints = Vec::new();
        for (position, layers) in std::mem::take(&mut self.recording) {
            if layers.len() != self.layers.len() || position <= start || position > self.position {
                continue;
            }
            let layers = Arc::new(layers);
            if self.keep_snapshots
                && position.is_multiple_of(self.interval)
                && position / self.interval == self.snapshots.len() + 1
            {
                self.snapshots.push(Arc::clone(&layers));
            }
            if checkpointing {
                checkpoints.push((position, layers));
            }
        }
        self.checkpoints = checkpoints;
    }

    /// The state after `len` positions, if this state is it or keeps it (a checkpoint, a
    /// snapshot, or zeros for none).
    fn state_at(&self, len: usize) -> Option<Layers> {
        if len == self.position {
            return Some(self.layers.clone());
        }
        if len == 0 {
            return Some(self.zeros());
        }
        if let Some((_, layers)) = self.checkpoints.iter().find(|(p, _)| *p == len) {
            return Some(layers.as_ref().clone());
        }
        if len.is_multiple_of(self.interval) {
            return self
                .snapshots
                .get(len / self.interval - 1)
                .map(|layers| layers.as_ref().clone());
        }
        None
    }

    /// Every layer's state of zeros (a new sequence's).
    fn zeros(&self) -> Layers {
        self.layers
            .iter()
            .map(|l| LayerState {
                conv: vec![0.0; l.conv.len()],
                matrix: vec![0.0; l.matrix.len()],
            })
            .collect()
    }

    /// The most positions, at most `len`, whose state this one is or keeps: where a sequence
    /// that shares `len` of its positions can resume from.
    pub(crate) fn resumable(&self, len: usize) -> usize {
        if len == self.position {
            return len;
        }
        let checkpoint = self
            .checkpoints
            .iter()
            .map(|(p, _)| *p)
            .filter(|&p| p <= len)
            .max()
            .unwrap_or(0);
        let snapshot = (len / self.interval).min(self.snapshots.len()) * self.interval;
        checkpoint.max(snapshot)
    }

    /// Goes back to the state after `len` positions (at most those consumed) when it keeps it;
    /// otherwise marks itself as matching no position ([`RecurrentState::invalidate`]). The
    /// snapshots past `len` and the checkpoints are dropped either way.
    pub(crate) fn rewind(&mut self, len: usize) {
        if len >= self.position {
            return;
        }
        match self.state_at(len) {
            Some(layers) => {
                self.layers = layers;
                self.position = len;
            }
            None => self.invalidate(),
        }
        self.snapshots.truncate(len / self.interval);
        self.checkpoints.clear();
    }

    /// Becomes `source`'s state after `len` positions, with its snapshots up to there (shared);
    /// `false`, unchanged, when `source` keeps no state at `len`.
    pub(crate) fn copy_from(&mut self, source: &RecurrentState, len: usize) -> bool {
        let Some(layers) = source.state_at(len) else {
            return false;
        };
        if layers.len() != self.layers.len() {
            return false;
        }
        self.layers = layers;
        self.position = len;
        self.snapshots =
            source.snapshots[..(len / self.interval).min(source.snapshots.len())].to_vec();
        if !self.keep_snapshots {
            self.snapshots.clear();
        }
        self.checkpoints.clear();
        self.recording.clear();
        true
    }

    /// The state after `len` positions as f32 values, layer by layer, each layer's
    /// convolution tail then matrix state ([`RecurrentState::import`] reads this layout);
    /// `None` when it keeps no state at `len`.
    pub(crate) fn export(&self, len: usize) -> Option<Vec<f32>> {
        let layers = self.state_at(len)?;
        let mut out = Vec::with_capacity(self.floats());
        for layer in &layers {
            out.extend_from_slice(&layer.conv);
            out.extend_from_slice(&layer.matrix);
        }
        Some(out)
    }

    /// Becomes the state after `len` positions read from `data` ([`RecurrentState::export`]'s
    /// layout), forgetting its snapshots and checkpoints; `false`, unchanged, when `data` is
    /// not exactly [`RecurrentState::floats`] long.
    pub(crate) fn import(&mut self, data: &[f32], len: usize) -> bool {
        if data.len() != self.floats() {
            return false;
        }
        let mut at = 0;
        for layer in &mut self.layers {
            for part in [&mut layer.conv, &mut layer.matrix] {
                let n = part.len();
                part.copy_from_slice(&data[at..at + n]);
                at += n;
            }
        }
        self.position = len;
        self.snapshots.clear();
        self.checkpoints.clear();
        self.recording.clear();
        true
    }

    /// Marks the state as not matching any position: a cache rewound or cut to fewer positions
    /// than the state consumed, with no copy of the state there. The next step then fails, by
    /// name, rather than continue from the wrong state.
    pub(crate) fn invalidate(&mut self) {
        self.position = usize::MAX;
    }
}
