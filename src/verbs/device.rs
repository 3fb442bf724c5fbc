//! [`Device`]: a device opened on its backend or backends, its engines, and the verbs that
//! belong to the whole device (protection domains, CQs, counters, events).

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

use super::{receive, CompletionQueue, CqInner, Error, ProtectionDomain, Result};
use crate::cm::CmConfig;
use crate::engine::{self, Command, Completions, CqNotify, EngineHandle, Progress};
use crate::io::{
    link_of, Backend, GroupMember, IoCounters, PortBinding, RawBackend, RawConfig, Recording,
    UdpBackend, UdpConfig,
};
use crate::transport::{
    AsyncEvent, CongestionConfig, CongestionStatus, Counters, Lane, PathMtu, Resources, VerbsError,
    DEFAULT_PORT_MTU, MAX_LANES,
};
use crate::wire::cm::PortSpace;
use crate::wire::{Psn, Qpn};

/// Which backend carries the device's packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// A UDP socket on port 4791: no privileges needed. `segmentation` sends runs of packets
    /// as segmentation offload trains ([`UdpConfig::segmentation`]).
    Udp {
        /// With UDP segmentation offload ([`UdpConfig::segmentation`]).
        segmentation: bool,
        /// Cut trains per destination QP ([`UdpConfig::trains_per_qp`]). A trade-off toward a
        /// softroce peer of several engines: its kernel steers a train whole, by its first
        /// datagram's QP, and the engine it reaches hands the other QPs' datagrams over, which
        /// can reorder a QP's packets (RC then retransmits); cut per QP, many QPs with little
        /// in flight each cost a send call each. Off by default, for kernel rxe, NICs and
        /// softroce devices of one engine; a device of several engines cuts per QP whatever
        /// this says.
        trains_per_qp: bool,
    },
    /// A raw IPv4 socket that writes and reads whole IP datagrams ([`RawBackend`]): every
    /// received ICRC is verified in full. Needs `CAP_NET_RAW`; IPv4 only.
    Raw,
}

impl BackendKind {
    /// The UDP backend with segmentation offload, its trains across QPs: the default.
    pub const UDP: BackendKind = BackendKind::Udp {
        segmentation: true,
        trains_per_qp: false,
    };
}

/// The variable softroce's C library (`libibverbs.so.1`) reads for its devices' addresses,
/// comma-separated, one device each (127.0.0.1 if unset); `softroce run --addr` sets it.
pub const C_ADDR_VAR: &str = "SOFTROCE_ADDR";
/// The variable softroce's C library reads for its engines' progress: `hybrid` (the default),
/// `thread` or `inline`; `softroce run --progress` sets it.
pub const C_PROGRESS_VAR: &str = "SOFTROCE_PROGRESS";
/// The variable softroce's C library reads for its ports' active MTU in bytes (256 to 4096), in
/// place of the link's ([`DeviceConfig::port_mtu`]); `softroce run --mtu` sets it.
pub const C_MTU_VAR: &str = "SOFTROCE_MTU";
/// The variable softroce's C library reads for its devices' congestion control: settings as
/// [`CongestionConfig`] parses them (`off`, or mlx5's parameter names); `softroce run --cc`
/// sets it.
pub const C_CC_VAR: &str = "SOFTROCE_CC";

/// The variable softroce's C library reads for its engines' busy polling, in microseconds
/// ([`DeviceConfig::busy_poll`]; 0 turns it off); `softroce run --busy-poll` sets it.
pub const C_BUSY_POLL_VAR: &str = "SOFTROCE_BUSY_POLL";

/// The variable softroce's C library reads to cut its segmentation trains per QP, for peers of
/// several engines: `1` (see [`BackendKind::Udp`]); `0`, the default, does not.
/// `softroce run --trains-per-qp` sets it.
pub const C_TRAINS_PER_QP_VAR: &str = "SOFTROCE_TRAINS_PER_QP";

/// How long an engine polls its socket after packets moved, rather than sleep in it, where
/// [`DeviceConfig::busy_poll`] leaves it to softroce: as long as Linux's advice for its own
/// `net.core.busy_poll`, and about two round trips of an 8-byte ping-pong on loopback.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// The longest busy polling a device is opened with: past it, an engine would spin on most of
/// a CPU for any traffic at all, and a thread that sleeps costs less.
pub const MAX_BUSY_POLL: Duration = Duration::from_millis(10);

/// The most completions a CQ may be created to hold ([`Device::create_cq`]), as
/// `ibv_query_device` reports it (`max_cqe`).
pub const MAX_CQ_CAPACITY: usize = 1 << 22;

