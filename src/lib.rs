//! # oxccl
//!
//! (crate docs are written below, once the API is in place)

#![forbid(unsafe_code)]

pub mod exact;
pub mod exec;
pub mod reduce;
pub mod schedule;
pub mod sim;
pub mod types;

pub use oxccl_transport::{Error, ErrorKind, Result};
pub use types::{DataType, Element, ReduceOp, F8E4M3, F8E5M2};
pub mod bootstrap;
pub mod comm;
pub mod config;
pub mod store;
mod progress;

pub use bootstrap::UniqueId;
pub use comm::{AbortHandle, Communicator, Group, OpDesc, Request};
pub use config::Config;
pub use exec::{HostBuf, OpMem};
pub use schedule::Coll;
