//! Link libnccl.so with NCCL's SONAME and export map, and put a `libnccl.so.2` link beside it.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let map = dir.join("libnccl.map");
    println!("cargo:rerun-if-changed=libnccl.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: the library lands in <target>/<profile>
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // The link points into deps/, where cargo always writes the cdylib: `cargo build` also copies
    // it up to <profile>/libnccl.so, but `cargo test` does not, and a link to that copy dangled
    // after a test-only build.
    if let Some(profile_dir) = out.ancestors().nth(3) {
        let link = profile_dir.join("libnccl.so.2");
        let target = std::path::Path::new("deps/libnccl.so");
        if std::fs::read_link(&link).ok().as_deref() != Some(target) {
            let _ = std::fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink(target, &link);
        }
    }
}
