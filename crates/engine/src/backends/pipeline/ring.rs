//! Joining MLX's ring (once per process, with a deadline) and the fingerprint ranks compare to
//! know that they hold the same model.

use std::sync::{Mutex, mpsc};

use mlxcel_core::distributed::Group;
use mlxcel_model::Checkpoint;

use super::hosts::Hostfile;
use super::link::pipe_error;
use super::wire::fnv1a;
use crate::error::EngineError;
use crate::options::PipelineOptions;

/// The group this process joined (MLX joins once per process).
static JOINED: Mutex<Option<Group>> = Mutex::new(None);

/// Joins the ring of `options.hostfile` as `options.rank` and returns the group. The hostfile
/// and rank are checked first; joining blocks until every rank has connected, and fails, naming
/// this rank's neighbours and their addresses, when that takes longer than
/// `options.connect_timeout`. A later call returns the group joined first.
pub(crate) fn join_pipeline(options: &PipelineOptions) -> Result<Group, EngineError> {
    let mut joined = JOINED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(group) = *joined {
        return Ok(group);
    }
    let hosts = Hostfile::read(&options.hostfile, options.rank)?;
    let (done, wait) = mpsc::channel();
    let (file, rank) = (options.hostfile.clone(), options.rank);
    // Joining blocks inside MLX without a deadline; the thread is left behind if it never
    // returns (the caller then exits with the error below).
    std::thread::Builder::new()
        .name("mlxcel-ring-join".into())
        .spawn(move || {
            let _ = done.send(Group::init_ring(Some((&file, rank))));
        })
        .map_err(|e| pipe_error(format!("cannot start the thread that joins the ring: {e}")))?;
    let size = hosts.ranks.len();
    let group = match wait.recv_timeout(options.connect_timeout) {
        Ok(Ok(group)) => group,
        Ok(Err(e)) => return Err(pipe_error(format!("joining MLX's ring: {e}"))),
        Err(_) => {
            let (prev, next) = ((rank + size - 1) % size, (rank + 1) % size);
            return Err(pipe_error(format!(
                "rank {rank} ({}) could not reach its peers within {} s: rank {prev} at {} and \
                 rank {next} at {} did not connect; start every rank of {} and check that \
                 these ports are reachable",
                hosts.describe(rank),
                options.connect_timeout.as_secs(),
                hosts.describe(prev),
                hosts.describe(next),
                options.hostfile.display()
            )));
        }
    };
    if group.size() != size || group.rank() != rank {
        return Err(pipe_error(format!(
            "MLX joined rank {} of {} where the hostfile says rank {rank} of {size}",
            group.rank(),
            group.size()
        )));
    }
    group
        .set_link_timeout(options.link_timeout)
        .map_err(|e| pipe_error(format!("rank {rank}: {e}")))?;
    *joined = Some(group);
    Ok(group)
}

/// A hash of what the ranks must agree on: every tensor's name, type, shape and size, and the
/// config's shape (the weights' bytes are not read: that would read the whole file on every
/// rank).
pub(crate) fn fingerprint(checkpoint: &Checkpoint) -> u64 {
    let c = checkpoint.config();
    let mut parts = vec![format!(
        "{} {} {} {} {}",
        c.num_hidden_layers, c.hidden_size, c.vocab_size, c.num_attention_heads, c.head_dim
    )];
    for t in checkpoint.tensor_infos() {
        parts.push(format!(
            "{} {:?} {:?} {}",
            t.name, t.dtype, t.shape, t.byte_len
        ));
    }
    fnv1a(parts)
}