/// How a device is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The address to bind, and the one peers reach the device at (its GID).
    pub address: IpAddr,
    /// Which backend carries the packets.
    pub backend: BackendKind,
    /// Seeds the memory keys; `None` draws one from the OS's hasher randomness.
    pub seed: Option<u64>,
    /// Records every RoCE packet sent and received into this pcap file (`--pcap`).
    pub pcap: Option<PathBuf>,
    /// Who drives the engine: the application's calls and a thread of its own when they stop
    /// ([`Progress::Hybrid`], the default), a thread alone, or the calls alone.
    pub progress: Progress,
    /// The port's active MTU, which bounds UD messages and is perftest's default path MTU.
    /// `None` (the default): the MTU of the link that holds `address`, by rxe's rule
    /// ([`PathMtu::of_link`]: 1024 on a 1500-byte Ethernet link, 4096 on jumbo frames or
    /// loopback), or 1024, with a `tracing` warning, if that link cannot be read.
    pub port_mtu: Option<PathMtu>,
    /// The connection manager's timers and bounds: librdmacm's by default (a peer gets
    /// about 4.3 s to answer each message, and 6.4 s a REQ or our DREQ, 15 times).
    pub cm: CmConfig,
    /// How many engines (threads, each with a socket of its own) carry the device's QPs: 1
    /// (the default) to 64. More than one needs the UDP backend and records no pcap; each
    /// engine then runs on its own thread ([`Progress::Hybrid`] reads as [`Progress::Thread`],
    /// [`Progress::Inline`] is refused). QPs are spread over the engines as they are created,
    /// a QP with an SRQ on the SRQ's engine; the kernel steers each datagram to its QP's engine
    /// (see ARCHITECTURE.md, "Several engines"), and the engines cut their segmentation trains
    /// per QP ([`BackendKind::Udp`]).
    pub engines: usize,
    /// ECN, CNPs and DCQCN: on by default, as on ConnectX ([`CongestionConfig::off`] sends and
    /// heeds none of it, as kernel rxe).
    pub congestion: CongestionConfig,
    /// How long each engine keeps polling its socket after a turn that received or sent
    /// packets, rather than sleep in it, whoever runs the turn (its thread, or a CQ wait of
    /// the application's). A reply that comes within it is taken without waking a thread:
    /// an 8-byte ping-pong on loopback takes less than half as long; the cost is a CPU kept
    /// busy for up to this long after the traffic stops. `None` (the default):
    /// [`DEFAULT_BUSY_POLL`] with hybrid and inline progress on one engine (several run on
    /// threads of their own), where the polling is done by a thread that would otherwise sleep
    /// (the application's own CQ wait, or the device's thread once the application has
    /// stopped calling), if the process may run on more than one CPU
    /// (`std::thread::available_parallelism`, which follows its affinity and its cgroup's
    /// quota); none with an engine thread, which would poll beside an application
    /// that polls its CQ itself (perftest's `ib_send_lat` between two processes on 2 CPUs:
    /// 31 µs without, 70 with), nor on one CPU. `Some(Duration::ZERO)` turns it off; at most
    /// [`MAX_BUSY_POLL`].
    pub busy_poll: Option<Duration>,
    /// The keepalive each [`Connection`](super::Connection) of the device starts with: its QP
    /// probes a peer it has heard nothing from for this long while it has nothing outstanding,
    /// and fails (the connection ends with [`ConnectionEvent::QpFailed`]) when `retry_cnt` + 1
    /// probes go unanswered, a quarter interval apart (at most 1 s, at least the ACK timeout):
    /// a dead peer of an idle connection is noticed in about this long and 8 s more.
    /// [`DEFAULT_KEEPALIVE`] by default; `None` for none, as with librdmacm. A peer must run
    /// its engine to answer: one stopped in a debugger longer than that, or driving its engine
    /// inline ([`Progress::Inline`]) and calling nothing, looks dead. A QP connected without
    /// the CM has none unless
    /// [`QueuePair::set_keepalive`](super::QueuePair::set_keepalive) gives it one; at least
    /// 10 ms.
    ///
    /// [`ConnectionEvent::QpFailed`]: super::ConnectionEvent::QpFailed
    pub keepalive: Option<Duration>,
    /// Share the address with softroce devices of other processes of this user, as processes
    /// share kernel rxe's device (on by default): the device joins the address's group
    /// (ARCHITECTURE.md, "Many processes on one address"), and a packet still goes from the
    /// kernel straight to the process whose QP it is for. Off, the device binds the address
    /// alone, and a second device on it fails with `EADDRINUSE`. Only a device of one engine
    /// on the UDP backend shares; another takes its address alone.
    pub share_address: bool,
}

