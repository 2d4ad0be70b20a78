//! Communicator handles: the table of live communicators behind `ncclComm_t`.

use super::*;
use oxccl::OpMem;
use oxccl::{Communicator, DataType, Error, ErrorKind, Request};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

// ---- communicators ----------------------------------------------------------------------------

/// A user-created reduction op (`ncclRedOpCreatePreMulSum`).
#[derive(Clone, Copy)]
pub(crate) enum Scalar {
    /// Read when the op was created (`ncclScalarHostImmediate`).
    Value([u8; 8]),
    /// Read at each use (`ncclScalarDevice`, here a host pointer the caller keeps alive).
    Pointer(usize),
}

pub(crate) struct Entry {
    pub(crate) comm: OnceLock<Arc<Communicator>>,
    /// The device executor, created by the first call with device buffers.
    pub(crate) dev: Mutex<Option<Arc<device::DeviceComm>>>,
    pub(crate) init_error: Mutex<Option<Error>>,
    pub(crate) blocking: bool,
    pub(crate) device: c_int,
    pub(crate) ops: Mutex<Vec<Option<(DataType, Scalar)>>>,
    pub(crate) requests: Mutex<Vec<Request<OpMem<'static>>>>,
    pub(crate) async_error: Mutex<Option<Error>>,
    /// The fork generation that made it: a `fork` child cannot use its parent's communicators.
    pub(crate) generation: u64,
}

impl Entry {
    pub(crate) fn new(blocking: bool, device: c_int) -> Arc<Entry> {
        Arc::new(Entry {
            comm: OnceLock::new(),
            dev: Mutex::new(None),
            init_error: Mutex::new(None),
            blocking,
            device,
            ops: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            async_error: Mutex::new(None),
            generation: oxccl::fork_generation(),
        })
    }

    pub(crate) fn ready(&self) -> Result<&Communicator, Error> {
        match self.comm.get() {
            Some(c) => Ok(c.as_ref()),
            None => match &*self.init_error.lock().unwrap() {
                Some(e) => Err(e.clone()),
                None => Err(Error::new(ErrorKind::InProgress, "the communicator is still initializing")),
            },
        }
    }

    /// Finish what completed among the non-blocking operations; `true` while some still run.
    pub(crate) fn poll_requests(&self) -> bool {
        let mut reqs = self.requests.lock().unwrap();
        let mut still = Vec::new();
        for mut r in reqs.drain(..) {
            if r.test() {
                if let Err(e) = r.wait() {
                    self.async_error.lock().unwrap().get_or_insert(e);
                }
            } else {
                still.push(r);
            }
        }
        *reqs = still;
        !reqs.is_empty()
    }

    pub(crate) fn wait_requests(&self) {
        let reqs: Vec<_> = self.requests.lock().unwrap().drain(..).collect();
        for r in reqs {
            if let Err(e) = r.wait() {
                self.async_error.lock().unwrap().get_or_insert(e);
            }
        }
        self.drain_device();
    }

    /// Wait for the device operations enqueued earlier (host calls are ordered after them).
    pub(crate) fn drain_device(&self) {
        let dev = self.dev.lock().unwrap().clone();
        if let Some(d) = dev {
            d.drain();
        }
    }

    /// The device executor for buffers on GPU `ordinal` (created on first use).
    pub(crate) fn device_comm(&self, ordinal: i32) -> Result<Arc<device::DeviceComm>, Error> {
        let mut dev = self.dev.lock().unwrap();
        if let Some(d) = &*dev {
            return Ok(d.clone());
        }
        let comm = self
            .comm
            .get()
            .ok_or_else(|| Error::new(ErrorKind::InProgress, "the communicator is still initializing"))?;
        let d = Arc::new(device::DeviceComm::new(Arc::new(comm.clone()), ordinal)?);
        *dev = Some(d.clone());
        Ok(d)
    }

    /// The first asynchronous error of the device executor, if any.
    pub(crate) fn device_error(&self) -> Option<Error> {
        self.dev.lock().unwrap().as_ref().and_then(|d| d.error())
    }
}

pub(crate) static COMMS: Mutex<BTreeMap<usize, Arc<Entry>>> = Mutex::new(BTreeMap::new());
pub(crate) static NEXT_HANDLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// A fresh handle: never dereferenced, never reused, so a destroyed one is always recognised.
pub(crate) fn register(e: Arc<Entry>) -> ncclComm_t {
    let id = NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let h = 0x0CC1_0000_0000usize + id * 16;
    COMMS.lock().unwrap().insert(h, e);
    h as ncclComm_t
}

pub(crate) fn entry(h: ncclComm_t) -> Result<Arc<Entry>, Error> {
    if h.is_null() {
        return Err(arg("comm is NULL"));
    }
    let e =
        COMMS.lock().unwrap().get(&(h as usize)).cloned().ok_or_else(|| {
            arg(format!("{h:p} is not a communicator (never created, or already destroyed or aborted)"))
        })?;
    if e.generation != oxccl::fork_generation() {
        return Err(Error::invalid_usage(format!(
            "communicator {h:p} was created in the parent process before fork(): a child cannot use it \
             (create communicators after fork; destroying it here only releases the child's copy)"
        )));
    }
    Ok(e)
}

/// Release a communicator this process inherited through `fork` without touching it (its
/// connections are the parent's too); `true` if `h` was one.
pub(crate) fn release_inherited(h: ncclComm_t) -> bool {
    let mut comms = COMMS.lock().unwrap();
    match comms.get(&(h as usize)) {
        Some(e) if e.generation != oxccl::fork_generation() => {
            std::mem::forget(comms.remove(&(h as usize)));
            true
        }
        _ => false,
    }
}

pub(crate) fn unregister(h: ncclComm_t) -> Option<Arc<Entry>> {
    COMMS.lock().unwrap().remove(&(h as usize))
}
