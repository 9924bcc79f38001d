//! The IREE runtime on a dedicated thread.
//!
//! IREE's sessions and buffers are not `Send`, so one thread owns them all ([`ffi::Session`] and
//! every buffer), and [`Runtime`] is a `Send` handle that sends it jobs over a channel. The CPU
//! device under the sessions is the process's, created once and shared by every runtime (see
//! `ffi::SharedDevice` for why it is never destroyed). Buffers are named by
//! [`BufferId`]; weights are uploaded once and passed by id to every call of every module, so all
//! executables share one copy.

mod ffi;

pub(crate) use ffi::copy_tensors_then_release;

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::hlo::ElementType;

/// A buffer owned by the runtime thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId(u64);

struct State {
    session: ffi::Session,
    buffers: HashMap<BufferId, ffi::BufferView>,
    next: u64,
}

impl State {
    fn insert(&mut self, view: ffi::BufferView) -> BufferId {
        let id = BufferId(self.next);
        self.next += 1;
        self.buffers.insert(id, view);
        id
    }

    fn get(&self, id: BufferId) -> std::result::Result<&ffi::BufferView, String> {
        self.buffers
            .get(&id)
            .ok_or_else(|| format!("buffer {id:?} is not live"))
    }
}

type Job = Box<dyn FnOnce(&mut State) + Send>;

/// A `Send` handle on the runtime thread.
#[derive(Debug)]
pub struct Runtime {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Runtime {
    /// Starts the thread with a session on the process's `local-task` (multi-threaded CPU)
    /// device.
    pub fn start() -> Result<Self> {
        let (jobs, receiver) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<std::result::Result<(), String>>();
        let thread = std::thread::Builder::new()
            .name("mlxcel-iree".into())
            .spawn(move || {
                let session = match ffi::Session::new() {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let mut state = State {
                    session,
                    buffers: HashMap::new(),
                    next: 0,
                };
                while let Ok(job) = receiver.recv() {
                    job(&mut state);
                }
                // Buffers go before the session that allocated them.
                state.buffers.clear();
            })
            .map_err(|e| Error::Runtime(format!("spawning the runtime thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                jobs: Some(jobs),
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(Error::Runtime(e)),
            Err(_) => Err(Error::Runtime("the runtime thread died starting".into())),
        }
    }

    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut State) -> std::result::Result<T, String> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |state| {
            let _ = tx.send(f(state));
        });
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| Error::Runtime("the runtime thread has stopped".into()))?;
        rx.recv()
            .map_err(|_| Error::Runtime("the runtime thread dropped a job".into()))?
            .map_err(Error::Runtime)
    }

    /// Loads a compiled module; its functions are then callable as `<module name>.<function>`.
    pub fn load_module(&self, path: &Path) -> Result<()> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            context: "reading the compiled module",
            path: path.to_owned(),
            source,
        })?;
        self.run(move |s| s.session.load_module(bytes))
    }

    /// Copies `data` (little-endian elements of `element`) into a new device buffer.
    pub fn upload(
        &self,
        data: Vec<u8>,
        dims: Vec<usize>,
        element: ElementType,
    ) -> Result<BufferId> {
        self.run(move |s| {
            let view = s.session.upload(&data, &dims, element)?;
            Ok(s.insert(view))
        })
    }

    /// Uploads i32 values.
    pub fn upload_i32(&self, values: &[i32], dims: Vec<usize>) -> Result<BufferId> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload(bytes, dims, ElementType::I32)
    }

    /// Calls `function` with `args`, releasing the buffers in `donated` afterwards (they were
    /// given to the call: IREE may write them in place). Returns the results' ids.
    pub fn call(
        &self,
        function: &str,
        args: Vec<BufferId>,
        donated: Vec<BufferId>,
    ) -> Result<Vec<BufferId>> {
        let function = function.to_owned();
        self.run(move |s| {
            let views = args
                .iter()
                .map(|&id| s.get(id))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let results = s.session.call(&function, &views)?;
            for id in &donated {
                s.buffers.remove(id);
            }
            Ok(results.into_iter().map(|v| s.insert(v)).collect())
        })
    }

    /// Reads an f32 buffer of `len` elements.
    pub fn read_f32(&self, id: BufferId, len: usize) -> Result<Vec<f32>> {
        self.run(move |s| {
            let mut bytes = vec![0u8; len * 4];
            s.session.read(s.get(id)?, &mut bytes)?;
            Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        })
    }

    /// Reads `len` f32 elements of a buffer from element `offset`.
    pub fn read_f32_range(&self, id: BufferId, offset: usize, len: usize) -> Result<Vec<f32>> {
        self.run(move |s| {
            let mut bytes = vec![0u8; len * 4];
            s.session.read_range(s.get(id)?, offset * 4, &mut bytes)?;
            Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        })
    }

    /// Writes f32 `values` into a buffer from element `offset`.
    pub fn write_f32_range(&self, id: BufferId, offset: usize, values: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.run(move |s| s.session.write_range(s.get(id)?, offset * 4, &bytes))
    }

    /// Copies `len` f32 elements from element `from_offset` of `from` to element `to_offset` of
    /// `to`, on the device (the ranges must not overlap).
    pub fn copy_f32_range(
        &self,
        from: BufferId,
        from_offset: usize,
        to: BufferId,
        to_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.run(move |s| {
            s.session.copy_range(
                s.get(from)?,
                from_offset * 4,
                s.get(to)?,
                to_offset * 4,
                len * 4,
            )
        })
    }

    /// Frees buffers; unknown ids are ignored.
    pub fn release(&self, ids: Vec<BufferId>) {
        let _ = self.run(move |s| {
            for id in ids {
                s.buffers.remove(&id);
            }
            Ok(())
        });
    }

    /// Whether two buffers share storage (IREE may return an argument's buffer as a result).
    pub fn same_buffer(&self, a: BufferId, b: BufferId) -> Result<bool> {
        self.run(move |s| Ok(s.get(a)?.same_buffer(s.get(b)?)))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
