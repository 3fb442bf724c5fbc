//! Test programs that speak to rdma-core's and perftest's tools over the wire: softroce on one
//! side, the stock tool on a kernel rxe or hardware NIC on the other.
//!
//! - [`pingpong`]: `softroce rc-pingpong`, `uc-pingpong` and `ud-pingpong`, which interoperate
//!   with rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong` in either role;
//! - [`oob`]: the pingpong tools' out-of-band address exchange over TCP;
//! - [`perftest`]: `softroce write-bw`, `read-bw`, `send-bw`, `atomic-bw`, `write-lat`,
//!   `read-lat` and `send-lat`, which interoperate with perftest's `ib_*_bw` and `ib_*_lat` in
//!   either role, with [`perftest_oob`], perftest's exchange, [`perftest_cm`], its RDMA-CM
//!   mode, [`perftest_keys`], the keys both carry, and [`perftest_report`], its output.
//!
//! - [`daemon`]: `softroce daemon`, which serves those tools' clients, one after another and
//!   several at once, on one device.
//!
//! The tools use the verbs API only, as an application would.

pub mod daemon;
mod daemon_cm;
pub mod device_view;
pub mod oob;
pub mod perftest;
pub mod perftest_cm;
pub mod perftest_keys;
pub mod perftest_oob;
pub mod perftest_report;
pub mod pingpong;
pub mod rping;
pub mod run;
pub mod ucmatose;
pub mod udaddy;

use std::cell::Cell;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv6Addr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};

use crate::cm::Failure;
use crate::transport::{AddressVector, CongestionConfig, WcStatus};
use crate::verbs::{self, BackendKind, CompletionQueue, Device, DeviceConfig, Progress};
use crate::wire::Qpn;

/// Why a tool stopped.
#[derive(Debug)]
pub enum Error {
    /// An option the tool cannot honour, found before anything was set up.
    Usage(String),
    /// The out-of-band exchange failed: TCP, or a message that is not what the tool sends.
    Exchange(String),
    /// A verb failed; `doing` says which step, in rdma-core's words where it has them.
    Device {
        /// The step that failed, e.g. `Couldn't post send`.
        doing: String,
        /// Why the verb failed.
        error: verbs::Error,
    },
    /// A completion with an error status.
    Completion {
        /// The work request's ID, as the tool posted it.
        wr_id: u64,
        /// The completion's status.
        status: WcStatus,
    },
    /// Fewer receive requests could be posted than the receive depth.
    PostRecv {
        /// How many were posted, as `ibv_rc_pingpong`'s "Couldn't post receive (n)" prints.
        posted: usize,
    },
    /// Writing the tool's output failed.
    Output(io::Error),
    /// A served session heard nothing from its peer for this long ([`Limits::idle`]).
    PeerSilent(Duration),
    /// The daemon is stopping ([`Limits::stop`]).
    Stopped,
    /// A served session would take more memory than the daemon allows; the text says which
    /// cap refused it ([`MemoryBudget`]).
    OverMemoryCap(String),
    /// `--check-data` found a byte that did not land as it was sent; the text says where.
    DataCheck(String),
}

/// What a failed verb becomes: `doing` names the step, in rdma-core's words where it has
/// them (`"Couldn't post send"`), beside why it failed.
pub(crate) fn failed<E: Into<verbs::Error>>(doing: &'static str) -> impl FnOnce(E) -> Error {
    move |e| Error::Device {
        doing: doing.into(),
        error: e.into(),
    }
}

/// How long a tool keeps its RC QP after its last message once the peer has gone quiet: four
/// of the peer's ACK timeouts at timeout 14, the tools' (4.096 us * 2^14 = 67 ms each), and
/// more for a slow peer.
const LATE_RESEND_QUIET: Duration = Duration::from_millis(400);
/// The longest a tool keeps its QP for a peer that keeps resending.
const LATE_RESEND_LINGER_MAX: Duration = Duration::from_secs(5);

/// Keeps the RC QP `qpn` of `device` until its peer has been quiet for [`LATE_RESEND_QUIET`]
/// (at most [`LATE_RESEND_LINGER_MAX`]), for a tool whose run has no closing round after its
/// last message: `ibv_rc_pingpong`, `ib_write_lat`. If our ACK of the peer's last message was
/// lost, the peer resends it (rxe for ever at retry_cnt 7: rxe_comp.c,
/// `if (qp->comp.retry_cnt != 7)`), and only a QP that still exists answers it. The engine
/// acknowledges a resent message by itself; waiting on `cq` drives it, which inline progress
/// needs. No completion is due.
pub(crate) fn answer_late_resends(device: &Device, qpn: Qpn, cq: &CompletionQueue) -> Result<()> {
    let received = || {
        device
            .received_packets(qpn)
            .map_err(failed("Couldn't read the QP's counters"))
    };
    let started = Instant::now();
    let (mut seen, mut quiet_since) = (received()?, started);
    while quiet_since.elapsed() < LATE_RESEND_QUIET && started.elapsed() < LATE_RESEND_LINGER_MAX {
        cq.wait(LATE_RESEND_QUIET / 8)
            .map_err(failed("Failed to poll completions"))?;
        let now = received()?;
        if now != seen {
            (seen, quiet_since) = (now, Instant::now());
        }
    }
    Ok(())
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
            Error::OverMemoryCap(why) => f.write_str(why),
            Error::DataCheck(why) => write!(f, "data check failed: {why}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Output(e)
    }
}

