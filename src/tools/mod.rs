//! Test programs that speak to rdma-core's and perftest's tools over the wire: softroce on one
//! side, the stock tool on a kernel rxe or hardware NIC on the other.
//!
//! - [`pingpong`]: `softroce rc-pingpong`, `uc-pingpong` and `ud-pingpong`, which interoperate
//!   with rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong` in either role;
//! - [`oob`]: the pingpong tools' out-of-band address exchange over TCP;
//! - [`perftest`]: `softroce write-bw`, `read-bw`, `send-bw`, `atomic-bw`, `write-lat`,
//!   `read-lat` and `send-lat`, which interoperate with perftest's `ib_*_bw` and `ib_*_lat` in
//!   either role, with [`perftest_oob`], perftest's exchange, and [`perftest_report`], its
//!   output.
//!
//! The tools use the verbs API only, as an application would.

pub mod oob;
pub mod perftest;
pub mod perftest_oob;
pub mod perftest_report;
pub mod pingpong;

use std::fmt;
use std::io;
use std::net::IpAddr;

use crate::io::{UdpBackend, UdpConfig};
use crate::transport::WcStatus;
use crate::verbs::{self, Device};

/// Why a tool stopped.
#[derive(Debug)]
pub enum Error {
    /// An option the tool cannot honour, found before anything was set up.
    Usage(String),
    /// The out-of-band exchange failed: TCP, or a message that is not what the tool sends.
    Exchange(String),
    /// A verb failed; `doing` says which step, in rdma-core's words where it has them.
    Device { doing: String, error: verbs::Error },
    /// A completion with an error status.
    Completion { wr_id: u64, status: WcStatus },
    /// Fewer receive requests could be posted than the receive depth.
    PostRecv { posted: usize },
    /// Writing the tool's output failed.
    Output(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(why) | Error::Exchange(why) => f.write_str(why),
            Error::Device { doing, error } => write!(f, "{doing}: {error}"),
            // rdma-core's wording, with ibv_wc_status_str and the enum's value.
            Error::Completion { wr_id, status } => write!(
                f,
                "Failed status {} ({}) for wr_id {wr_id}",
                wc_status_str(*status),
                wc_status_value(*status)
            ),
            Error::PostRecv { posted } => write!(f, "Couldn't post receive ({posted})"),
            Error::Output(e) => write!(f, "writing the output: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Output(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// `ibv_wc_status_str` (libibverbs/enum_strs.c).
pub fn wc_status_str(status: WcStatus) -> &'static str {
    match status {
        WcStatus::Success => "success",
        WcStatus::LocLenErr => "local length error",
        WcStatus::LocQpOpErr => "local QP operation error",
        WcStatus::LocProtErr => "local protection error",
        WcStatus::WrFlushErr => "Work Request Flushed Error",
        WcStatus::RemInvReqErr => "remote invalid request error",
        WcStatus::RemAccessErr => "remote access error",
        WcStatus::RemOpErr => "remote operation error",
        WcStatus::RetryExcErr => "transport retry counter exceeded",
        WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
    }
}

/// The value of `enum ibv_wc_status` (libibverbs/verbs.h).
pub fn wc_status_value(status: WcStatus) -> u32 {
    match status {
        WcStatus::Success => 0,
        WcStatus::LocLenErr => 1,
        WcStatus::LocQpOpErr => 2,
        WcStatus::LocProtErr => 4,
        WcStatus::WrFlushErr => 5,
        WcStatus::RemInvReqErr => 9,
        WcStatus::RemAccessErr => 10,
        WcStatus::RemOpErr => 11,
        WcStatus::RetryExcErr => 12,
        WcStatus::RnrRetryExcErr => 13,
    }
}

/// A tool's device: a UDP backend on `address` ([`UdpConfig::segmentation`] as given) and its
/// engine thread.
fn open_device(address: IpAddr, segmentation: bool) -> Result<Device> {
    let config = UdpConfig {
        segmentation,
        ..UdpConfig::new(address)
    };
    UdpBackend::with_config(config)
        .map_err(verbs::Error::from)
        .and_then(|backend| Device::with_backend(backend, None))
        .map_err(|error| Error::Device {
            doing: format!(
                "Couldn't open a device on {address} (each device needs an address of its own: \
                 see --bind)"
            ),
            error,
        })
}
