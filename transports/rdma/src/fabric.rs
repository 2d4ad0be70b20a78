//! The fabric contract: what the protocol needs from libfabric or verbs (registrations,
//! one-sided writes, messages, completions, waiting).

use oxccl_transport::{Error, ErrorKind, Result};

/// A memory registration.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    /// The backend's handle.
    pub handle: usize,
    /// Local descriptor passed with local buffers.
    pub desc: usize,
    /// Remote key.
    pub key: u64,
    /// Remote address of the region's first byte (its virtual address, or 0 for offset-based
    /// providers).
    pub remote_base: u64,
}

/// One completion.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The token given when the operation was posted.
    pub token: u64,
    /// Bytes received (receives).
    pub len: usize,
    /// The status of an error completion.
    pub error: Option<String>,
    /// The notification of a peer's [`Fabric::write`] that landed here (its token is the
    /// receive it consumed, if the backend consumes one, else 0).
    pub data: Option<u32>,
}

/// What the protocol needs from an RDMA backend: one endpoint with an address vector and a
/// completion queue that has a file descriptor.
pub trait Fabric: Send + Sync {
    /// Provider name (`tcp;ofi_rxm`, `efa`, `verbs`).
    fn provider(&self) -> &str;
    /// Device or domain name (`mlx5_0`, `lo`).
    fn device(&self) -> &str;
    /// Endpoints of this rank (messages are striped across them; they share one completion
    /// queue).
    fn endpoints(&self) -> usize;
    /// Endpoint `ep`'s address, for peers.
    fn address(&self, ep: usize) -> Result<Vec<u8>>;
    /// Make a peer's address usable as a destination.
    fn insert_peer(&self, addr: &[u8]) -> Result<u64>;
    /// Register memory for local use and remote writes.
    ///
    /// # Safety
    /// `[buf, buf+len)` is mapped now, and no operation uses the registration after that
    /// memory is unmapped (it may be deregistered after: the registration cache deregisters
    /// user memory once its unmapping was seen).
    unsafe fn register(&self, buf: *mut u8, len: usize) -> Result<Region>;
    /// Register device memory exported by the GPU driver as a dma-buf (`fd`, `offset` into it,
    /// `len` bytes, mapped at `iova` in this process): GPUDirect RDMA. `Unavailable` where the
    /// backend or the driver does not offer it (then device memory is staged through pinned
    /// host memory).
    fn register_dmabuf(&self, _fd: i32, _offset: u64, _len: usize, _iova: u64) -> Result<Region> {
        Err(Error::new(ErrorKind::Unavailable, format!("{} cannot register device memory (dma-buf)", self.provider())))
    }
    /// Drop a registration.
    fn deregister(&self, r: &Region);
    /// One-sided write; `Ok(false)`: retry after progress. With `notify` (only where
    /// [`Fabric::notify_writes`]), the target also gets a completion carrying that value once
    /// the bytes are in place: the write and its notification in one operation.
    ///
    /// # Safety
    /// The buffer stays unchanged until the completion with `token`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn write(
        &self,
        ep: usize,
        buf: *const u8,
        len: usize,
        desc: usize,
        dest: u64,
        raddr: u64,
        key: u64,
        notify: Option<u32>,
        token: u64,
    ) -> Result<bool>;
    /// Whether [`Fabric::write`] takes a notification (verbs: write with immediate; libfabric:
    /// remote CQ data).
    fn notify_writes(&self) -> bool {
        false
    }
    /// Send a message; `Ok(false)`: retry after progress.
    ///
    /// # Safety
    /// As for [`Fabric::write`].
    unsafe fn send(&self, ep: usize, buf: *const u8, len: usize, desc: usize, dest: u64, token: u64) -> Result<bool>;
    /// Post a receive buffer; `Ok(false)`: retry after progress.
    ///
    /// # Safety
    /// The buffer stays allocated until its completion.
    unsafe fn post_recv(&self, ep: usize, buf: *mut u8, len: usize, desc: usize, token: u64) -> Result<bool>;
    /// Drive progress and collect completions.
    fn poll(&self, out: &mut Vec<Completion>) -> Result<()>;
    /// The completion queue's file descriptor.
    fn wait_fd(&self) -> i32;
    /// Whether sleeping on [`Fabric::wait_fd`] is safe now (nothing pending inside the provider).
    fn try_wait(&self) -> bool;
}