/// [`DeviceConfig::keepalive`]'s default: 30 s of silence on an idle connection, then probes
/// 1 s apart.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);

impl DeviceConfig {
    /// Its UDP socket's set-up: the address, and the ECN and CNP DSCP of `congestion`.
    fn udp_config(&self, segmentation: bool, trains_per_qp: bool) -> UdpConfig {
        UdpConfig {
            segmentation,
            trains_per_qp,
            ecn: self.congestion.ecn().bits(),
            cnp_dscp: self.congestion.np.np_cnp_dscp,
            ..UdpConfig::new(self.address)
        }
    }

    /// A device on a UDP socket bound to `address:4791`.
    pub fn udp(address: IpAddr) -> Self {
        DeviceConfig {
            address,
            backend: BackendKind::UDP,
            seed: None,
            pcap: None,
            progress: Progress::default(),
            port_mtu: None,
            cm: CmConfig::default(),
            engines: 1,
            congestion: CongestionConfig::default(),
            busy_poll: None,
            keepalive: Some(DEFAULT_KEEPALIVE),
            share_address: true,
        }
    }

    /// The engines' busy polling, as [`DeviceConfig::busy_poll`] says, for engines driven as
    /// `progress` (as the device resolved it: several engines run on threads).
    fn busy_poll_for(&self, progress: Progress) -> Result<Duration> {
        match self.busy_poll {
            Some(busy_poll) if busy_poll > MAX_BUSY_POLL => Err(refused(format!(
                "busy polling of {busy_poll:?}: at most {MAX_BUSY_POLL:?}"
            ))),
            Some(busy_poll) => Ok(busy_poll),
            None => {
                let cpus = std::thread::available_parallelism().map_or(1, |cpus| cpus.get());
                Ok(match progress {
                    Progress::Hybrid | Progress::Inline if cpus > 1 => DEFAULT_BUSY_POLL,
                    _ => Duration::ZERO,
                })
            }
        }
    }
}

/// An unpredictable seed without a dependency: std's hasher keys are random per process, and
/// each `RandomState` after the first in a thread differs from the one before.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(std::process::id().into());
    hasher.finish()
}

/// A random starting PSN, as librdmacm and perftest draw one (`lrand48() & 0xffffff`): a stale
/// packet of an earlier connection between the same QPNs then seldom falls in the window.
pub(crate) fn random_psn() -> Psn {
    Psn::new(random_seed() as u32)
}

pub(super) struct DeviceInner {
    /// The first runs the CM and takes the device-wide commands (memory, which all share).
    pub(super) engines: Box<[EngineHandle]>,
    /// The engine the next QP or SRQ goes to, modulo their number.
    pub(super) next_engine: AtomicUsize,
    /// Held while an address handle is created or destroyed on every engine, so that a number
    /// the first engine frees is not handed out again before the others have freed theirs.
    pub(super) ahs: Mutex<()>,
    pub(super) address: IpAddr,
    pub(super) port_mtu: PathMtu,
    busy_poll: Duration,
    /// [`DeviceConfig::keepalive`].
    pub(super) keepalive: Option<Duration>,
    /// The device's membership of its address's group, if it shares the address; let go of
    /// when the device closes.
    group: Mutex<Option<Arc<GroupMember>>>,
}

impl DeviceInner {
    /// Shuts every engine down and waits until each has (a second call finds them done).
    fn shut_down(&self) {
        // The first engine first: it alone may be waiting on another (its CM), which is then
        // still there to answer.
        for engine in self.engines.iter() {
            engine.shut_down();
        }
        // Its place in the address's group goes back; its socket stays with the other members.
        self.group
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// An `InvalidInput` error for a device configuration that cannot be opened.
fn refused(why: String) -> Error {
    Error::Io(io::Error::new(io::ErrorKind::InvalidInput, why))
}

/// What [`Device::drive_wait`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driving {
    /// A turn ran on the calling thread: look for what was awaited.
    Ran,
    /// A turn ran, and its sleep ended because the descriptor lent to it was readable.
    Woken,
    /// Another thread runs the engine: wait on the descriptor instead.
    Elsewhere,
}

/// An open device: a socket and the engine thread that drives it.
///
/// # Closing
///
/// A device runs until [`close`](Self::close) or until its last handle is dropped; every
/// object made on it (a PD, a region, a CQ, a QP, a listener, a connection) holds a handle,
/// so a task that awaits a CQ's completions holds the device open through the CQ: the device
/// cannot know that the task is the last user. `close` ends it whatever is held:
///
/// ```
/// use softroce::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let device = Device::open(DeviceConfig::udp("127.0.0.46".parse()?))?;
/// let cq = device.create_cq(8)?;
/// let waiting = tokio::spawn(async move { cq.next_completion().await });
/// device.close(); // the task holds the CQ, and so the device: it ends now
/// assert!(matches!(waiting.await?, Err(Error::DeviceClosed)));
/// // Its socket is free: the address can be opened again at once.
/// let _again = Device::open(DeviceConfig::udp("127.0.0.46".parse()?))?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Device {
    pub(super) inner: Arc<DeviceInner>,
}

