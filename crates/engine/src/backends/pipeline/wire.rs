//! What the ranks of a pipeline say to each other, as int32 arrays (MLX's send and recv move
//! arrays): every message is a header of [`HEADER`] ints, then a payload of as many ints as the
//! header says, then for a step the hidden states (f32, `[tokens, hidden]`).
//!
//! Messages travel down the pipe (rank r to rank r + 1) and the last rank answers rank 0. Rank 0
//! opens with [`Kind::Hello`] (the protocol version, its model's fingerprint, every rank's
//! layers); each rank checks it, loads its layers and passes it on, and the last rank answers
//! [`Kind::Ready`] (or [`Kind::Fail`] with the rank that refused and why). Then each engine step
//! is one [`Kind::Step`]: the slot operations since the last step (allocations, frees, prefix
//! copies, truncations, new bounds), then each sequence's slot, position, new-token count and
//! first returned row, then the tokens; the last rank answers [`Kind::Rows`] (logits, or normed
//! hidden states that rank 0 projects with the tied embedding table). A worker that cannot run a
//! step exits (its log says why), which closes its sockets: its neighbours' next receive fails
//! and the pipeline is down. [`Kind::Shutdown`] ends every worker.

/// Ints in a header: kind, payload length, two arguments.
pub(crate) const HEADER: usize = 4;

/// The protocol's version, in [`Kind::Hello`]; ranks built from different versions refuse.
pub(crate) const VERSION: i32 = 1;

/// Message kinds (a header's first int).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Hello = 1,
    Ready = 2,
    Fail = 3,
    Step = 4,
    Rows = 5,
    Shutdown = 6,
}

impl Kind {
    pub(crate) fn from_i32(v: i32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Ready,
            3 => Kind::Fail,
            4 => Kind::Step,
            5 => Kind::Rows,
            6 => Kind::Shutdown,
            _ => return None,
        })
    }
}

/// Why a rank refused the pipeline ([`Kind::Fail`]'s second argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailReason {
    Version = 1,
    ModelMismatch = 2,
    Load = 3,
}

impl FailReason {
    pub(crate) fn from_i32(v: i32) -> &'static str {
        match v {
            1 => "it runs another version of mlxcel's pipeline protocol",
            2 => "its model files differ from rank 0's (another checkpoint, or other tensors)",
            3 => "it could not load its layers (its log says why)",
            _ => "it failed (its log says why)",
        }
    }
}

/// A message's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    pub(crate) payload: usize,
    pub(crate) a: i32,
    pub(crate) b: i32,
}

impl Header {
    pub(crate) fn new(kind: Kind, payload: usize, a: i32, b: i32) -> Header {
        Header {
            kind,
            payload,
            a,
            b,
        }
    }

    pub(crate) fn encode(&self) -> [i32; HEADER] {
        [self.kind as i32, self.payload as i32, self.a, self.b]
    }

    pub(crate) fn decode(ints: &[i32]) -> Result<Header, String> {
        match ints {
            &[kind, payload, a, b] => Ok(Header {
                kind: Kind::from_i32(kind).ok_or_else(|| format!("unknown message kind {kind}"))?,
                payload: usize::try_from(payload)
                    .map_err(|_| format!("negative payload length {payload}"))?,
                a,
                b,
            }),
            _ => Err(format!("a header of {} ints", ints.len())),
        }
    }
}

/// Rank 0's opening: the protocol version, its model's fingerprint and every rank's layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) version: i32,
    pub(crate) fingerprint: u64,
    pub(crate) ends: Vec<usize>,
}

impl Hello {
    pub(crate) fn encode(&self) -> Vec<i32> {
        let mut out = vec![
            self.version,
            (self.fingerprint >> 32) as u32 as i32,
            self.fingerprint as u32 as i32,
        ];
        out.extend(self.ends.iter().map(|&e| e as i32));
        out
    }

