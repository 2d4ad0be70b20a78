//! # oxccl: collective communication for training jobs
//!
//! oxccl runs NCCL's collectives (all-reduce, all-gather, reduce-scatter, broadcast, reduce,
//! all-to-all, gather, scatter, send/recv, barrier) between ranks that are processes on one host
//! (shared memory), on many hosts (TCP), or threads of one process. Every wait is bounded, a
//! failure names the rank, peer and operation, and mismatched calls fail loudly.
//!
//! This crate is the core: communicators, bootstrap, schedules, the simulator, the executor and
//! host reductions. It has no `unsafe` (`#![forbid(unsafe_code)]`); the transports that need it
//! live in their own crates and are chosen automatically: shared memory between ranks with the
//! same host identity (`oxccl-transport-shm`), TCP between hosts (`oxccl-transport-tcp`), or the
//! RDMA protocol over libfabric or verbs with `OXCCL_NET=ofi`/`ib` (`oxccl-transport-rdma`).
//!
//! | NCCL | oxccl |
//! |---|---|
//! | `ncclGetUniqueId` | [`UniqueId::new`] |
//! | `ncclCommInitRank` | [`Communicator::init`], or [`Communicator::from_env`] under torchrun/mpirun/srun |
//! | `ncclCommInitAll` | [`Communicator::init_all`] (threads as ranks) |
//! | `ncclCommSplit` | [`Communicator::split`] |
//! | `ncclAllReduce` ... | [`Communicator::all_reduce`] ..., or [`Communicator::run`] on raw bytes |
//! | `ncclGroupStart/End` | [`Group`] |
//! | enqueue on a stream | [`Communicator::all_reduce_async`] ... returning a [`Request`] |
//! | `ncclCommAbort` | [`Communicator::abort`] / [`AbortHandle`] (from any thread) |
//! | `ncclResult_t` | [`Error`] with [`ErrorKind`] |
//!
//! ## Example: threads as ranks
//! ```
//! use oxccl::{Communicator, ReduceOp};
//! let comms = Communicator::init_all(4)?;
//! std::thread::scope(|s| {
//!     for c in &comms {
//!         s.spawn(move || {
//!             let mut grads = vec![c.rank() as f32; 1000];
//!             c.all_reduce_inplace(&mut grads, ReduceOp::Sum).unwrap();
//!             assert!(grads.iter().all(|&g| g == 6.0));
//!         });
//!     }
//! });
//! # Ok::<(), oxccl::Error>(())
//! ```
//!
//! ## Example: processes
//! One process creates the id and hands its hex form to the others (`OXCCL_UNIQUE_ID`, a file, a
//! launcher); every rank then joins:
//! ```no_run
//! use oxccl::{Communicator, ReduceOp, UniqueId};
//! # fn get_id_somehow() -> String { String::new() }
//! let (nranks, rank) = (4, 0);
//! let id = if rank == 0 { UniqueId::new()? } else { UniqueId::from_hex(&get_id_somehow())? };
//! let comm = Communicator::init(&id, nranks, rank)?;
//! let req = comm.all_reduce_async(vec![1.0f32; 1 << 20], ReduceOp::Avg)?; // overlaps compute
//! let grads = req.wait()?;
//! # Ok::<(), oxccl::Error>(())
//! ```
//!
//! ## Settings
//! From the environment, see [`Config`]: `OXCCL_TIMEOUT`, `NCCL_SOCKET_IFNAME`,
//! `NCCL_SHM_DISABLE`, `OXCCL_HOSTID`/`NCCL_HOSTID`, `OXCCL_CHUNK_BYTES`, `OXCCL_SLOTS`,
//! `OXCCL_SPIN_US`; logging with `OXCCL_DEBUG=INFO` or `NCCL_DEBUG=INFO`.
//!
//! The design, with its invariants, is in `docs/ARCHITECTURE.md`; the cost of each algorithm in
//! `docs/algorithms.md`; errors in `docs/errors.md`.

#![forbid(unsafe_code)]

/// Modules whose insides are API only with the `internals` feature (oxccl's own tests,
/// benchmark and fuzzers): the simulator, exact test data, the executor, the schedules, the
/// reduction kernels, the store, the tuner. What a user needs of them is re-exported below.
macro_rules! internal {
    ($($m:ident),* $(,)?) => { $(
        #[cfg(feature = "internals")]
        pub mod $m;
        #[cfg(not(feature = "internals"))]
        #[allow(dead_code, unused_imports)]
        mod $m;
    )* };
}
internal!(exact, exec, flight, reduce, schedule, select, sim, store, tuner);
pub mod types;

pub use oxccl_transport::fork::generation as fork_generation;
pub use oxccl_transport::{Cause, Error, ErrorKind, Result};
pub use types::{DataType, Element, ReduceOp, F8E4M3, F8E5M2};
mod beacon;
pub mod bootstrap;
pub mod communicator;
pub mod config;
pub mod encryption;
pub mod launcher;
pub mod log;
mod order;
mod progress;
mod runtime;
pub mod watch;

pub use bootstrap::UniqueId;
pub use communicator::{AbortHandle, Communicator, Group, OpDesc, Request, ShrinkMode};
pub use config::Config;
pub use encryption::{set_encryption, Encryption};
pub use exec::{HostBuf, OpMem};
pub use schedule::{inplace_layout, Algo, Coll};
pub use select::{AlgoSelection, CallOptions};