/// A [`Device`] that does not keep it open ([`Device::downgrade`]): for a record that must
/// not outlive the application's own handles, such as a completion channel's note of the
/// device its waits run.
#[derive(Clone, Debug)]
pub struct WeakDevice(Weak<DeviceInner>);

impl WeakDevice {
    /// The device, while any of its handles lives.
    pub fn upgrade(&self) -> Option<Device> {
        self.0.upgrade().map(|inner| Device { inner })
    }

    /// Whether this is `device`.
    pub fn is(&self, device: &Device) -> bool {
        std::ptr::eq(self.0.as_ptr(), Arc::as_ptr(&device.inner))
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.inner.address)
    }
}

impl Device {
    /// Binds the backend and starts the engine thread.
    pub fn open(config: DeviceConfig) -> Result<Device> {
        if config.engines != 1 {
            return Self::open_engines(&config);
        }
        match config.backend {
            BackendKind::Udp {
                segmentation,
                trains_per_qp,
            } => {
                let udp = config.udp_config(segmentation, trains_per_qp);
                if config.share_address {
                    let (member, backend) = GroupMember::join(udp)?;
                    Self::start(backend, &config, Some(member))
                } else {
                    Self::start(UdpBackend::with_config(udp)?, &config, None)
                }
            }
            BackendKind::Raw => {
                let IpAddr::V4(address) = config.address else {
                    return Err(Error::Io(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "the raw backend is IPv4 only, and {} is IPv6: use the UDP backend",
                            config.address
                        ),
                    )));
                };
                let raw = RawBackend::bind(RawConfig {
                    ecn: config.congestion.ecn().bits(),
                    cnp_dscp: config.congestion.np.np_cnp_dscp,
                    ..RawConfig::new(address)
                })
                .map_err(io::Error::from)?;
                Self::start(raw, &config, None)
            }
        }
    }

    /// Opens a device of several engines: a UDP socket each, bound in engine order to one
    /// address with `SO_REUSEPORT`, and the program that steers datagrams among them.
    fn open_engines(config: &DeviceConfig) -> Result<Device> {
        let count = config.engines;
        if count == 0 || count > MAX_LANES as usize {
            return Err(refused(format!(
                "a device runs 1 to {MAX_LANES} engines, not {count}"
            )));
        }
        let BackendKind::Udp { segmentation, .. } = config.backend else {
            return Err(refused(
                "several engines need the UDP backend: the kernel steers among their sockets"
                    .into(),
            ));
        };
        if config.pcap.is_some() {
            return Err(refused(
                "a pcap records one engine's socket: record with one engine".into(),
            ));
        }
        // Its peers are taken to be alike: a train that mixes QPs would reach one engine whole.
        let udp = UdpConfig {
            reuse_port: true,
            ..config.udp_config(segmentation, true)
        };
        // A reuse-port socket joins any group on the address, another device's of several
        // engines included, and would see none of its datagrams: refused if anyone holds the
        // address, as the kernel's list says (a plain bind to find out would leave its socket
        // for a moment in any child another thread forks, in the way of the binds below).
        // (Two devices opened at once in one process could still interleave; nothing else
        // can, as the kernel admits only the same user to a group.)
        crate::io::holders::refuse_if_bound(config.address)?;
        let backends = (0..count)
            .map(|_| UdpBackend::with_config(udp))
            .collect::<io::Result<Vec<_>>>()?;
        // Bound in order: the program's answer N is the Nth socket of the group.
        backends[0].steer_by_dest_qp(count as u32)?;
        Self::with_backends(backends, config)
    }

    /// Starts `backend`, behind a [`Recording`] when the configuration asks for a capture.
    fn start<B: Backend>(
        backend: B,
        config: &DeviceConfig,
        group: Option<Arc<GroupMember>>,
    ) -> Result<Device> {
        match &config.pcap {
            Some(path) => Self::launch(vec![Recording::new(backend, path)?], config, group),
            None => Self::launch(vec![backend], config, group),
        }
    }

    /// Starts a device on a backend the caller built (a test hook, or a backend of its own),
    /// as `config` says; its address is the backend's, and its `backend` and `pcap` are not
    /// read (wrap the backend in [`Recording`] to record).
    pub fn with_backend<B: Backend>(backend: B, config: &DeviceConfig) -> Result<Device> {
        Self::launch(vec![backend], config, None)
    }

    /// Starts a device of several engines on backends the caller built, engine N on the Nth
    /// (a test hook, or backends of its own), as `config` says but for its `engines`,
    /// `backend` and `pcap`. The caller steers each datagram to its QP's engine
    /// ([`Lane::owner`]), as [`UdpBackend::steer_by_dest_qp`] does for UDP sockets bound with
    /// [`UdpConfig::reuse_port`]; a datagram that reaches another engine is handed over. UDP
    /// backends for peers like this device should also set [`UdpConfig::trains_per_qp`], as
    /// [`Device::open`] does for several engines.
    pub fn with_backends<B: Backend>(backends: Vec<B>, config: &DeviceConfig) -> Result<Device> {
        Self::launch(backends, config, None)
    }

    /// Starts the engines on `backends` as `config` says (its address, backend kind and pcap
    /// aside), as a member of `group` if it has one.
    fn launch<B: Backend>(
        backends: Vec<B>,
        config: &DeviceConfig,
        group: Option<Arc<GroupMember>>,
    ) -> Result<Device> {
        let count = backends.len();
        if count == 0 || count > MAX_LANES as usize {
            return Err(refused(format!(
                "a device runs 1 to {MAX_LANES} engines, not {count}"
            )));
        }
        // An application's CQ poll cannot run the turns of several engines at once.
        let progress = match config.progress {
            Progress::Inline if count > 1 => {
                return Err(refused(
                    "several engines run on threads of their own: not Progress::Inline".into(),
                ))
            }
            Progress::Hybrid if count > 1 => Progress::Thread,
            progress => progress,
        };
        let busy_poll = config.busy_poll_for(progress)?;
        let address = backends[0].local_addr();
        let seed = config.seed.unwrap_or_else(random_seed);
        let port_mtu = config.port_mtu.unwrap_or_else(|| match link_of(address) {
            Ok(link) => PathMtu::of_link(link.mtu),
            Err(error) => {
                tracing::warn!(%address, %error, "port MTU 1024: the device's link cannot be read");
                DEFAULT_PORT_MTU
            }
        });
        let parts = engine::prepare_lanes(backends.len() as u32, seed)?;
        let mut engines: Vec<EngineHandle> = Vec::with_capacity(backends.len());
        let settings = engine::EngineSettings {
            seed,
            port_mtu,
            progress,
            cm: config.cm,
            congestion: config.congestion,
            busy_poll,
            ledger: group
                .clone()
                .map(|member| member as Arc<dyn crate::transport::QpnLedger>),
        };
        for (backend, parts) in backends.into_iter().zip(parts) {
            match engine::start(backend, parts, &settings) {
                Ok(engine) => engines.push(engine),
                Err(error) => {
                    // The engines started already stop, and free the address.
                    for engine in &mut engines {
                        engine.shut_down();
                    }
                    return Err(error.into());
                }
            }
        }
        Ok(Device {
            inner: Arc::new(DeviceInner {
                engines: engines.into(),
                next_engine: AtomicUsize::new(0),
                ahs: Mutex::new(()),
                address,
                port_mtu,
                busy_poll,
                keepalive: config.keepalive,
                group: Mutex::new(group),
            }),
        })
    }

    /// Closes the device now, for every handle of it: its QPs are flushed (their outstanding
    /// work completes with `WR_FLUSH_ERR`, as at a destroy), every pending wait and future of
    /// the device (a CQ's, a listener's, a connection's, [`AsyncEvents::wait`]) ends, then or
    /// once the completions before the close are taken, with [`Error::DeviceClosed`], and so
    /// does every later call; its threads have ended and its socket is closed when this
    /// returns. Connections are not told: a connection dropped before the close sends its
    /// DREQ, one still held sends none, and its peer learns it by its own timers. Closing a
    /// closed device does nothing.
    pub fn close(&self) {
        self.inner.shut_down();
    }

    /// Holds RDMA-CM port `port` (1 to 65535) of `space` on the device's address against the
    /// devices of other processes that share it ([`DeviceConfig::share_address`]): REQs and
    /// SIDR_REQs for the port come to this device until the binding is dropped. `EADDRINUSE`
    /// (an [`Error::Io`]) if another process holds it, as the kernel's `rdma_bind_addr`
    /// answers; `None` for a device that has its address to itself, or is closed. Listening
    /// ([`Device::listen`]) binds its port so itself.
    pub fn bind_cm_port(&self, space: PortSpace, port: u16) -> Result<Option<PortBinding>> {
        if port == 0 {
            return Err(refused("RDMA-CM port 0 is not a port to bind".into()));
        }
        let group = self
            .inner
            .group
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match group {
            Some(member) => Ok(Some(member.bind_port(space.value(), port)?)),
            None => Ok(None),
        }
    }

    /// The device's place among the devices that share its address, if it shares it: the low
    /// byte of each of its QP numbers.
    pub fn place(&self) -> Option<u8> {
        let group = self
            .inner
            .group
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        group.as_ref().map(|member| member.place())
    }

    /// The address the device is bound to, which peers reach it at.
    pub fn address(&self) -> IpAddr {
        self.inner.address
    }

    /// The port's active MTU (`ibv_query_port`'s `active_mtu`): the largest UD message, and
    /// the path MTU perftest uses unless told otherwise.
    pub fn port_mtu(&self) -> PathMtu {
        self.inner.port_mtu
    }

    /// How long its engines poll their sockets after packets move: [`DeviceConfig::busy_poll`]
    /// as the device resolved it.
    pub fn busy_poll(&self) -> Duration {
        self.inner.busy_poll
    }

    /// Runs the device's engine on the calling thread for a caller that waits for a CQ's
    /// descriptor, armed with [`CompletionQueue::req_notify_driving`]: one turn, which waits
    /// on the socket for up to `wait` unless `arrived()` (asked once the engine is taken, when
    /// nothing else can fill the CQ) says the event is there, or a timer is due sooner. The
    /// datagram that brings the completion wakes the waiting thread itself, where one that
    /// sleeps on the descriptor is woken by the thread that took the datagram: one hand-off
    /// less a message. With [`Progress::Hybrid`] the engine's thread is interrupted if it
    /// holds the engine; a request posted meanwhile by another thread wakes the turn.
    ///
    /// `wake_on`, if given, is watched beside the socket while the turn sleeps, and ends the
    /// sleep once readable ([`Driving::Woken`]; it is never read): for what else the caller
    /// must wake for, such as a signalfd of the signals it holds off while it holds the engine.
    ///
    /// [`Driving::Elsewhere`] at once where another thread runs the engine: with
    /// [`Progress::Thread`], on a device of several engines, or while another thread of the
    /// application waits on the socket so; the caller then sleeps on the descriptor, in slices
    /// if it is the latter, and asks again.
    pub fn drive_wait(
        &self,
        wait: Duration,
        arrived: &dyn Fn() -> bool,
        wake_on: Option<&Arc<OwnedFd>>,
    ) -> Result<Driving> {
        if self.engines() > 1 {
            return Ok(Driving::Elsewhere);
        }
        let engine = self.engine();
        match engine.drive_wait(wait, arrived, wake_on) {
            Ok(engine::Driven::Ran) => Ok(Driving::Ran),
            Ok(engine::Driven::Woken) => Ok(Driving::Woken),
            Ok(engine::Driven::Busy) => Ok(Driving::Elsewhere),
            Err(gone) => Err(gone.into()),
        }
    }

    /// Whether a wait of the application's can run the device's engine
    /// ([`drive_wait`](Self::drive_wait)): with hybrid or inline progress, on one engine.
    pub fn waits_run_engine(&self) -> bool {
        self.engines() == 1 && self.engine().waits_drive()
    }

    /// A handle that does not keep the device open.
    pub fn downgrade(&self) -> WeakDevice {
        WeakDevice(Arc::downgrade(&self.inner))
    }

    /// The first engine: the CM's, and the one device-wide commands go to.
    pub(super) fn engine(&self) -> &EngineHandle {
        &self.inner.engines[0]
    }

    /// The engine at `index`.
    pub(super) fn engine_at(&self, index: usize) -> &EngineHandle {
        &self.inner.engines[index]
    }

    /// Held while an address handle is created or destroyed on every engine.
    pub(super) fn address_handles(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .ahs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How many engines the device runs ([`DeviceConfig::engines`]).
    pub fn engines(&self) -> usize {
        self.inner.engines.len()
    }

    /// The engine the next new QP or SRQ goes to: each in turn.
    pub(super) fn next_engine(&self) -> usize {
        self.inner.next_engine.fetch_add(1, Ordering::Relaxed) % self.engines()
    }

    /// `ibv_alloc_pd`: a protection domain, which groups regions, windows, QPs and address
    /// handles that may be used together.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let pd = self.engine().call(Command::AllocPd)?;
        Ok(ProtectionDomain {
            device: self.clone(),
            pd,
        })
    }

    /// A completion queue holding up to `capacity` completions.
    ///
    /// On a device of several engines, each engine has a CQ of this capacity and a ring of
    /// this capacity into the queue the application polls: a CQ overruns when an engine's own
    /// CQ is full as well as its ring. Such a CQ may so hold more than `capacity`, as a NIC's
    /// may hold more than `ibv_create_cq` asked for.
    ///
    /// A capacity above [`MAX_CQ_CAPACITY`] is refused: each engine's ring of the CQ reserves
    /// its capacity at creation, and its memory is touched as the ring goes round.
    pub fn create_cq(&self, capacity: usize) -> Result<CompletionQueue> {
        if capacity > MAX_CQ_CAPACITY {
            return Err(Error::Verbs(VerbsError::InvalidRequest(
                "a CQ holds at most MAX_CQ_CAPACITY (4194304) completions, ibv_query_device's max_cqe",
            )));
        }
        let notify = Arc::new(CqNotify::new(self.engine().watchers().cloned())?);
        let (completions, rings) = Completions::new(capacity, self.engines());
        let mut inner = CqInner {
            device: self.clone(),
            ids: Vec::with_capacity(self.engines()),
            completions,
            notify,
        };
        for (engine, ring) in self.inner.engines.iter().zip(rings) {
            // Dropping `inner` on an error destroys those created.
            let id = engine.call(|reply| Command::CreateCq {
                capacity,
                completions: ring,
                notify: Arc::clone(&inner.notify),
                reply,
            })?;
            inner.ids.push(id);
        }
        Ok(CompletionQueue {
            inner: Arc::new(inner),
        })
    }

    /// Waits, up to `max`, until every packet queued so far on the device, the CM's too (a
    /// DREQ of a connection just dropped, the ACK of the last message received), has been
    /// handed to the socket. True if that came before `max`. A process that exits right after
    /// its last verb calls this first: its engines die with it, and what they had not sent
    /// yet is never sent.
    pub fn flush(&self, max: Duration) -> Result<bool> {
        let deadline = Instant::now() + max;
        let mut waits = Vec::with_capacity(self.inner.engines.len());
        for engine in self.inner.engines.iter() {
            let (flushed, done) = bounded(1);
            engine.command(Command::Flush(flushed))?;
            waits.push((engine, done));
        }
        for (engine, done) in waits {
            let left = deadline.saturating_duration_since(Instant::now());
            if receive(engine, &done, left)?.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Why the device stopped, if it failed: its socket's error, a bug's panic, or what
    /// [`fail`](Self::fail) was given (the [`Error::DeviceFailed`] its calls then return).
    /// `None` while it runs. A failed device's engines touch no memory any more.
    pub fn failure(&self) -> Option<Error> {
        let failed = self.inner.engines.iter().find_map(|e| e.gone().0);
        failed.map(Error::DeviceFailed)
    }

    /// Whether the device has stopped for good, every engine of it: it touches no memory of
    /// the application's any more (a packet it had queued and not built, it never builds),
    /// so a region it held is the application's again.
    pub fn is_stopped(&self) -> bool {
        self.inner.engines.iter().all(EngineHandle::halted)
    }

    /// Stops the device as if its socket had failed with `error`: what its QPs held is flushed
    /// (WR_FLUSH_ERR), every wait ends, and every call from then on fails with
    /// [`Error::DeviceFailed`] wrapping `error`. For an application whose own part of the
    /// device failed: softroce's C library stops a device this way when one of its threads
    /// panics, so that the program sees the failure rather than a wait that never ends. A
    /// device that has stopped already stays as it stopped.
    pub fn fail(&self, error: io::Error) {
        let _ = self.engine().command(Command::Fail(error));
    }

    /// The transport's and the backend's counters, summed over the engines.
    pub fn counters(&self) -> Result<(Counters, IoCounters)> {
        let mut sum = (Counters::default(), IoCounters::default());
        for engine in self.inner.engines.iter() {
            let (transport, io) = engine.call(Command::Stats)?;
            sum.0 += &transport;
            sum.1 += &io;
        }
        Ok(sum)
    }

    /// Each QP that congestion control has touched (a CE mark, a CNP, a rate), with what it
    /// did and the rate its pacer holds it to, over all engines.
    pub fn congestion(&self) -> Result<Vec<(Qpn, CongestionStatus)>> {
        let mut all = Vec::new();
        for engine in self.inner.engines.iter() {
            all.extend(engine.call(Command::Congestion)?);
        }
        Ok(all)
    }

    /// How many packets QP `qpn` has accepted from its peer: a sign that the peer is alive
    /// even where no completion says so (the target of RDMA WRITEs and READs has none).
    pub fn received_packets(&self, qpn: Qpn) -> Result<u64> {
        self.engine_at(Lane::owner(qpn, self.engines() as u32) as usize)
            .call(|reply| Command::QpReceived(qpn, reply))?
            .ok_or(Error::Verbs(VerbsError::UnknownQp(qpn)))
    }

    /// How many QPs, CQs, regions, SRQs and address handles the device holds now.
    pub fn resources(&self) -> Result<Resources> {
        // Every engine holds a CQ for each of the device's, a copy of each address handle, and
        // sees the one memory table: those are counted once. QPs and SRQs are each on one.
        let mut sum = self.engine().call(Command::Resources)?;
        for engine in &self.inner.engines[1..] {
            let more = engine.call(Command::Resources)?;
            sum.qps += more.qps;
            sum.srqs += more.srqs;
        }
        Ok(sum)
    }

    /// The next asynchronous event, if any (QP fatal, access errors, CQ overrun, an SRQ's limit,
    /// the last request a QP in error took from its SRQ).
    pub fn poll_event(&self) -> Option<AsyncEvent> {
        let mut engines = self.inner.engines.iter();
        engines.find_map(|engine| engine.events.try_recv().ok())
    }

    /// The device's asynchronous events, for a thread that waits for them
    /// ([`AsyncEvents::wait`]). It holds no handle to the device: once the device is closed,
    /// the wait ends. An event goes to one taker, this or [`poll_event`](Self::poll_event).
    pub fn events(&self) -> AsyncEvents {
        AsyncEvents(
            self.inner
                .engines
                .iter()
                .map(|e| e.events.clone())
                .collect(),
        )
    }
}

/// A device's asynchronous events, from every engine ([`Device::events`]).
#[derive(Debug, Clone)]
pub struct AsyncEvents(Vec<crossbeam_channel::Receiver<AsyncEvent>>);

impl AsyncEvents {
    /// Waits for the next event; `None` once the device has stopped and every event it raised
    /// has been taken.
    pub fn wait(&self) -> Option<AsyncEvent> {
        let mut live: Vec<&crossbeam_channel::Receiver<AsyncEvent>> = self.0.iter().collect();
        while !live.is_empty() {
            let mut select = crossbeam_channel::Select::new();
            for receiver in &live {
                select.recv(receiver);
            }
            let ready = select.select();
            let index = ready.index();
            match ready.recv(live[index]) {
                Ok(event) => return Some(event),
                Err(_) => {
                    live.remove(index);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_busy_poll(busy_poll: Option<Duration>) -> DeviceConfig {
        DeviceConfig {
            busy_poll,
            ..DeviceConfig::udp(std::net::Ipv4Addr::LOCALHOST.into())
        }
    }

    /// What a device asks for is what its engines get, up to the bound; left to softroce,
    /// only hybrid and inline engines poll, and only on more than one CPU.
    #[test]
    fn busy_polling_stays_in_its_bound_and_off_for_threads_and_one_cpu() {
        let asked = [Duration::ZERO, Duration::from_micros(7), MAX_BUSY_POLL];
        for busy_poll in asked {
            let config = with_busy_poll(Some(busy_poll));
            assert_eq!(config.busy_poll_for(Progress::Thread).unwrap(), busy_poll);
        }
        let too_long = with_busy_poll(Some(MAX_BUSY_POLL + Duration::from_micros(1)));
        let refused = too_long
            .busy_poll_for(Progress::Hybrid)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("at most 10ms"), "{refused}");

        let default = with_busy_poll(None);
        assert_eq!(
            default.busy_poll_for(Progress::Thread).unwrap(),
            Duration::ZERO
        );
        if std::thread::available_parallelism().unwrap().get() > 1 {
            for progress in [Progress::Hybrid, Progress::Inline] {
                assert_eq!(default.busy_poll_for(progress).unwrap(), DEFAULT_BUSY_POLL);
            }
        }
        crate::test_support::pin_to_one_cpu();
        for progress in [Progress::Hybrid, Progress::Inline] {
            assert_eq!(default.busy_poll_for(progress).unwrap(), Duration::ZERO);
        }
    }
}
