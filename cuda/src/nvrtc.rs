//! Run-time compilation of the kernels with NVRTC, and the probe that finds NVRTC.

use crate::kernels;
use oxccl::{Error, ErrorKind, Result};
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// Whether NVRTC can be loaded (probed once; never panics). A library found by an explicit
/// path is loaded with `RTLD_GLOBAL`, so the by-name lookup of the bindings finds it by SONAME.
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // besides the loader's search path ([`oxccl::Config::nvrtc_paths`])
        for p in oxccl::Config::from_env().nvrtc_paths {
            let Ok(c) = CString::new(p) else { continue };
            // SAFETY: dlopen with a NUL-terminated path; the handle is kept for the process's life.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            if !h.is_null() {
                break;
            }
        }
        // SAFETY: is_culib_present only tries to dlopen the candidate names.
        std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false)
    })
}

fn check(r: cudarc::nvrtc::sys::nvrtcResult, what: &str) -> Result<()> {
    if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::UnhandledCuda, format!("NVRTC {what} failed: {r:?}")))
    }
}

/// What a compilation produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// PTX (always) or a cubin (when `arch` is a real `sm_XX`).
    pub image: Vec<u8>,
    /// NVRTC's log (warnings).
    pub log: String,
}

/// NVRTC's version (major, minor).
pub fn version() -> Result<(i32, i32)> {
    if !available() {
        return Err(unavailable());
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: two valid out-pointers.
    check(unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) }, "nvrtcVersion")?;
    Ok((a, b))
}

pub(crate) fn unavailable() -> Error {
    Error::new(
        ErrorKind::Unavailable,
        "NVRTC (libnvrtc.so) is not installed or not on the loader path; set OXCCL_NVRTC to its file, \
         or rely on the embedded PTX",
    )
}

/// Compile [`kernels::source`] for `arch` (`compute_80` gives PTX, `sm_90` a cubin).
pub fn compile(arch: &str) -> Result<Compiled> {
    use cudarc::nvrtc::sys as n;
    if !available() {
        return Err(unavailable());
    }
    let src = CString::new(kernels::source()).expect("generated source has no NUL");
    let name = c"oxccl_kernels.cu";
    let opts: Vec<CString> = kernels::nvrtc_options(arch).into_iter().map(|o| CString::new(o).unwrap()).collect();
    let opt_ptrs: Vec<*const libc::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: n::nvrtcProgram = std::ptr::null_mut();
    check(
        // SAFETY: NUL-terminated source and name, no headers; `prog` receives the program.
        unsafe { n::nvrtcCreateProgram(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()) },
        "nvrtcCreateProgram",
    )?;
    struct Prog(n::nvrtcProgram);
    impl Drop for Prog {
        fn drop(&mut self) {
            // SAFETY: the program was created above and is destroyed once.
            unsafe { n::nvrtcDestroyProgram(&mut self.0) };
        }
    }
    let prog = Prog(prog);
    // SAFETY: the option pointers outlive the call.
    let r = unsafe { n::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    let mut log_size = 0usize;
    // SAFETY: valid program and out-pointer.
    check(unsafe { n::nvrtcGetProgramLogSize(prog.0, &mut log_size) }, "nvrtcGetProgramLogSize")?;
    let mut log = vec![0u8; log_size.max(1)];
    // SAFETY: the buffer holds log_size bytes.
    check(unsafe { n::nvrtcGetProgramLog(prog.0, log.as_mut_ptr().cast()) }, "nvrtcGetProgramLog")?;
    let log = CStr::from_bytes_until_nul(&log).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    if r != n::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::new(
            ErrorKind::Internal,
            format!("NVRTC could not compile the kernels for {arch} ({r:?}):\n{log}"),
        ));
    }
    let cubin = arch.starts_with("sm_");
    let mut size = 0usize;
    let image = if cubin {
        // SAFETY: valid program and out-pointer; then a buffer of that size.
        check(unsafe { n::nvrtcGetCUBINSize(prog.0, &mut size) }, "nvrtcGetCUBINSize")?;
        let mut v = vec![0u8; size];
        // SAFETY: as above.
        check(unsafe { n::nvrtcGetCUBIN(prog.0, v.as_mut_ptr().cast()) }, "nvrtcGetCUBIN")?;
        v
    } else {
        // SAFETY: valid program and out-pointer; then a buffer of that size.
        check(unsafe { n::nvrtcGetPTXSize(prog.0, &mut size) }, "nvrtcGetPTXSize")?;
        let mut v = vec![0u8; size];
        // SAFETY: as above.
        check(unsafe { n::nvrtcGetPTX(prog.0, v.as_mut_ptr().cast()) }, "nvrtcGetPTX")?;
        while v.last() == Some(&0) {
            v.pop();
        }
        v
    };
    Ok(Compiled { image, log })
}