    pub(crate) fn decode(ints: &[i32]) -> Result<Hello, String> {
        if ints.len() < 4 {
            return Err(format!("a hello of {} ints", ints.len()));
        }
        Ok(Hello {
            version: ints[0],
            fingerprint: (u64::from(ints[1] as u32) << 32) | u64::from(ints[2] as u32),
            ends: ints[3..]
                .iter()
                .map(|&e| usize::try_from(e).map_err(|_| format!("negative layer end {e}")))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A change to the slots' caches that every rank applies to its own layers' caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotOp {
    /// A new, empty cache of at most `max` positions.
    Alloc {
        slot: usize,
        max: usize,
    },
    Release {
        slot: usize,
    },
    /// `to`'s first `len` positions become `from`'s.
    CopyPrefix {
        from: usize,
        to: usize,
        len: usize,
    },
    /// Forget positions from `len` on, and bound the cache at `max` positions.
    Bound {
        slot: usize,
        len: usize,
        max: usize,
    },
}

/// The ints of an op: a code and three arguments.
const OP_INTS: usize = 4;

impl SlotOp {
    fn encode(&self, out: &mut Vec<i32>) {
        let (code, a, b, c) = match *self {
            SlotOp::Alloc { slot, max } => (1, slot, max, 0),
            SlotOp::Release { slot } => (2, slot, 0, 0),
            SlotOp::CopyPrefix { from, to, len } => (3, from, to, len),
            SlotOp::Bound { slot, len, max } => (4, slot, len, max),
        };
        out.extend([code, a as i32, b as i32, c as i32]);
    }

    fn decode(ints: &[i32]) -> Result<SlotOp, String> {
        let arg = |i: usize| {
            usize::try_from(ints[i]).map_err(|_| format!("negative slot argument {}", ints[i]))
        };
        Ok(match ints[0] {
            1 => SlotOp::Alloc {
                slot: arg(1)?,
                max: arg(2)?,
            },
            2 => SlotOp::Release { slot: arg(1)? },
            3 => SlotOp::CopyPrefix {
                from: arg(1)?,
                to: arg(2)?,
                len: arg(3)?,
            },
            4 => SlotOp::Bound {
                slot: arg(1)?,
                len: arg(2)?,
                max: arg(3)?,
            },
            other => return Err(format!("unknown slot operation {other}")),
        })
    }
}

/// One sequence of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepSeq {
    pub(crate) slot: usize,
    /// Positions its cache holds before the step.
    pub(crate) start: usize,
    /// New tokens.
    pub(crate) n: usize,
    /// The first of its new positions whose row the step returns (`n - 1`: the last only).
    pub(crate) first: usize,
}

/// The ints of a sequence's entry.
const SEQ_INTS: usize = 4;

/// One engine step: the slot operations since the last one, the sequences and their tokens.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Step {
    pub(crate) ops: Vec<SlotOp>,
    pub(crate) seqs: Vec<StepSeq>,
    pub(crate) tokens: Vec<u32>,
}

impl Step {
    /// Rows the step returns.
    pub(crate) fn rows(&self) -> usize {
        self.seqs.iter().map(|s| s.n - s.first).sum()
    }

    pub(crate) fn encode(&self) -> Vec<i32> {
        let mut out = Vec::with_capacity(
            2 + self.ops.len() * OP_INTS + self.seqs.len() * SEQ_INTS + self.tokens.len(),
        );
        out.push(self.ops.len() as i32);
        for op in &self.ops {
            op.encode(&mut out);
        }
        out.push(self.seqs.len() as i32);
        for s in &self.seqs {
            out.extend([s.slot, s.start, s.n, s.first].map(|v| v as i32));
        }
        out.extend(self.tokens.iter().map(|&t| t as i32));
        out
    }

    pub(crate) fn decode(ints: &[i32]) -> Result<Step, String> {
        let short = || format!("a step message cut short at {} ints", ints.len());
        let count = |at: usize| -> Result<usize, String> {
            let v = *ints.get(at).ok_or_else(short)?;
            usize::try_from(v).map_err(|_| format!("negative count {v}"))
        };
        let mut at = 0;
        let n_ops = count(at)?;
        at += 1;
        let ops_end = at + n_ops * OP_INTS;
        let ops = ints
            .get(at..ops_end)
            .ok_or_else(short)?
            .chunks_exact(OP_INTS)
            .map(SlotOp::decode)
            .collect::<Result<Vec<_>, _>>()?;
        at = ops_end;
        let n_seqs = count(at)?;
        at += 1;
        let seqs_end = at + n_seqs * SEQ_INTS;
        let mut seqs = Vec::with_capacity(n_seqs);
        for entry in ints
            .get(at..seqs_end)
            .ok_or_else(short)?
            .chunks_exact(SEQ_INTS)
        {
            let v: Vec<usize> = entry
                .iter()
                .map(|&x| usize::try_from(x).map_err(|_| format!("negative step field {x}")))
                .collect::<Result<_, _>>()?;
            if v[2] == 0 || v[3] >= v[2] {
                return Err(format!(
                    "slot {}: {} new tokens with first returned row {}",
                    v[0], v[2], v[3]
                ));
            }
            seqs.push(StepSeq {
                slot: v[0],
                start: v[1],
                n: v[2],
                first: v[3],
            });
        }
        at = seqs_end;
        let tokens: Vec<u32> = ints[at..].iter().map(|&t| t as u32).collect();
        let expected: usize = seqs.iter().map(|s| s.n).sum();
        if tokens.len() != expected {
            return Err(format!(
                "{} tokens for sequences of {expected} new tokens",
                tokens.len()
            ));
        }
        Ok(Step { ops, seqs, tokens })
    }
}

/// A 64-bit FNV-1a hash, the same on every build and host (std's hasher is not).
pub(crate) fn fnv1a(parts: impl IntoIterator<Item = impl AsRef<[u8]>>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &byte in part.as_ref() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_hellos_survive_the_wire() {
        let step = Step {
            ops: vec![
                SlotOp::Alloc { slot: 3, max: 512 },
                SlotOp::CopyPrefix {
                    from: 1,
                    to: 3,
                    len: 256,
                },
                SlotOp::Bound {
                    slot: 1,
                    len: 200,
                    max: 300,
                },
                SlotOp::Release { slot: 0 },
            ],
            seqs: vec![
                StepSeq {
                    slot: 3,
                    start: 256,
                    n: 3,
                    first: 2,
                },
                StepSeq {
                    slot: 2,
                    start: 7,
                    n: 2,
                    first: 0,
                },
            ],
            tokens: vec![1, 2, 3, 4, 151_935],
        };
        assert_eq!(step.rows(), 3);
        assert_eq!(Step::decode(&step.encode()).unwrap(), step);
        let hello = Hello {
            version: VERSION,
            fingerprint: 0xdead_beef_0123_4567,
            ends: vec![10, 20, 30],
        };
        assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
        let header = Header::new(Kind::Rows, 0, 5, 576);
        assert_eq!(Header::decode(&header.encode()).unwrap(), header);
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let good = Step {
            ops: vec![],
            seqs: vec![StepSeq {
                slot: 0,
                start: 0,
                n: 2,
                first: 1,
            }],
            tokens: vec![5, 6],
        }
        .encode();
        for cut in 0..good.len() {
            assert!(Step::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        assert!(
            Step::decode(&[0, 1, 0, 0, 1, 1, 5]).is_err(),
            "first past n"
        );
        assert!(Step::decode(&[1, 9, 0, 0, 0, 0]).is_err(), "unknown op");
        assert!(Header::decode(&[99, 0, 0, 0]).is_err());
        assert!(Header::decode(&[1, -1, 0, 0]).is_err());
        assert_ne!(fnv1a(["ab", "c"]), fnv1a(["a", "bc"]));
    }
}
