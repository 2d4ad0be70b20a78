//! The device (CUDA) side of the C ABI: oxccl-cuda with the `cuda` feature. Without it, every
//! buffer is host memory, and what needs CUDA (a stream to wait for, a device executor) is a
//! clean `Unavailable` that names the feature.

#[cfg(feature = "cuda")]
pub(crate) use oxccl_cuda::{classify, driver::sync_user_stream, DevMem, DeviceComm, Memory, UserStream};

#[cfg(not(feature = "cuda"))]
pub(crate) use host_only::*;

// the shapes mirror oxccl-cuda's; without CUDA nothing reads them
#[cfg(not(feature = "cuda"))]
#[allow(dead_code)]
mod host_only {
    use oxccl::{CallOptions, Error, ErrorKind, OpDesc, Result};

    fn unavailable(what: &str) -> Error {
        Error::new(ErrorKind::Unavailable, format!("{what}: this libnccl was built without the `cuda` feature"))
    }

    /// An operation's device buffers (as oxccl-cuda's).
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum DevMem {
        Split { send: u64, send_len: usize, recv: u64, recv_len: usize },
        InPlace { base: u64, len: usize, in_off: usize, out_off: usize },
    }

    /// Where a pointer lives (as oxccl-cuda's).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Memory {
        Device(i32),
        Host,
    }

    /// Without CUDA every pointer is host memory.
    pub(crate) fn classify(_ptr: u64) -> Memory {
        Memory::Host
    }

    /// A caller's stream.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct UserStream(pub usize);

    /// A stream cannot be waited for without CUDA.
    ///
    /// # Safety
    /// None needed: nothing is dereferenced.
    pub(crate) unsafe fn sync_user_stream(_stream: *mut std::ffi::c_void) -> Result<()> {
        Err(unavailable("waiting for a CUDA stream"))
    }

    /// No device executor exists without CUDA: [`DeviceComm::new`] always refuses.
    pub(crate) enum DeviceComm {}

    impl DeviceComm {
        pub(crate) fn new<T>(_host: T, _ordinal: i32) -> Result<DeviceComm> {
            Err(unavailable("device buffers"))
        }
        pub(crate) fn drain(&self) {
            match *self {}
        }
        pub(crate) fn error(&self) -> Option<Error> {
            match *self {}
        }
        /// # Safety
        /// Never called: no value of this type exists.
        pub(crate) unsafe fn enqueue_with(
            &self,
            _ops: Vec<(OpDesc, CallOptions, DevMem)>,
            _stream: UserStream,
        ) -> Result<()> {
            match *self {}
        }
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_device_buffers_and_streams_are_a_clean_unavailable() {
        // (the last error is per process: tests that record errors take turns)
        let _g = crate::last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let Err(e) = DeviceComm::new((), 0);
        assert_eq!(e.kind, oxccl::ErrorKind::Unavailable);
        assert!(e.message.contains("without the `cuda` feature"), "{e}");
        // SAFETY: nothing is dereferenced.
        let e = unsafe { sync_user_stream(std::ptr::null_mut()) }.unwrap_err();
        assert_eq!(e.kind, oxccl::ErrorKind::Unavailable);
        assert_eq!(classify(0x1000), Memory::Host);
    }
}