/// The tools' result: a value, or why the tool stopped.
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
    /// What carries the packets: a UDP socket (the default) or a raw IP socket.
    pub backend: BackendKind,
    /// Record every RoCE packet sent and received into this pcap file.
    pub pcap: Option<PathBuf>,
    /// Who drives the engine; inline only suits a tool that polls its CQ throughout.
    pub progress: Progress,
    /// Engine threads, each with a socket of its own ([`DeviceConfig::engines`]).
    pub engines: usize,
    /// ECN, CNPs and DCQCN ([`DeviceConfig::congestion`]).
    pub congestion: CongestionConfig,
    /// How long the engines poll after packets moved ([`DeviceConfig::busy_poll`]).
    pub busy_poll: Option<Duration>,
}

impl Default for DeviceOptions {
    /// The UDP backend with segmentation offload, on the exchange's address, no capture.
    fn default() -> Self {
        DeviceOptions {
            bind: None,
            backend: BackendKind::UDP,
            pcap: None,
            progress: Progress::Hybrid,
            engines: 1,
            congestion: CongestionConfig::default(),
            busy_poll: None,
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
            engines: self.engines,
            congestion: self.congestion,
            busy_poll: self.busy_poll,
            // As rdma-core's tools, whose connections send no probes.
            keepalive: None,
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

/// The source address of the route to `peer`, as `rdma_resolve_addr` picks a CM client's
/// device when it is given none: a UDP socket connected toward the peer says which.
pub(crate) fn route_source(peer: IpAddr) -> Result<IpAddr> {
    let unspecified: IpAddr = if peer.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let route = std::net::UdpSocket::bind((unspecified, 0))
        .and_then(|s| s.connect((peer, crate::wire::ROCEV2_UDP_PORT)).map(|()| s))
        .and_then(|s| s.local_addr());
    route.map(|a| a.ip()).map_err(|e| {
        Error::Usage(format!(
            "no route to {peer} to take a source address from ({e}): give the device's address"
        ))
    })
}

/// The device of a CM tool, which the tool's process outlives only briefly: dropped, it first
/// waits for the disconnects in flight to settle ([`Device::linger`]), so that a peer whose
/// DREQ it answered, and which lost the DREP, is answered again rather than left retrying
/// for a minute. Up to the peer's retransmission period, about 5 to 7 s with librdmacm's
/// defaults, and only after a disconnect the peer began.
pub(crate) struct CmToolDevice(Device);

/// The longest a CM tool's device waits at its end: a peer's DREQ period is at most about
/// 7 s with librdmacm's defaults, and one DREP lost twice in a row is allowed for.
const CM_TOOL_LINGER: Duration = Duration::from_secs(15);

impl std::ops::Deref for CmToolDevice {
    type Target = Device;

    fn deref(&self) -> &Device {
        &self.0
    }
}

impl Drop for CmToolDevice {
    fn drop(&mut self) {
        if let Ok(false) = self.0.linger(CM_TOOL_LINGER) {
            tracing::warn!("a peer's disconnect was still in flight when the tool ended");
        }
    }
}

/// The device of a CM tool: `address` (its -b, -a or -I), the common `--bind`, or, for a client
/// (`server` given), the source address of the route to the server. A server needs one:
/// `flag` says which flag gives it.
pub(crate) fn cm_tool_device(
    address: Option<IpAddr>,
    device: &DeviceOptions,
    server: Option<IpAddr>,
    flag: &str,
) -> Result<CmToolDevice> {
    let address = match (address.or(device.bind), server) {
        (Some(address), _) => address,
        (None, Some(server)) => route_source(server)?,
        (None, None) => {
            return Err(Error::Usage(format!(
                "softroce's server needs the device's address: {flag} ADDRESS"
            )))
        }
    };
    device.open(address).map(CmToolDevice)
}

/// `rdma_disconnect` of each connection, then their `DISCONNECTED` events, which rping's and
/// cmatose's threads wait for before they exit: each peer's DREP, or the DREQ's last retry
/// going unanswered.
pub(crate) fn disconnect_and_wait<'a>(
    conns: impl IntoIterator<Item = &'a verbs::Connection> + Clone,
) -> Result<()> {
    for conn in conns.clone() {
        conn.disconnect().map_err(failed("rdma_disconnect"))?;
    }
    for conn in conns {
        while conn
            .wait_cm_end(Duration::from_secs(1))
            .map_err(failed("rdma_get_cm_event"))?
            .is_none()
        {}
    }
    Ok(())
}

/// The last lines of ucmatose and udaddy (their `main`): "test complete" and the status.
pub(crate) fn librdmacm_test_end(out: &mut dyn std::io::Write, result: Result<()>) -> Result<()> {
    writeln!(out, "test complete")?;
    writeln!(out, "return status {}", if result.is_ok() { 0 } else { -1 })?;
    result
}

/// The RDMA-CM event and status librdmacm reports for a failed connection, as the CM tools
/// print them: REJECTED with the REJ's reason, UNREACHABLE with -ETIMEDOUT or -EHOSTUNREACH,
/// CONNECT_ERROR with -EINVAL.
pub(crate) fn cm_event(failure: &Failure) -> (&'static str, i32) {
    match failure {
        Failure::Rejected { reason, .. } => ("RDMA_CM_EVENT_REJECTED", i32::from(reason.0)),
        Failure::TimedOut => ("RDMA_CM_EVENT_UNREACHABLE", -110),
        Failure::Unreachable => ("RDMA_CM_EVENT_UNREACHABLE", -113),
        Failure::Qp(_) => ("RDMA_CM_EVENT_CONNECT_ERROR", -22),
    }
}

/// The address a peer's GID names, as a device at `device` reaches it. Refused, with the
/// reason, where no RoCE packet could go (the rules of [`AddressVector::resolve`]): the zero GID
/// that rdma-core's tools send without `-g`, a multicast or broadcast GID, or one of the other
/// IP version. A peer's exchange is the network's, so this is checked before anything is made
/// from it.
pub(crate) fn peer_address(gid: Ipv6Addr, device: IpAddr, peer: &str) -> Result<IpAddr> {
    let av = AddressVector { dest: gid.into() };
    av.resolve(device).map(|av| av.dest).map_err(|why| {
        let hint = if gid.is_unspecified() {
            ": run rdma-core's tools with -g and perftest's with -x, and the index of an \
             IPv4-mapped or IPv6 GID (rxe's IPv4-mapped GID is usually index 1)"
        } else {
            ""
        };
        Error::Exchange(format!(
            "the {peer}'s GID {gid} is no address to send to: {why}{hint}"
        ))
    })
}

/// What bounds a session's waits for its peer and its memory. A tool run from the command line
/// has none and waits as long as rdma-core's and perftest's do, for ever; the daemon's
/// sessions have all three.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// A session that hears nothing from its peer for this long fails with
    /// [`Error::PeerSilent`]: a QP waiting on receives learns of a vanished peer no other way.
    pub idle: Option<Duration>,
    /// Once set, every wait ends with [`Error::Stopped`].
    pub stop: Option<Arc<AtomicBool>>,
    /// The memory the daemon's sessions may take, each and together.
    pub memory: Option<Arc<MemoryBudget>>,
}

/// The memory a daemon's sessions may register: each at most `per_session` bytes, all of them
/// together at most `total`. A session reserves its buffer before registering it, and gives it
/// back when it ends; one that does not fit is refused, saying which cap refused it.
#[derive(Debug)]
pub struct MemoryBudget {
    per_session: u64,
    total: u64,
    used: AtomicU64,
}

/// Memory reserved from a [`MemoryBudget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// `bytes` with a binary unit, for messages.
fn in_units(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1 << 20)),
        b => format!("{b} bytes"),
    }
}

