//! `softroce run -- PROGRAM ARGS...`: an unmodified RDMA program over softroce's C library,
//! with no root and no kernel module. It finds `libibverbs.so.1` and `librdmacm.so.1` beside
//! this executable (cargo builds them there, as `rdma/`), puts that directory first on
//! `LD_LIBRARY_PATH`, names the program's device address, and becomes the program.

use std::ffi::OsString;
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use crate::tools::device_view;
use crate::transport::PathMtu;
use crate::verbs::{
    C_ADDR_VAR, C_BUSY_POLL_VAR, C_CC_VAR, C_MTU_VAR, C_PROGRESS_VAR, C_TRAINS_PER_QP_VAR,
};

/// Where the C library is: `rdma/` beside this executable, as cargo lays out its target
/// directory.
pub fn lib_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe
        .parent()
        .map(|d| d.join("rdma"))
        .ok_or("this executable has no directory")?;
    if !dir.join("libibverbs.so.1").exists() || !dir.join("librdmacm.so.1").exists() {
        return Err(format!(
            "{} holds no libibverbs.so.1 and librdmacm.so.1: build them with `cargo build{}` \
             (the softroce-rdma target)",
            dir.display(),
            if cfg!(debug_assertions) {
                ""
            } else {
                " --release"
            }
        ));
    }
    Ok(dir)
}

/// How `softroce run` sets up the program's devices; `None` leaves the C library's default.
#[derive(Debug, Default)]
pub struct RunOptions<'a> {
    /// The device addresses (default 127.0.0.1).
    pub addrs: &'a [IpAddr],
    /// Who runs each device's engine (default `hybrid`).
    pub progress: Option<&'a str>,
    /// The ports' active MTU (default: the link's, by rxe's rule).
    pub mtu: Option<PathMtu>,
    /// Congestion control settings, as `CongestionConfig`'s `FromStr` reads them (default:
    /// on).
    pub congestion: Option<&'a str>,
    /// The engines' busy polling, in microseconds (default: softroce's choice).
    pub busy_poll_us: Option<u64>,
    /// Cut segmentation trains per QP (default: across QPs).
    pub trains_per_qp: bool,
    /// Give the program `/dev/infiniband` nodes for its devices, in a mount namespace of its
    /// own, where the host has none ([`device_view`]).
    pub device_nodes: bool,
}

/// Runs `program` with `args` over softroce, its devices as `options` say. Returns only if the
/// program could not be started, with why.
pub fn exec(options: &RunOptions<'_>, program: &OsString, args: &[OsString]) -> String {
    let dir = match lib_dir() {
        Ok(dir) => dir,
        Err(why) => return why,
    };
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut command = Command::new(program);
    command.args(args).env("LD_LIBRARY_PATH", path);
    if !options.addrs.is_empty() {
        let list: Vec<String> = options.addrs.iter().map(IpAddr::to_string).collect();
        command.env(C_ADDR_VAR, list.join(","));
    }
    if let Some(progress) = options.progress {
        command.env(C_PROGRESS_VAR, progress);
    }
    if let Some(mtu) = options.mtu {
        command.env(C_MTU_VAR, mtu.bytes().to_string());
    }
    if let Some(settings) = options.congestion {
        command.env(C_CC_VAR, settings);
    }
    if let Some(micros) = options.busy_poll_us {
        command.env(C_BUSY_POLL_VAR, micros.to_string());
    }
    if options.trains_per_qp {
        command.env(C_TRAINS_PER_QP_VAR, "1");
    }
    if options.device_nodes {
        match device_view::give_device_nodes(options.addrs.len().max(1)) {
            Ok(_) => {}
            Err(why) if why.fatal => return format!("cannot give the program its /dev: {why}"),
            // Most programs never look at /dev/infiniband: run this one all the same.
            Err(why) => eprintln!(
                "softroce run: the program sees the host's /dev, with no /dev/infiniband/uverbs0 \
                 (UCX will not find the device): {why}"
            ),
        }
    }
    let error = command.exec();
    format!("cannot run {}: {error}", program.to_string_lossy())
}
