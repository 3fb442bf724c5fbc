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
//! - [`daemon`]: `softroce daemon`, which serves those tools' clients, one after another and
//!   several at once, on one device.
//!
//! The tools use the verbs API only, as an application would.

pub mod daemon;
pub mod oob;
pub mod perftest;
pub mod perftest_oob;
pub mod perftest_report;
pub mod pingpong;

use std::cell::Cell;
use std::fmt;
use std::io;
use std::net::{IpAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};

use crate::transport::WcStatus;
use crate::verbs::{self, BackendKind, Device, DeviceConfig, Progress};

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
    /// A served session heard nothing from its peer for this long ([`Limits::idle`]).
    PeerSilent(Duration),
    /// The daemon is stopping ([`Limits::stop`]).
    Stopped,
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
            Error::PeerSilent(idle) => write!(
                f,
                "nothing from the peer for {} s: it has gone, or stalled",
                idle.as_secs_f32()
            ),
            Error::Stopped => f.write_str("stopped: the daemon is shutting down"),
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
        WcStatus::MwBindErr => "memory management operation error",
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
        WcStatus::MwBindErr => 6,
    }
}

/// How a tool opens its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The device's address (its GID). `None`: the local address of the exchange's TCP
    /// connection, which is the address the peer reaches this host at.
    pub bind: Option<IpAddr>,
    pub backend: BackendKind,
    /// Record every RoCE packet sent and received into this pcap file.
    pub pcap: Option<PathBuf>,
    /// Who drives the engine; inline only suits a tool that polls its CQ throughout.
    pub progress: Progress,
}

impl Default for DeviceOptions {
    /// The UDP backend with segmentation offload, on the exchange's address, no capture.
    fn default() -> Self {
        DeviceOptions {
            bind: None,
            backend: BackendKind::UDP,
            pcap: None,
            progress: Progress::Thread,
        }
    }
}

impl DeviceOptions {
    /// Opens the device at `address`, and its engine thread.
    pub fn open(&self, address: IpAddr) -> Result<Device> {
        Device::open(DeviceConfig {
            backend: self.backend,
            pcap: self.pcap.clone(),
            progress: self.progress,
            ..DeviceConfig::udp(address)
        })
        .map_err(|error| Error::Device {
            doing: format!(
                "Couldn't open a device on {address} (each device needs an address of its own: \
                 see --bind)"
            ),
            error,
        })
    }
}

/// What bounds a session's waits for its peer. A tool run from the command line has none and
/// waits as long as rdma-core's and perftest's do, for ever; the daemon's sessions have both.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// A session that hears nothing from its peer for this long fails with
    /// [`Error::PeerSilent`]: a QP waiting on receives learns of a vanished peer no other way.
    pub idle: Option<Duration>,
    /// Once set, every wait ends with [`Error::Stopped`].
    pub stop: Option<Arc<AtomicBool>>,
}

impl Limits {
    /// Bounds the session's TCP connection with an idle limit: each read of the handshake
    /// waits no longer, and keepalive probes start after that long without a byte, so that
    /// the reads of a peer host that vanished end too. A perftest server, which can read
    /// nothing from its client for a whole test, lifts the read timeout after the handshake.
    fn watch_connection(&self, stream: &TcpStream) -> Result<()> {
        let Some(idle) = self.idle else {
            return Ok(());
        };
        stream
            .set_read_timeout(Some(idle))
            .map_err(|e| Error::Exchange(format!("the TCP connection: {e}")))?;
        let keepalive = TcpKeepalive::new()
            .with_time(idle)
            .with_interval(Duration::from_secs(1))
            .with_retries(3);
        SockRef::from(stream)
            .set_tcp_keepalive(&keepalive)
            .map_err(|e| Error::Exchange(format!("the TCP connection's keepalive: {e}")))
    }
}

/// How long a wait spins before it naps, and for how long each nap.
const SPIN_FOR: Duration = Duration::from_millis(10);
const NAP: Duration = Duration::from_millis(1);

/// One session's waits, checked against its [`Limits`].
#[derive(Debug)]
struct Watch {
    limits: Limits,
    /// When the peer was last heard from.
    heard: Cell<Instant>,
}

impl Watch {
    fn new(limits: &Limits) -> Watch {
        Watch {
            limits: limits.clone(),
            heard: Cell::new(Instant::now()),
        }
    }

    /// Something came from the peer: a completion, or data it wrote.
    fn heard(&self) {
        self.heard.set(Instant::now());
    }

    /// Nothing came: leaves the core to the engine threads (two per host when both sides are
    /// softroce) instead of spinning against them, then fails if the session must end. A peer
    /// silent for longer than any gap of a running test is waited for in naps, not spins: a
    /// daemon session whose client vanished would otherwise burn a core until its idle limit.
    fn nothing(&self) -> Result<()> {
        if self.heard.get().elapsed() < SPIN_FOR {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
        if self
            .limits
            .stop
            .as_ref()
            .is_some_and(|stop| stop.load(Ordering::Relaxed))
        {
            return Err(Error::Stopped);
        }
        match self.limits.idle {
            Some(idle) if self.heard.get().elapsed() > idle => Err(Error::PeerSilent(idle)),
            _ => Ok(()),
        }
    }
}
