//! Modules and kernel launches: `cuModuleLoadData` accepts an image that holds oxccl's kernels
//! (PTX or a cubin), and each kernel name maps to the host build of the same generated source.
//! A launch copies its argument at the call (as CUDA does) and runs on the stream's worker, with
//! every pointer it uses checked against the allocations and translated to their shadows.

use crate::{
    mem, Fail, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND,
};

include!(concat!(env!("OUT_DIR"), "/kernel_table.rs"));

/// The kernels' one argument (`struct OxArgs`, 168 bytes), as oxccl-cuda's `KernelArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OxArgs {
    pub inputs: [u64; 8],
    pub outputs: [u64; 8],
    pub n: u64,
    pub scalar: u64,
    pub nin: u32,
    pub nout: u32,
    pub post: u32,
    pub pad: u32,
}

/// Whether a module image holds oxccl's kernels: a NUL-terminated PTX text, or an ELF cubin
/// (its length from the section header table), naming `oxccl_copy`.
///
/// # Safety
/// `image` points to a module image (CUDA's contract for `cuModuleLoadData`).
pub unsafe fn image_has_kernels(image: *const u8) -> Result<(), Fail> {
    if image.is_null() {
        return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: the image is NULL"));
    }
    // SAFETY: an image starts with at least 64 bytes (an ELF header, or PTX text we stop reading
    // at its NUL).
    let head = unsafe { std::slice::from_raw_parts(image, 4) };
    let len = if head == b"\x7fELF" {
        // SAFETY: a 64-bit ELF header: e_shoff at 40 (8 bytes), e_shentsize at 58, e_shnum at 60.
        unsafe {
            let h = std::slice::from_raw_parts(image, 64);
            let shoff = u64::from_le_bytes(h[40..48].try_into().unwrap()) as usize;
            let ent = u16::from_le_bytes(h[58..60].try_into().unwrap()) as usize;
            let num = u16::from_le_bytes(h[60..62].try_into().unwrap()) as usize;
            shoff + ent * num
        }
    } else {
        // SAFETY: PTX is a NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(image.cast()) }.to_bytes().len()
    };
    // SAFETY: the image's own length, computed above.
    let bytes = unsafe { std::slice::from_raw_parts(image, len) };
    if !bytes.windows(10).any(|w| w == b"oxccl_copy") {
        return Err(Fail::new(
            CUDA_ERROR_INVALID_IMAGE,
            "cuModuleLoadData: the simulated driver runs only oxccl's kernels, and this image has none",
        ));
    }
    Ok(())
}

/// The kernel of `name`, as an index of [`TABLE`].
pub fn find(name: &str) -> Result<usize, Fail> {
    TABLE.iter().position(|(n, _, _)| *n == name).ok_or_else(|| {
        Fail::new(CUDA_ERROR_NOT_FOUND, format!("cuModuleGetFunction: no kernel {name:?} in oxccl's kernels"))
    })
}

/// Run kernel `k` on `args` now (on a stream worker): every used pointer must cover its bytes
/// inside one allocation; they are translated to the shadows the kernel then reads and writes.
pub fn run(k: usize, mut args: OxArgs) -> Result<(), Fail> {
    let (name, f, es) = TABLE[k];
    if args.nin == 0 || args.nin > 8 || args.nout == 0 || args.nout > 8 {
        return Err(Fail::new(
            CUDA_ERROR_INVALID_VALUE,
            format!("{name}: nin {} and nout {} must be in 1..=8", args.nin, args.nout),
        ));
    }
    let bytes =
        (args.n as usize).checked_mul(es).ok_or_else(|| Fail::new(CUDA_ERROR_INVALID_VALUE, "size overflow"))?;
    let illegal = |e: Fail| Fail::new(CUDA_ERROR_ILLEGAL_ADDRESS, format!("{name}: {}", e.message));
    for p in args.inputs.iter_mut().take(args.nin as usize) {
        *p = mem::shadow(*p, bytes, "kernel input").map_err(illegal)? as u64;
    }
    for p in args.outputs.iter_mut().take(args.nout as usize) {
        *p = mem::shadow(*p, bytes, "kernel output").map_err(illegal)? as u64;
    }
    // SAFETY: the host build of the generated kernel, called with pointers that each cover
    // `n` elements of shadow memory (checked above); with one host thread its grid-stride loop
    // covers every element.
    unsafe { f(args) };
    Ok(())
}
