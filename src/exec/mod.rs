//! The executor: drives schedules over connections.
//!
//! [`apply_step`] is the one data-path function: it resolves a step's slices in the user buffers
//! and runs the fused copy/reduce kernel, reading the received message in place and writing
//! straight into the send slot. The simulator's numeric mode calls the same function.
//!
//! [`OpRun`] is one operation's state machine. The one engine (`engine.rs`) moves sets of them:
//! [`drive`] for a group or a single blocking call, and the progress thread for asynchronous
//! operations; both poll each op as far as it can go, spin briefly when nothing moves, then arm
//! every connection they wait on and sleep in `poll(2)`.

mod byref;
mod engine;
mod observe;
mod run;
mod step;
mod wait;

pub use engine::{drive, quick_polls, QUICK_POLLS};
pub use observe::Observe;
pub(crate) use engine::{Engine, Finished, Runs};
pub use byref::single_copy_counts;
pub use run::OpRun;
pub use step::{apply_step, streamed_bytes, streams_output, STREAM_MIN};
pub use wait::*;

use oxccl_transport::{RecvConn, SendConn};

/// An owned host buffer an asynchronous operation carries (a `Vec<T>` of any element type).
pub trait HostBuf: Send + 'static {
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// The bytes, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// For handing the buffer back with its type.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

impl<T: crate::types::Element> HostBuf for Vec<T> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self)
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// The user buffers of one operation, in bytes.
pub enum OpMem<'a> {
    /// Separate input and output (either may be empty).
    Split {
        /// Send buffer.
        input: &'a [u8],
        /// Receive buffer.
        output: &'a mut [u8],
    },
    /// One allocation holding both windows (NCCL's in-place forms).
    InPlace {
        /// The allocation.
        buf: &'a mut [u8],
        /// Byte offset of the input window.
        in_off: usize,
        /// Byte offset of the output window.
        out_off: usize,
    },
    /// Owned separate buffers (asynchronous operations).
    OwnedSplit {
        /// Send buffer.
        input: Box<dyn HostBuf>,
        /// Receive buffer.
        output: Box<dyn HostBuf>,
    },
    /// One owned allocation holding both windows (asynchronous in-place operations).
    OwnedInPlace {
        /// The allocation.
        buf: Box<dyn HostBuf>,
        /// Byte offset of the input window.
        in_off: usize,
        /// Byte offset of the output window.
        out_off: usize,
    },
}

impl OpMem<'_> {
    /// A borrowed view (owned variants become their borrowed forms).
    pub fn view(&mut self) -> OpMem<'_> {
        match self {
            OpMem::Split { input, output } => OpMem::Split { input, output },
            OpMem::InPlace { buf, in_off, out_off } => OpMem::InPlace { buf, in_off: *in_off, out_off: *out_off },
            OpMem::OwnedSplit { input, output } => OpMem::Split { input: input.bytes(), output: output.bytes_mut() },
            OpMem::OwnedInPlace { buf, in_off, out_off } => {
                OpMem::InPlace { buf: buf.bytes_mut(), in_off: *in_off, out_off: *out_off }
            }
        }
    }
}

/// A communicator's connections, indexed by peer rank.
#[derive(Default)]
pub struct Conns {
    /// Sending halves.
    pub send: Vec<Option<Box<dyn SendConn>>>,
    /// Receiving halves.
    pub recv: Vec<Option<Box<dyn RecvConn>>>,
}

impl Conns {
    /// Empty connection tables for `n` peers.
    pub fn new(n: usize) -> Self {
        Conns { send: (0..n).map(|_| None).collect(), recv: (0..n).map(|_| None).collect() }
    }
    /// Tell every peer this rank is closing its connections because it failed or was aborted.
    pub fn abort_all(&mut self) {
        self.send.iter_mut().flatten().for_each(|c| c.abort());
        self.recv.iter_mut().flatten().for_each(|c| c.abort());
    }
}

/// What an op is blocked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// Waiting for a message from this peer.
    Recv(usize),
    /// Waiting for room towards this peer.
    Send(usize),
}
