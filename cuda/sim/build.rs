//! Compile oxccl's generated kernels as host C++ into the simulated driver, generate the table
//! of kernel names, and link the library as `libcuda.so.1` (`cuda-sim/` beside the profile's
//! outputs holds the names a process loads: libcuda.so.1, libcuda.so, libcudart.so.12).

use std::fmt::Write;
use std::path::PathBuf;

/// Element size of a kernel's type, from its name (`oxccl_reduce_<type>_<op>`).
fn elem_size(ty: &str) -> usize {
    match ty {
        "int8" | "uint8" | "f8e4m3" | "f8e5m2" => 1,
        "half" | "bfloat16" => 2,
        "int32" | "uint32" | "float" => 4,
        "int64" | "uint64" | "double" => 8,
        other => panic!("unknown kernel type {other:?} in cuda/kernels/oxccl_kernels.cu"),
    }
}

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let src = dir.join("../kernels/oxccl_kernels.cu");
    let map = dir.join("libcuda.map");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", map.display());
    cc::Build::new()
        .cpp(true)
        .file(&src)
        .flag("-x")
        .flag("c++")
        .flag("-ffp-contract=off")
        .flag("-fno-fast-math")
        .flag("-Wno-unknown-pragmas")
        .define("OXCCL_HOST_TEST", None)
        .opt_level(2)
        .compile("oxccl_sim_kernels");
    // the kernel table
    let text = std::fs::read_to_string(&src).unwrap();
    let mut names = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("extern \"C\" OX_GLOBAL void OX_BOUNDS ") {
            names.push(rest.split('(').next().unwrap().to_string());
        }
    }
    assert!(names.len() > 10, "no kernels found in {}", src.display());
    let mut out = String::from("extern \"C\" {\n");
    for n in &names {
        writeln!(out, "    fn {n}(a: crate::kernels::OxArgs);").unwrap();
    }
    out.push_str("}\n\n/// Every kernel: name, host function, element size (1 for the byte copy).\n");
    out.push_str("pub static TABLE: &[(&str, unsafe extern \"C\" fn(crate::kernels::OxArgs), usize)] = &[\n");
    for n in &names {
        let size = match n.strip_prefix("oxccl_reduce_") {
            Some(rest) => elem_size(&rest[..rest.rfind('_').unwrap()]),
            None => 1,
        };
        writeln!(out, "    (\"{n}\", {n}, {size}),").unwrap();
    }
    out.push_str("];\n");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    std::fs::write(out_dir.join("kernel_table.rs"), out).unwrap();
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
    // <target>/<profile>/cuda-sim/: the names a process loads, all pointing at the cdylib
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let sim = profile_dir.join("cuda-sim");
        let _ = std::fs::create_dir_all(&sim);
        for name in ["libcuda.so.1", "libcuda.so", "libcudart.so.12", "libcudart.so"] {
            let link = sim.join(name);
            let target = std::path::Path::new("../deps/liboxccl_cuda_sim.so");
            if std::fs::read_link(&link).ok().as_deref() != Some(target) {
                let _ = std::fs::remove_file(&link);
                let _ = std::os::unix::fs::symlink(target, &link);
            }
        }
    }
}