impl MemoryBudget {
    /// A budget of `per_session` bytes for each session and `total` bytes for all, none used.
    pub fn new(per_session: u64, total: u64) -> Self {
        MemoryBudget {
            per_session,
            total,
            used: AtomicU64::new(0),
        }
    }

    /// Bytes reserved by the sessions running now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether one session's `bytes` are within the per-session cap.
    pub fn check_session(&self, bytes: u64) -> Result<()> {
        if bytes > self.per_session {
            return Err(Error::OverMemoryCap(format!(
                "the session needs {} for its buffer, over the daemon's per-session memory cap \
                 of {} (--max-session-memory)",
                in_units(bytes),
                in_units(self.per_session)
            )));
        }
        Ok(())
    }

    /// Reserves `bytes` for one session, or says which cap refuses them.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation> {
        self.check_session(bytes)?;
        let reserved = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&after| after <= self.total)
            });
        match reserved {
            Ok(_) => Ok(Reservation {
                budget: self.clone(),
                bytes,
            }),
            Err(used) => Err(Error::OverMemoryCap(format!(
                "the session needs {} for its buffer, and the sessions running hold {} of the \
                 daemon's total memory cap of {} (--max-memory)",
                in_units(bytes),
                in_units(used),
                in_units(self.total)
            ))),
        }
    }
}

