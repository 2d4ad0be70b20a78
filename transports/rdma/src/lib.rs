//! # oxccl-transport-rdma: one-sided RDMA between hosts
//!
//! One protocol over a small backend trait ([`Fabric`]): libfabric RDM endpoints ([`ofi`],
//! tested here with `tcp;ofi_rxm`) and InfiniBand/RoCE verbs ([`verbs`]: reliable-connected
//! queue pairs, tested on simulated devices; nothing has run on RDMA hardware, see
//! `docs/transports.md`).
//!
//! ## The protocol (per connection, sender → receiver)
//! - The receiver registers a ring of `slots` slots of `64 + max_message` bytes and publishes,
//!   in the setup blob, its endpoint address, a connection id, the ring's remote address and
//!   key, and a fresh token.
//! - The sender inserts that address, registers a staging ring of the same shape, and sends a
//!   HELLO message carrying its own address, its connection id and a proof (keyed by the job
//!   secret) over the token; the receiver accepts only a valid proof for a token it issued.
//! - A message: the sender writes header + payload into its staging slot and RDMA-writes the
//!   slot into the receiver's slot `index % slots` (one-sided). The write carries its own
//!   notification where the backend offers it (verbs' write with immediate, libfabric's remote
//!   CQ data: connection id and slot); otherwise a NOTIFY message with the index follows it on
//!   the same endpoint pair, and send-after-write ordering (`FI_ORDER_SAW`, requested from the
//!   provider; in order on an RC queue pair) makes the payload visible before the notification.
//!   Large messages of large operations are written from the user's buffer through the
//!   registration cache ([`regcache`], [`memmon`]) instead of being copied first.
//! - Credits: the receiver returns the number of messages it consumed in CREDIT messages; the
//!   sender never has more than `slots` messages unconsumed, so a slot is never overwritten
//!   before it was read.
//! - Closing: a connection closed with messages its receiver has not credited yet sends a FLUSH
//!   on each endpoint pair those messages took; the receiver answers FLUSHED once it has read
//!   the FLUSH, so after every message before it on that pair. The endpoint is closed only
//!   when every FLUSH was answered (or its peer is gone, or after `OXCCL_NET_LINGER_MS`): a
//!   completion at the sender can mean only that the bytes left this process (a software
//!   provider's socket), and closing a socket with unread data resets it, dropping what its
//!   send queue still held. A rank that finished and exited must not take its last messages
//!   with it. Closing after a failure or an abort does not wait. A sender that closes normally
//!   sends CLOSED with its message count: the receiver reports `PeerClosed` once it read them.
//! - Completions: one completion queue per endpoint with a file descriptor; the executor sleeps
//!   in `poll(2)` on it after `fi_trywait` says nothing is pending, so an idle rank does not
//!   spin. Error completions become `Remote`/`System` errors naming the peer rank, the provider,
//!   the device and the status.
//!
//! `unsafe` is limited to the FFI of the backends and the raw ring memory handed to them, each
//! with a `// SAFETY:` comment.

mod config;
mod connect;
mod ctlauth;
mod engine;
mod fabric;
pub mod memmon;
pub mod ofi;
mod recv;
pub mod regcache;
mod send;
#[cfg(test)]
mod tests;
pub mod verbs;
mod wire;

pub use config::*;
pub use connect::*;
use ctlauth::*;
use engine::*;
pub use fabric::*;
use recv::*;
use send::*;
pub use wire::*;
