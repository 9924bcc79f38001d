//! MLX's distributed layer with its ring backend (TCP between hosts): the process's [`Group`]
//! and send/recv of arrays between neighbouring ranks, what a pipeline of stages passes its
//! hidden states over (see docs/distributed.md).
//!
//! MLX's ring backend reads its hosts from the JSON file `MLX_HOSTFILE` names (one entry per
//! rank, each a list of `"ip:port"`) and this process's rank from `MLX_RANK`; `mlx.launch` sets
//! both. [`Group::init_ring`] either keeps those (under `mlx.launch`) or sets them from a hostfile
//! and rank given on the command line, then joins the ring, which blocks until every rank has
//! connected. `send` and `recv` are lazy ops like any other: the bytes move when the array is
//! evaluated. On a closed peer socket (the peer exited or was killed) MLX's ring retries for
//! about a second, then fails the pending operation with "[ring] connection to a peer was lost",
//! which reaches Rust as [`Error::Mlx`]. A silent partition (no FIN, no RST) is not detected
//! by MLX; [`Group::set_link_timeout`] has TCP detect it within seconds.

use std::path::Path;

use crate::array::{Array, call};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::sys::{self, ffi};

/// The ranks of the process's MLX ring, as MLX reports them after joining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    rank: usize,
    size: usize,
}

impl Group {
    /// Joins MLX's ring. With `hosts: Some((hostfile, rank))` the ring reads that hostfile and
    /// rank (MLX reads them from `MLX_HOSTFILE` and `MLX_RANK` only, which this sets for the
    /// process before MLX starts); with `None` it reads the environment `mlx.launch` sets. Blocks
    /// until every rank of the hostfile has connected; MLX's own error (a malformed hostfile, a
    /// rank past the group's size) otherwise. Joining twice returns the group joined first.
    pub fn init_ring(hosts: Option<(&Path, usize)>) -> Result<Group> {
        let (hostfile, rank) = match hosts {
            Some((file, rank)) => {
                let file = file.to_str().ok_or_else(|| Error::Mlx {
                    op: "distributed init",
                    message: format!("hostfile path {} is not UTF-8", file.display()),
                })?;
                let rank = i32::try_from(rank).map_err(|_| Error::Mlx {
                    op: "distributed init",
                    message: format!("rank {rank} is too large"),
                })?;
                (file, rank)
            }
            None => ("", 0),
        };
        let ids = sys::with_lock(|| ffi::dist_init_ring(hostfile, rank))
            .map_err(Error::mlx("distributed init"))?;
        match ids.as_slice() {
            &[rank, size] if rank >= 0 && size > 0 && rank < size => Ok(Group {
                rank: rank as usize,
                size: size as usize,
            }),
            other => Err(Error::Mlx {
                op: "distributed init",
                message: format!("MLX reported rank and size {other:?}"),
            }),
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the ring has.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The rank after this one around the ring (the last rank's is rank 0).
    pub fn next(&self) -> usize {
        (self.rank + 1) % self.size
    }

    /// The rank before this one around the ring (rank 0's is the last rank).
    pub fn prev(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }

    /// An op that sends `a` to rank `dst` when evaluated (MLX's ring reaches its neighbours:
    /// [`Group::next`] and [`Group::prev`]).
    pub fn send(&self, a: &Array, dst: usize) -> Result<Array> {
        let dst = self.peer(dst)?;
        call("send", || ffi::dist_send(a.raw(), dst))
    }

    /// An op that receives an array of `shape` and `dtype` from rank `src` when evaluated.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array> {
        let src = self.peer(src)?;
        call("recv", || ffi::dist_recv(shape, dtype as u8, src))
    }

    /// Sleeps until a neighbour's bytes are waiting on one of the ring's sockets (`Ok(true)`) or
    /// `timeout` passes (`Ok(false)`; `None` waits without limit). MLX's ring reads a pending
    /// recv by polling its socket in a busy loop, so evaluating a recv whose data has not come
    /// yet keeps a core busy for the whole wait, the core a computing rank on the same machine
    /// needs; waiting here first and then evaluating the recv costs no CPU while the peer
    /// works. A peer that closed its connection is an error ("[ring] connection to a peer was
    /// lost"), as the recv itself would report: at once when every ring socket is closed,
    /// else once one has stayed closed for a second with no bytes on the others (when a
    /// pipeline ends, rank 0 closes its sockets while a rank further on still waits for the
    /// end from its other neighbour). Runs without the MLX lock.
    pub fn wait_readable(&self, timeout: Option<std::time::Duration>) -> Result<bool> {
        let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
        ffi::dist_wait_readable(ms)
            .map(|ready| ready != 0)
            .map_err(Error::mlx("distributed wait"))
    }

    /// Has TCP drop a connection of the ring whose peer stopped answering for about `timeout`:
    /// keepalive probes on an idle connection (after 1 s idle, 1 s apart) and a limit on how
    /// long sent bytes may stay unacknowledged. A silent partition (a host gone,
    /// a link cut) then fails the waiting recv or send like a closed peer does, instead of
    /// blocking until TCP's defaults give up (minutes to hours). Returns how many of the ring's
    /// sockets took the settings.
    pub fn set_link_timeout(&self, timeout: std::time::Duration) -> Result<usize> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let set = sys::with_lock(|| ffi::dist_set_link_timeout(ms))
            .map_err(Error::mlx("distributed link timeout"))?;
        Ok(set.max(0) as usize)
    }

    fn peer(&self, rank: usize) -> Result<i32> {
        if rank >= self.size || rank == self.rank {
            return Err(Error::Mlx {
                op: "distributed",
                message: format!(
                    "rank {} cannot exchange arrays with rank {rank} in a group of {}",
                    self.rank, self.size
                ),
            });
        }
        Ok(rank as i32)
    }
}
