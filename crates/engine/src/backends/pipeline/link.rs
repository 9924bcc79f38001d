//! Messages ([`super::wire`]) over MLX's ring: a header and an int payload, each one send of an
//! int32 array, evaluated (sent) before the next so that they arrive in order.

use mlxcel_core::distributed::Group;
use mlxcel_core::{Array, Dtype};

use super::wire::{HEADER, Header};
use crate::error::EngineError;

/// A pipeline failure: the ring lost a peer, or a peer said something this rank cannot read.
pub(crate) fn pipe_error(message: impl std::fmt::Display) -> EngineError {
    EngineError::backend("mlx", format!("{PIPELINE_FAILURE}{message}"))
}

/// What every pipeline failure's message contains (`mlx backend: pipeline: ...`), for callers
/// that tell it from other failures by a request's error text (the server answers it as the
/// service being down).
pub const PIPELINE_FAILURE: &str = "pipeline: ";

/// Sends `header` and `payload` (its length is the header's) to rank `dst`.
pub(crate) fn send_message(
    group: &Group,
    header: Header,
    payload: &[i32],
    dst: usize,
) -> Result<(), EngineError> {
    let header = Header {
        payload: payload.len(),
        ..header
    };
    send_ints(group, &header.encode(), dst)?;
    if !payload.is_empty() {
        send_ints(group, payload, dst)?;
    }
    Ok(())
}

/// Receives a header and its payload from rank `src`.
pub(crate) fn recv_message(group: &Group, src: usize) -> Result<(Header, Vec<i32>), EngineError> {
    wait_for(group, src)?;
    let header = Header::decode(&recv_ints(group, HEADER, src)?)
        .map_err(|e| pipe_error(format!("rank {src} sent {e}")))?;
    let payload = if header.payload == 0 {
        Vec::new()
    } else {
        recv_ints(group, header.payload, src)?
    };
    Ok((header, payload))
}

/// Sleeps until bytes from a neighbour (rank `src`: rings carry data one way, so the bytes that
/// come are its) are waiting, so that the recv evaluated next does not spin a core while `src`
/// computes ([`Group::wait_readable`]).
pub(crate) fn wait_for(group: &Group, src: usize) -> Result<(), EngineError> {
    group
        .wait_readable(None)
        .map(|_| ())
        .map_err(|e| pipe_error(format!("receiving from rank {src}: {e}")))
}

fn send_ints(group: &Group, ints: &[i32], dst: usize) -> Result<(), EngineError> {
    let io = |e: mlxcel_core::Error| pipe_error(format!("sending to rank {dst}: {e}"));
    let array = Array::from_i32(ints, &[ints.len() as i32]).map_err(io)?;
    group.send(&array, dst).and_then(|s| s.eval()).map_err(io)
}

fn recv_ints(group: &Group, len: usize, src: usize) -> Result<Vec<i32>, EngineError> {
    let io = |e: mlxcel_core::Error| pipe_error(format!("receiving from rank {src}: {e}"));
    group
        .recv(&[len as i32], Dtype::I32, src)
        .and_then(|a| a.to_vec_i32())
        .map_err(io)
}
