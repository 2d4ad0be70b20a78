//! The libfabric backend: one RDM endpoint per transport instance (`tcp;ofi_rxm` here; EFA,
//! CXI/Slingshot, verbs;ofi_rxm on clusters), through the C shim in `csrc/ofi_shim.c`.

#[cfg_attr(not(oxccl_ofi), allow(unused_imports))]
use crate::{Completion, Fabric, Region};
use oxccl_transport::{Error, ErrorKind, Result};
use std::ffi::{c_char, c_void, CStr, CString};

#[cfg(oxccl_ofi)]
mod sys {
    use std::ffi::{c_char, c_int, c_void};

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Cqe {
        pub ctx: *mut c_void,
        pub flags: u64,
        pub len: u64,
        pub err: i32,
        pub prov_errno: i32,
        pub data: u64,
    }

    extern "C" {
        pub fn oxf_create(
            provider: *const c_char,
            node: *const c_char,
            neps: c_int,
            err: *mut c_char,
            errlen: usize,
        ) -> *mut c_void;
        pub fn oxf_destroy(c: *mut c_void);
        pub fn oxf_strerror(e: c_int) -> *const c_char;
        pub fn oxf_provider(c: *mut c_void) -> *const c_char;
        pub fn oxf_domain(c: *mut c_void) -> *const c_char;
        pub fn oxf_virt_addr(c: *mut c_void) -> c_int;
        pub fn oxf_wait_fd(c: *mut c_void) -> c_int;
        pub fn oxf_getname(c: *mut c_void, ep: c_int, buf: *mut c_void, len: *mut usize) -> c_int;
        pub fn oxf_av_insert(c: *mut c_void, addr: *const c_void, out: *mut u64) -> c_int;
        pub fn oxf_mr_reg(
            c: *mut c_void,
            buf: *mut c_void,
            len: usize,
            mr: *mut *mut c_void,
            desc: *mut *mut c_void,
            key: *mut u64,
        ) -> c_int;
        pub fn oxf_mr_close(mr: *mut c_void);
        pub fn oxf_write(
            c: *mut c_void,
            ep: c_int,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest: u64,
            raddr: u64,
            key: u64,
            ctx: *mut c_void,
        ) -> isize;
        pub fn oxf_write_data(
            c: *mut c_void,
            ep: c_int,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            data: u64,
            dest: u64,
            raddr: u64,
            key: u64,
            ctx: *mut c_void,
        ) -> isize;
        pub fn oxf_cq_data_size(c: *mut c_void) -> usize;
        pub fn oxf_flag_remote_cq_data() -> u64;
        pub fn oxf_send(
            c: *mut c_void,
            ep: c_int,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest: u64,
            ctx: *mut c_void,
        ) -> isize;
        pub fn oxf_recv(
            c: *mut c_void,
            ep: c_int,
            buf: *mut c_void,
            len: usize,
            desc: *mut c_void,
            ctx: *mut c_void,
        ) -> isize;
        pub fn oxf_cq_read(c: *mut c_void, out: *mut Cqe, n: usize) -> isize;
        pub fn oxf_trywait(c: *mut c_void) -> c_int;
        pub fn oxf_eagain() -> c_int;
    }
}

/// A libfabric endpoint, its domain, address vector and completion queue. (Without the
/// headers only `open`'s refusal is built: nothing reads the fields.)
#[cfg_attr(not(oxccl_ofi), allow(dead_code))]
pub struct Ofi {
    ctx: *mut c_void,
    provider: String,
    domain: String,
    virt_addr: bool,
    wait_fd: i32,
    endpoints: usize,
}

// SAFETY: the endpoint is opened with FI_THREAD_SAFE; the context pointer is only freed by Drop.
unsafe impl Send for Ofi {}
// SAFETY: as above.
unsafe impl Sync for Ofi {}

