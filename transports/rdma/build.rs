//! Compile the libfabric shim when libfabric-dev's headers are there (`OXCCL_OFI_INCLUDE`
//! overrides where to look); otherwise build without it (cfg `oxccl_ofi` unset).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(oxccl_ofi)");
    println!("cargo:rerun-if-changed=csrc/ofi_shim.c");
    println!("cargo:rerun-if-env-changed=OXCCL_OFI_INCLUDE");
    let inc = std::env::var("OXCCL_OFI_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
    if !std::path::Path::new(&inc).join("rdma/fabric.h").exists() {
        println!("cargo:warning=libfabric headers not found under {inc}: the libfabric backend is left out");
        return;
    }
    cc::Build::new()
        .file("csrc/ofi_shim.c")
        .include(&inc)
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .compile("oxccl_ofi_shim");
    println!("cargo:rustc-link-lib=dl");
    println!("cargo:rustc-cfg=oxccl_ofi");
}
