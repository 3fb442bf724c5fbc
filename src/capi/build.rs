//! Links the `softroce-rdma` target as the shared object programs load as `libibverbs.so.1`
//! and `librdmacm.so.1`, with rdma-core's symbol versions, and puts both names beside it.

use std::path::{Path, PathBuf};

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let bin = "softroce-rdma";
    // -z nodelete: the library stays when a program dlclose()s it: its threads, its exit and
    // fork handlers and its fault handler (`softroce::memory::ForeignMemory`) outlive any use.
    for arg in [
        "-shared".to_string(),
        "-Wl,-z,nodelete".to_string(),
        "-Wl,-soname,libibverbs.so.1".to_string(),
        format!("-Wl,--version-script={dir}/rdma.map"),
    ] {
        println!("cargo:rustc-link-arg-bin={bin}={arg}");
    }
    println!("cargo:rerun-if-changed=rdma.map");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is <profile>/build/<package>-<hash>/out: the library lands in <profile>.
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Some(profile) = out.ancestors().nth(3) {
        link_names(profile, bin);
    }
}

/// `<profile>/rdma/libibverbs.so.1` and `librdmacm.so.1`, each a link to `../<bin>`, so that
/// `LD_LIBRARY_PATH=<profile>/rdma` loads softroce under both names. The link is made before
/// the library is linked, and points at it once it is.
fn link_names(profile: &Path, bin: &str) {
    let dir = profile.join("rdma");
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        let link = dir.join(name);
        let target = Path::new("..").join(bin);
        if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            let _ = std::fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink(&target, &link);
        }
    }
}