#[cfg_attr(not(oxccl_ofi), allow(dead_code))]
fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NUL-terminated strings owned by the shim for the context's life.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Ofi {
    /// Open an RDM endpoint of `provider` (NULL-like empty: any) bound to the local address
    /// `node`. `Unavailable` when libfabric (or its headers at build time) is missing or no
    /// provider offers RDM with RMA.
    pub fn open(provider: &str, node: Option<&str>, endpoints: usize) -> Result<Ofi> {
        #[cfg(not(oxccl_ofi))]
        {
            let _ = (provider, node, endpoints, CString::new(""));
            Err(Error::new(
                ErrorKind::Unavailable,
                "oxccl was built without libfabric's headers (install libfabric-dev and rebuild)",
            ))
        }
        #[cfg(oxccl_ofi)]
        {
            let prov = CString::new(provider).map_err(|_| Error::invalid_argument("provider name has a NUL byte"))?;
            let node_c = node.map(CString::new).transpose().map_err(|_| Error::invalid_argument("node has a NUL"))?;
            let mut err = vec![0 as c_char; 512];
            // SAFETY: NUL-terminated strings (or NULL) and an error buffer of its stated size.
            let ctx = unsafe {
                sys::oxf_create(
                    if provider.is_empty() { std::ptr::null() } else { prov.as_ptr() },
                    node_c.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
                    endpoints as i32,
                    err.as_mut_ptr(),
                    err.len(),
                )
            };
            if ctx.is_null() {
                return Err(Error::new(ErrorKind::Unavailable, format!("libfabric: {}", cstr(err.as_ptr()))));
            }
            // SAFETY: a live context (all the accessors below).
            let (provider, domain, virt_addr, wait_fd) = unsafe {
                (
                    cstr(sys::oxf_provider(ctx)),
                    cstr(sys::oxf_domain(ctx)),
                    sys::oxf_virt_addr(ctx) != 0,
                    sys::oxf_wait_fd(ctx),
                )
            };
            Ok(Ofi { ctx, provider, domain, virt_addr, wait_fd, endpoints })
        }
    }

    #[cfg(oxccl_ofi)]
    fn fail(&self, what: &str, r: isize) -> Error {
        // SAFETY: fi_strerror returns a static string.
        let s = cstr(unsafe { sys::oxf_strerror(r as i32) });
        Error::new(ErrorKind::System, format!("libfabric {what} on {} ({}): {s} ({r})", self.domain, self.provider))
    }

    /// Post with `f`; `Ok(false)` when the provider asks to retry after progress (EAGAIN).
    #[cfg(oxccl_ofi)]
    fn posted(&self, what: &str, r: isize) -> Result<bool> {
        // SAFETY: returns a constant.
        if r == unsafe { sys::oxf_eagain() } as isize {
            Ok(false)
        } else if r < 0 {
            Err(self.fail(what, r))
        } else {
            Ok(true)
        }
    }
}

impl Drop for Ofi {
    fn drop(&mut self) {
        #[cfg(oxccl_ofi)]
        // SAFETY: the context is destroyed once; registrations were closed by their owners.
        unsafe {
            sys::oxf_destroy(self.ctx)
        };
    }
}