impl Limits {
    /// Fails if a wait that began at `started` must end: the daemon is stopping, or it has
    /// lasted longer than the idle limit.
    pub(crate) fn check_since(&self, started: Instant) -> Result<()> {
        if self
            .stop
            .as_ref()
            .is_some_and(|stop| stop.load(Ordering::Relaxed))
        {
            return Err(Error::Stopped);
        }
        match self.idle {
            Some(idle) if started.elapsed() > idle => Err(Error::PeerSilent(idle)),
            _ => Ok(()),
        }
    }

    /// Reserves a session's `bytes` from the daemon's memory budget, if it has one.
    pub(crate) fn reserve(&self, bytes: u64) -> Result<Option<Reservation>> {
        self.memory.as_ref().map(|m| m.reserve(bytes)).transpose()
    }

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
        self.expired()
    }

    /// Fails if the session must end: the daemon is stopping, or the peer has been silent for
    /// longer than the idle limit.
    fn expired(&self) -> Result<()> {
        self.limits.check_since(self.heard.get())
    }
}

/// Whether the peer of a session's QPs is still there, asked while the session waits on its TCP
/// connection: a perftest server waits there for a whole test, in which its QPs see the
/// client's WRITEs or READs but complete nothing. Packets its QPs accept count as hearing from
/// the peer; a client that finishes the handshake and then says nothing on either path is
/// dropped after the idle limit, instead of holding a session for ever.
pub(crate) struct PeerActivity {
    device: Device,
    qpns: Vec<Qpn>,
    /// The packets the QPs had accepted at the last look.
    seen: u64,
    watch: Watch,
}

impl PeerActivity {
    /// `None` for a tool run from the command line, which waits for ever as perftest does.
    pub fn new(device: &Device, qpns: Vec<Qpn>, limits: &Limits) -> Option<PeerActivity> {
        (limits.idle.is_some() || limits.stop.is_some()).then(|| PeerActivity {
            device: device.clone(),
            qpns,
            seen: 0,
            watch: Watch::new(limits),
        })
    }

    /// How long a read waits before it asks again.
    pub const TICK: Duration = Duration::from_secs(1);

    /// Fails if the session must end; anything the QPs accepted since the last look counts as
    /// hearing from the peer.
    pub fn check(&mut self) -> Result<()> {
        let mut packets = 0;
        for &qpn in &self.qpns {
            packets += self
                .device
                .received_packets(qpn)
                .map_err(|error| Error::Device {
                    doing: "Couldn't read the QP's counters".into(),
                    error,
                })?;
        }
        if packets != self.seen {
            self.seen = packets;
            self.watch.heard();
        }
        self.watch.expired()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_gid_must_name_an_address_to_send_to() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped = |a: &str| a.parse::<std::net::Ipv4Addr>().unwrap().to_ipv6_mapped();
        assert_eq!(
            peer_address(mapped("10.0.0.2"), v4, "client").unwrap(),
            "10.0.0.2".parse::<IpAddr>().unwrap()
        );
        for (gid, why) in [
            (mapped("255.255.255.255"), "broadcast"),
            (mapped("224.0.0.5"), "multicast"),
            (Ipv6Addr::UNSPECIFIED, "-g"),
            ("fd00::2".parse().unwrap(), "families"),
        ] {
            let error = peer_address(gid, v4, "client").unwrap_err().to_string();
            assert!(error.contains(why), "{gid}: {error}");
            assert!(error.contains("the client's GID"), "{error}");
        }
    }

    #[test]
    fn the_memory_budget_says_which_cap_refused() {
        let budget = Arc::new(MemoryBudget::new(4 << 20, 5 << 20));
        let per_session = budget.reserve(5 << 20).unwrap_err().to_string();
        assert!(
            per_session.contains("--max-session-memory"),
            "{per_session}"
        );
        let held = budget.reserve(4 << 20).unwrap();
        let total = budget.reserve(2 << 20).unwrap_err().to_string();
        assert!(total.contains("--max-memory"), "{total}");
        assert!(total.contains("hold 4.0 MiB"), "{total}");
        drop(held);
        assert_eq!(budget.used(), 0);
        let _again = budget.reserve(4 << 20).unwrap();
        assert_eq!(budget.used(), 4 << 20);
    }
}
