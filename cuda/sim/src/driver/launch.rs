//! Modules and kernel launches: the one module every accepted image becomes, and its kernels.

use super::*;

/// The one module handle (every accepted image holds the same kernels).
const MODULE: usize = 0x0DD1_0000;

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut usize, image: *const c_void) -> CUresult {
    entry("cuModuleLoadData", || {
        current()?;
        // SAFETY: CUDA's contract: a module image.
        unsafe { kernels::image_has_kernels(image.cast())? };
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(m, MODULE, "module") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(m: usize) -> CUresult {
    entry("cuModuleUnload", || {
        if m == MODULE {
            Ok(())
        } else {
            Err(Fail::new(CUDA_ERROR_INVALID_HANDLE, "not a module"))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(f: *mut usize, m: usize, name: *const c_char) -> CUresult {
    entry("cuModuleGetFunction", || {
        if m != MODULE {
            return Err(Fail::new(CUDA_ERROR_INVALID_HANDLE, format!("{m:#x} is not a loaded module")));
        }
        if name.is_null() {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "the kernel name is NULL"));
        }
        // SAFETY: CUDA's contract: a NUL-terminated name.
        let n = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
        let k = kernels::find(&n)?;
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(f, 0x0F00_0000 + k, "function") }
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)] // CUDA's signature
pub unsafe extern "C" fn cuLaunchKernel(
    f: usize,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared: c_uint,
    s: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernel", || {
        current()?;
        let k = f.checked_sub(0x0F00_0000).filter(|k| *k < kernels::TABLE.len()).ok_or_else(|| {
            Fail::new(CUDA_ERROR_INVALID_HANDLE, format!("{f:#x} is not a kernel of the loaded module"))
        })?;
        if gx == 0
            || gy == 0
            || gz == 0
            || bx == 0
            || by == 0
            || bz == 0
            || (bx as u64) * (by as u64) * (bz as u64) > 1024
        {
            return Err(Fail::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("launch configuration {gx}x{gy}x{gz} blocks of {bx}x{by}x{bz}"),
            ));
        }
        if params.is_null() || !extra.is_null() {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "oxccl's kernels take their argument in kernelParams"));
        }
        // SAFETY: CUDA's contract: params[0] points to the kernel's one argument, a struct
        // OxArgs, copied now (a launch captures its arguments).
        let args = unsafe { (*params).cast::<kernels::OxArgs>().read_unaligned() };
        if stream::get(s)?.capturing() {
            return Err(Fail::new(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "launch into a stream being captured"));
        }
        stream::get(s)?.push(Box::new(move || kernels::run(k, args)));
        Ok(())
    })
}