#[cfg(oxccl_ofi)]
impl Fabric for Ofi {
    fn provider(&self) -> &str {
        &self.provider
    }
    fn device(&self) -> &str {
        &self.domain
    }
    fn endpoints(&self) -> usize {
        self.endpoints
    }
    fn address(&self, ep: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: a buffer of `len` bytes; ep < endpoints (the protocol's invariant).
        let r = unsafe { sys::oxf_getname(self.ctx, ep as i32, buf.as_mut_ptr().cast(), &mut len) };
        if r != 0 {
            return Err(self.fail("fi_getname", r as isize));
        }
        buf.truncate(len);
        Ok(buf)
    }
    fn insert_peer(&self, addr: &[u8]) -> Result<u64> {
        let mut out = 0u64;
        // SAFETY: an address of the provider's format (it came from a peer's fi_getname; a
        // malformed one is refused by the provider).
        let r = unsafe { sys::oxf_av_insert(self.ctx, addr.as_ptr().cast(), &mut out) };
        if r != 0 {
            return Err(self.fail("fi_av_insert", r as isize));
        }
        Ok(out)
    }
    unsafe fn register(&self, buf: *mut u8, len: usize) -> Result<Region> {
        let (mut mr, mut desc, mut key) = (std::ptr::null_mut(), std::ptr::null_mut(), 0u64);
        // SAFETY: the caller keeps [buf, buf+len) alive until the region is closed.
        let r = unsafe { sys::oxf_mr_reg(self.ctx, buf.cast(), len, &mut mr, &mut desc, &mut key) };
        if r != 0 {
            return Err(self.fail("fi_mr_reg", r as isize));
        }
        Ok(Region {
            handle: mr as usize,
            desc: desc as usize,
            key,
            remote_base: if self.virt_addr { buf as u64 } else { 0 },
        })
    }
    fn deregister(&self, r: &Region) {
        // SAFETY: a registration made by `register`, closed once by its owner.
        unsafe { sys::oxf_mr_close(r.handle as *mut c_void) };
    }
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
    ) -> Result<bool> {
        let (buf, desc, ctx) = (buf.cast(), desc as *mut c_void, token as *mut c_void);
        // SAFETY: the caller keeps the buffer until the completion of `token`; ep < endpoints.
        let r = unsafe {
            match notify {
                None => sys::oxf_write(self.ctx, ep as i32, buf, len, desc, dest, raddr, key, ctx),
                // with remote CQ data: the target's completion carries the notification
                Some(data) => {
                    sys::oxf_write_data(self.ctx, ep as i32, buf, len, desc, data as u64, dest, raddr, key, ctx)
                }
            }
        };
        self.posted(if notify.is_some() { "fi_writedata" } else { "fi_write" }, r)
    }
    fn notify_writes(&self) -> bool {
        // SAFETY: a live context.
        unsafe { sys::oxf_cq_data_size(self.ctx) >= 4 }
    }
    unsafe fn send(&self, ep: usize, buf: *const u8, len: usize, desc: usize, dest: u64, token: u64) -> Result<bool> {
        // SAFETY: as for write.
        let r = unsafe {
            sys::oxf_send(self.ctx, ep as i32, buf.cast(), len, desc as *mut c_void, dest, token as *mut c_void)
        };
        self.posted("fi_send", r)
    }
    unsafe fn post_recv(&self, ep: usize, buf: *mut u8, len: usize, desc: usize, token: u64) -> Result<bool> {
        // SAFETY: as for write.
        let r =
            unsafe { sys::oxf_recv(self.ctx, ep as i32, buf.cast(), len, desc as *mut c_void, token as *mut c_void) };
        self.posted("fi_recv", r)
    }
    fn poll(&self, out: &mut Vec<Completion>) -> Result<()> {
        let mut e = [sys::Cqe { ctx: std::ptr::null_mut(), flags: 0, len: 0, err: 0, prov_errno: 0, data: 0 }; 16];
        // SAFETY: returns a constant.
        let remote_data = unsafe { sys::oxf_flag_remote_cq_data() };
        loop {
            // SAFETY: an array of 16 entries.
            let n = unsafe { sys::oxf_cq_read(self.ctx, e.as_mut_ptr(), e.len()) };
            if n < 0 {
                return Err(self.fail("fi_cq_read", n));
            }
            for c in &e[..n as usize] {
                let status = (c.err != 0).then(|| {
                    // SAFETY: a static string.
                    let s = cstr(unsafe { sys::oxf_strerror(c.err) });
                    format!("{s} (provider errno {})", c.prov_errno)
                });
                // a write with remote CQ data that landed here consumes no receive (no token)
                let data = (c.err == 0 && c.flags & remote_data != 0).then_some(c.data as u32);
                out.push(Completion { token: c.ctx as u64, len: c.len as usize, error: status, data });
            }
            if (n as usize) < e.len() {
                return Ok(());
            }
        }
    }
    fn wait_fd(&self) -> i32 {
        self.wait_fd
    }
    fn try_wait(&self) -> bool {
        // SAFETY: a live context.
        unsafe { sys::oxf_trywait(self.ctx) == 0 }
    }
}
