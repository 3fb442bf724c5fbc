//! `softroce write-bw`, `read-bw`, `send-bw`, `atomic-bw`, `write-lat`, `read-lat` and
//! `send-lat`: perftest's `ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`,
//! `ib_write_lat`, `ib_read_lat` and `ib_send_lat` (linux-rdma/perftest 4.5-0.17, Debian's
//! `perftest` package, which calls itself version 6.06), over softroce.
//!
//! Either side may be softroce or perftest. What the peer sees is what perftest does:
//!
//! - the exchange of [`super::perftest_oob`], with each test's own sequence of key rounds
//!   (see `Session::handshake` and the test phases below it), which is where the two sides
//!   wait for each other;
//! - RC QPs (`-q` of them in the bandwidth tests) with perftest's attributes: access for the
//!   test's verb, timeout 14, retry and RNR retry 7, RNR timer 12, and as many outstanding
//!   READs and atomics as both sides take;
//! - one buffer, registered once: a send half and a receive half, one slice per QP in each, of
//!   the message size or the page size if that is larger. A peer's messages go to this side's
//!   receive half, whose address is what the keys carry. Messages no larger than half a page
//!   cycle through the page in cache-line steps, as perftest's do;
//! - the bandwidth client keeps up to 128 messages in flight per QP (`TX depth`), asks for a
//!   completion every 100th (`CQ Moderation`, 1 for messages over 8 KiB), and reports the
//!   average and the peak bandwidth; the `SEND` server measures from its first receive to its
//!   last;
//! - the latency tests time each round trip of one message each way (a READ or atomic is one
//!   round trip by itself). `write-lat` polls the last byte of its receive buffer for the
//!   peer's count, as perftest does, and the server writes first; in `send-lat` the client
//!   sends first.
//!
//! A softroce device has one GID, its address ([`super::pingpong::gid_of`]); `-x` is accepted
//! and means that one. The peer's GID is turned back into the address to send to. Times come
//! from the monotonic clock, so `-F` (which silences perftest's CPU-frequency warning) changes
//! nothing.

mod context;
mod session;

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use super::perftest_cm::{next_request, CmLink, DataRequests};
use super::perftest_oob::{Exchange, Link};
use super::perftest_report::{BwUnit, Output, Shown, TestInfo, PEAK_ITERS_MAX};
use super::pingpong::{accept, connect, listen, local_address};
use super::{failed, DeviceOptions, Error, Limits, PeerActivity, Result};
use crate::memory::Access;
use crate::transport::{PathMtu, MAX_RD_ATOMIC};
use crate::verbs::{ConnectOptions, ConnectionRequest, Device};
use crate::wire::RnrTimer;
use context::Context;
use session::Session;

/// `DEF_SIZE_BW`, `DEF_SIZE_LAT`, `DEF_SIZE_ATOMIC`.
const DEFAULT_SIZE_BW: u64 = 65536;
const DEFAULT_SIZE_LAT: u64 = 2;
const ATOMIC_SIZE: u64 = 8;
/// `MAX_SIZE`: `-a` runs every power of two from 2 up to this.
const MAX_SIZE: u64 = 1 << 23;
/// `DEF_ITERS`, and `DEF_ITERS_WB` for `ib_write_bw`.
const DEFAULT_ITERS: u64 = 1000;
const DEFAULT_ITERS_WRITE_BW: u64 = 5000;
/// `-n`'s range (`MIN_ITER`, `MAX_ITER`).
pub const ITERS_RANGE: std::ops::RangeInclusive<u64> = 5..=100_000_000;
/// `-q`'s range (`MIN_QP_NUM`, `MAX_QP_NUM`).
pub const QPS_RANGE: std::ops::RangeInclusive<usize> = 1..=16384;
/// `DEF_TX_BW`, `DEF_TX_LAT`, `DEF_RX_SEND`, `DEF_RX_RDMA`.
const TX_DEPTH_BW: u64 = 128;
const TX_DEPTH_LAT: u64 = 1;
const RX_DEPTH_SEND: u64 = 512;
const RX_DEPTH_RDMA: u64 = 1;
/// `DEF_CQ_MOD`, and the message size above which perftest signals every message instead
/// (`MSG_SIZE_CQ_MOD_LIMIT`).
const CQ_MOD: u64 = 100;
const CQ_MOD_SIZE_LIMIT: u64 = 8192;
/// What this side offers in the page- and cache-line-size rounds; both sides use the larger.
const PAGE_SIZE: u32 = 4096;
const CACHE_LINE: u32 = 64;
/// The QP attributes perftest sets (`DEF_QP_TIME`, `ctx_modify_qp_to_rts`, `MIN_RNR_TIMER`).
const QP_TIMEOUT: u8 = 14;
const RETRY_COUNT: u8 = 7;
const MIN_RNR_TIMER: u8 = 12;
/// `ATOMIC_ADD_VALUE`; compare-and-swap compares with 0 and swaps in `ATOMIC_SWAP_VALUE`, 0.
const ATOMIC_ADD: u64 = 1;
/// `CTX_POLL_BATCH`: completions taken from a CQ at once.
const POLL_BATCH: usize = 16;

/// The verb a test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// SEND into the peer's posted receives.
    Send,
    /// RDMA WRITE into the peer's buffer.
    Write,
    /// RDMA READ from the peer's buffer.
    Read,
    /// An 8-byte atomic on the peer's buffer (`-A`).
    Atomic,
}

impl Verb {
    /// Which keys the test's address lines show, as perftest's.
    fn shown(self) -> Shown {
        Shown {
            out_reads: self == Verb::Read,
            buffer: matches!(self, Verb::Read | Verb::Write),
        }
    }
}

/// The seven tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// `ib_write_bw`: RDMA WRITE bandwidth.
    WriteBw,
    /// `ib_read_bw`: RDMA READ bandwidth.
    ReadBw,
    /// `ib_send_bw`: SEND bandwidth.
    SendBw,
    /// `ib_atomic_bw`: atomic bandwidth and message rate.
    AtomicBw,
    /// `ib_write_lat`: RDMA WRITE ping-pong latency.
    WriteLat,
    /// `ib_read_lat`: RDMA READ round-trip latency.
    ReadLat,
    /// `ib_send_lat`: SEND ping-pong latency.
    SendLat,
}

impl Test {
    /// The verb the test measures.
    pub fn verb(self) -> Verb {
        match self {
            Test::WriteBw | Test::WriteLat => Verb::Write,
            Test::ReadBw | Test::ReadLat => Verb::Read,
            Test::SendBw | Test::SendLat => Verb::Send,
            Test::AtomicBw => Verb::Atomic,
        }
    }

    /// Whether it is a bandwidth test (`ib_*_bw`) rather than a latency one (`ib_*_lat`).
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            Test::WriteBw | Test::ReadBw | Test::SendBw | Test::AtomicBw
        )
    }

    /// The subcommand.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write-bw",
            Test::ReadBw => "read-bw",
            Test::SendBw => "send-bw",
            Test::AtomicBw => "atomic-bw",
            Test::WriteLat => "write-lat",
            Test::ReadLat => "read-lat",
            Test::SendLat => "send-lat",
        }
    }

    /// The default message size.
    pub fn default_size(self) -> u64 {
        match self {
            Test::AtomicBw => ATOMIC_SIZE,
            _ if self.is_bw() => DEFAULT_SIZE_BW,
            _ => DEFAULT_SIZE_LAT,
        }
    }

    /// The default number of iterations.
    pub fn default_iters(self) -> u64 {
        match self {
            Test::WriteBw => DEFAULT_ITERS_WRITE_BW,
            _ => DEFAULT_ITERS,
        }
    }

    /// How many messages one timed gap covers: a READ or atomic is a round trip by itself,
    /// the others take one message each way (perftest's `rtt_factor`).
    fn rtt_factor(self) -> u32 {
        match self.verb() {
            Verb::Read | Verb::Atomic => 1,
            Verb::Send | Verb::Write => 2,
        }
    }
}

/// The atomic `atomic-bw` issues (`-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// `CMP_AND_SWAP`: compares with 0 and swaps in 0.
    CompareSwap,
    /// `FETCH_AND_ADD`: adds 1.
    FetchAdd,
}

impl AtomicOp {
    /// perftest's name for it.
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::CompareSwap => "CMP_AND_SWAP",
            AtomicOp::FetchAdd => "FETCH_AND_ADD",
        }
    }
}

/// What to run: perftest's options, and the device's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Which of the seven tools runs.
    pub test: Test,
    /// The server to connect to (a host name or address); `None` makes this side the server.
    pub server: Option<String>,
    /// The TCP port of the exchange.
    pub port: u16,
    /// `-s`; `None`: the test's default. Without `-a`, at least 1 byte.
    pub size: Option<u64>,
    /// `-n`: messages per QP, or round trips.
    pub iters: Option<u64>,
    /// `-D`: run for this many seconds instead of `-n` messages, timing the middle half.
    pub duration: Option<u32>,
    /// `-m`: the path MTU this side offers, at most the port's; the two sides use the
    /// smaller. `None`: the port's active MTU ([`Device::port_mtu`]), as perftest has it.
    pub mtu: Option<PathMtu>,
    /// `-q`: QPs, in the bandwidth tests.
    pub qps: usize,
    /// `-a`: every size from 2 bytes to 8 MiB.
    pub all_sizes: bool,
    /// `--report_gbits`: Gb/sec instead of MB/sec.
    pub report_gbits: bool,
    /// `-N`: no peak bandwidth computed (it prints as 0), as after [`PEAK_ITERS_MAX`]
    /// iterations or with `-D`.
    pub no_peak: bool,
    /// `-x`, printed as the GID index; every index means the device's one address.
    pub gid_index: u32,
    /// `-A`, for `atomic-bw`.
    pub atomic: AtomicOp,
    /// How the device is opened: softroce's `--bind`, `--backend` and `--pcap`.
    pub device: DeviceOptions,
    /// Print one JSON document instead of perftest's text.
    pub json: bool,
    /// softroce's own, for the bandwidth tests between two softroce sides: fill the buffers
    /// so that the side that receives can check every byte that landed (`DataCheck`).
    pub check_data: bool,
    /// `-R`: connect by RDMA-CM, the exchange and every data QP ([`super::perftest_cm`]).
    pub rdma_cm: bool,
}

impl Options {
    /// perftest's defaults: a server on port 18515, the test's size and iterations, the port's
    /// MTU, one QP.
    pub fn new(test: Test) -> Self {
        Options {
            test,
            server: None,
            port: super::oob::DEFAULT_PORT,
            size: None,
            iters: None,
            duration: None,
            mtu: None,
            qps: 1,
            all_sizes: false,
            report_gbits: false,
            no_peak: false,
            gid_index: 0,
            atomic: AtomicOp::FetchAdd,
            device: DeviceOptions::default(),
            json: false,
            check_data: false,
            rdma_cm: false,
        }
    }
}

/// `-D`: a warm-up and a cool-down of a quarter each (perftest's default margin), and the
/// messages of the half between them counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timing {
    total: Duration,
    margin: Duration,
}

/// Where a timed run is (perftest's `START_STATE` ... `END_STATE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Warmup,
    Sample,
    Cooldown,
    End,
}

impl Timing {
    fn new(seconds: u32) -> Timing {
        Timing {
            total: Duration::from_secs(seconds.into()),
            // Whole seconds, as perftest's `duration / 4` is.
            margin: Duration::from_secs((seconds / 4).into()),
        }
    }

    fn phase(&self, since_start: Duration) -> Phase {
        if since_start < self.margin {
            Phase::Warmup
        } else if since_start < self.total - self.margin {
            Phase::Sample
        } else if since_start < self.total {
            Phase::Cooldown
        } else {
            Phase::End
        }
    }

    /// The sampling period, from its start to its end, in nanoseconds from the run's start.
    fn sample_ns(&self) -> (u64, u64) {
        let ns = |d: Duration| d.as_nanos() as u64;
        (ns(self.margin), ns(self.total - self.margin))
    }
}

/// The run's parameters once perftest's rules have been applied (`force_dependecies`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    /// The sizes run, in order.
    sizes: Vec<u64>,
    /// The largest: what the buffer is laid out for.
    max_size: u64,
    /// Messages per QP (or round trips) of each size; 0 with `-D`.
    iters: u64,
    timing: Option<Timing>,
    tx_depth: u64,
    /// Receives posted per QP in the SEND tests.
    rx_depth: u64,
    cq_mod: u64,
    /// The peak is computed only from at most 20,000 messages, and never with `-D` or by the
    /// SEND server.
    no_peak: bool,
    /// What this side's keys offer: READs and atomics it answers at once, 1 in the tests that
    /// have none.
    out_reads: u16,
    unit: BwUnit,
}

impl Plan {
    fn new(o: &Options, client: bool) -> Result<Plan> {
        let test = o.test;
        let usage = |why: &str| Err(Error::Usage(why.into()));
        if !test.is_bw() && o.qps > 1 {
            return usage("Multiple QPs only available on bw tests");
        }
        if o.duration.is_some() && o.all_sizes {
            return usage("Duration mode currently doesn't support running on all sizes.");
        }
        if o.no_peak && !test.is_bw() {
            return usage("-N (no peak bandwidth) is for the bw tests only");
        }
        if o.check_data && !matches!(test, Test::WriteBw | Test::ReadBw | Test::SendBw) {
            return usage("--check-data is for write-bw, read-bw and send-bw");
        }
        let size = o.size.unwrap_or(test.default_size());
        if test.verb() == Verb::Atomic && (o.all_sizes || size != ATOMIC_SIZE) {
            return usage("Message size cannot be changed for Atomic tests");
        }
        let timing = o.duration.map(Timing::new);
        let iters = match timing {
            Some(_) => 0,
            None => o.iters.unwrap_or(test.default_iters()),
        };
        let sizes: Vec<u64> = if o.all_sizes {
            (1..24).map(|power| 1 << power).collect()
        } else {
            vec![size]
        };
        let max_size = if o.all_sizes { MAX_SIZE } else { size };
        let counted = timing.is_none();
        let mut tx_depth = if test.is_bw() {
            TX_DEPTH_BW
        } else {
            TX_DEPTH_LAT
        };
        let send = test.verb() == Verb::Send;
        let mut rx_depth = if send { RX_DEPTH_SEND } else { RX_DEPTH_RDMA };
        if counted {
            tx_depth = tx_depth.min(iters);
            if send {
                rx_depth = rx_depth.min(iters);
            }
        }
        // perftest's work-around "for a bug when rx_depth is odd in SEND".
        if send && rx_depth % 2 == 1 && !o.all_sizes {
            rx_depth += 1;
        }
        let mut cq_mod = CQ_MOD;
        if max_size > CQ_MOD_SIZE_LIMIT && !o.all_sizes {
            cq_mod = 1;
        }
        let cq_mod = cq_mod.min(tx_depth);
        let no_peak = o.no_peak
            || !counted
            || (test == Test::SendBw && !client)
            || (test.is_bw() && iters > PEAK_ITERS_MAX);
        let out_reads = match test.verb() {
            Verb::Read | Verb::Atomic => u16::from(MAX_RD_ATOMIC),
            Verb::Send | Verb::Write => 1,
        };
        Ok(Plan {
            sizes,
            max_size,
            iters,
            timing,
            tx_depth,
            rx_depth,
            cq_mod,
            no_peak,
            out_reads,
            unit: if o.report_gbits {
                BwUnit::Gbit
            } else {
                BwUnit::MiB
            },
        })
    }
}

/// Runs one side to the end, printing perftest's output (or, with `json`, the JSON document)
/// to `out`.
pub fn run(o: &Options, out: &mut dyn Write) -> Result<()> {
    let client = o.server.is_some();
    let plan = Plan::new(o, client)?;
    let mut output = Output::new(out, o.json);
    if o.rdma_cm {
        return run_rdma_cm(o, plan, output);
    }
    let stream = match &o.server {
        Some(host) => connect(host, o.port)?,
        None => {
            let listener = listen(o.port, o.device.bind)?;
            output.waiting()?;
            accept(listener)?
        }
    };
    let address = match o.device.bind {
        Some(address) => address,
        None => local_address(&stream)?,
    };
    let device = o.device.open(address)?;
    let exchange = Exchange::new(Link::Tcp(stream), client);
    let limits = Limits::default();
    session(
        End::new(o, exchange, client, &limits),
        plan,
        &device,
        Connect::Modify,
        output,
    )
}

/// [`run`] with `-R`: the exchange on an RDMA-CM connection, and every data QP connected by
/// RDMA-CM on the same port. The server needs its device's address (`--bind`): no TCP
/// connection says which it is.
fn run_rdma_cm(o: &Options, plan: Plan, mut output: Output<'_>) -> Result<()> {
    let client = o.server.is_some();
    let server = match &o.server {
        Some(host) => Some(SocketAddr::new(resolve(host)?, o.port)),
        None => None,
    };
    let device = super::cm_tool_device(None, &o.device, server.map(|s| s.ip()), "--bind")?;
    let limits = Limits::default();
    let Some(to) = server else {
        let listener = device
            .listen(o.port)
            .map_err(failed("Failed to listen on RDMA CM server listen ID"))?;
        output.waiting()?;
        let control = next_request(&listener)?;
        let mut data = &listener;
        return serve_cm(o, plan, &device, (control, &mut data), &limits, output);
    };
    let link = CmLink::connect(&device, to)?;
    let exchange = Exchange::new(Link::RdmaCm(Box::new(link)), client);
    let end = End::new(o, exchange, client, &limits);
    session(end, plan, &device, Connect::Client(to), output)
}

/// A `-R` server's session for the client whose control connection `control` asks for, its
/// data connections from `data`: the command line's way and the daemon's.
fn serve_cm(
    o: &Options,
    plan: Plan,
    device: &Device,
    (control, data): (ConnectionRequest, &mut dyn DataRequests),
    limits: &Limits,
    output: Output<'_>,
) -> Result<()> {
    let link = CmLink::accept(device, control)?;
    let exchange = Exchange::new(Link::RdmaCm(Box::new(link)), false);
    let end = End::new(o, exchange, false, limits);
    session(end, plan, device, Connect::Server(data), output)
}

/// Serves one `-R` client on `device`, as the server of [`run`] would, with the daemon's
/// limits: `control` is its control connection's request, `data` hands over its data
/// connections' ones.
pub fn serve_rdma_cm(
    o: &Options,
    device: &Device,
    (control, data): (ConnectionRequest, &mut dyn DataRequests),
    limits: &Limits,
    out: &mut dyn Write,
) -> Result<()> {
    let plan = Plan::new(o, false)?;
    serve_cm(
        o,
        plan,
        device,
        (control, data),
        limits,
        Output::new(out, o.json),
    )
}

/// The address of a server named on the command line.
fn resolve(host: &str) -> Result<IpAddr> {
    use std::net::ToSocketAddrs;
    (host, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .map(|a| a.ip())
        .ok_or_else(|| Error::Usage(format!("Couldn't resolve {host}")))
}

/// How the data QPs are connected: by modifying them with the exchanged keys (perftest's
/// `ctx_connect`), or by RDMA-CM (`-R`): the client connects to its server's port, the server
/// accepts on its listener.
enum Connect<'a> {
    Modify,
    Client(SocketAddr),
    Server(&'a mut dyn DataRequests),
}

/// Serves one client that `stream` has accepted, on `device`, as the server of [`run`] would:
/// the daemon's way in. `limits` bound its waits.
pub fn serve(
    o: &Options,
    device: &Device,
    stream: TcpStream,
    limits: &Limits,
    out: &mut dyn Write,
) -> Result<()> {
    let plan = Plan::new(o, false)?;
    limits.watch_connection(&stream)?;
    let output = Output::new(out, o.json);
    let end = End::new(o, Exchange::new(Link::Tcp(stream), false), false, limits);
    session(end, plan, device, Connect::Modify, output)
}

/// What a session starts from: its options, its exchange, its role and its limits.
struct End<'a> {
    o: &'a Options,
    exchange: Exchange,
    client: bool,
    limits: &'a Limits,
}

impl<'a> End<'a> {
    fn new(o: &'a Options, mut exchange: Exchange, client: bool, limits: &'a Limits) -> Self {
        exchange.set_limits(limits);
        End {
            o,
            exchange,
            client,
            limits,
        }
    }
}

/// The path MTU this side offers in the exchange (perftest's `set_mtu`): `-m`, or the port's
/// active MTU without it. A `-m` above the port's is lowered to it, and perftest says so in two
/// lines that show the MTU as its `enum ibv_mtu` value (3 for 1024).
fn offered_mtu(asked: Option<PathMtu>, port: PathMtu, output: &mut Output<'_>) -> Result<PathMtu> {
    match asked {
        Some(mtu) if mtu > port => {
            output.notice(&format!(
                "Requested mtu is higher than active mtu \nChanging to active mtu - {}",
                port.ibv_enum()
            ))?;
            Ok(port)
        }
        Some(mtu) => Ok(mtu),
        None => Ok(port),
    }
}

/// From the exchange's first round to the end of the test.
fn session(
    end: End<'_>,
    plan: Plan,
    device: &Device,
    connect: Connect<'_>,
    mut output: Output<'_>,
) -> Result<()> {
    let End {
        o,
        mut exchange,
        client,
        limits,
    } = end;
    let address = device.address();
    exchange.versions()?;
    let (page, cache_line) = exchange.sys_data(PAGE_SIZE, CACHE_LINE)?;
    let mtu = exchange.mtu(offered_mtu(o.mtu, device.port_mtu(), &mut output)?)?;
    let mut ctx = Context::open(device, o, &plan, (page.into(), cache_line.into()), limits)?;
    let rdma_cm = !matches!(connect, Connect::Modify);
    if rdma_cm {
        // `create_rdma_cm_connection`: a round of zeros, the data connections, another.
        let options = qp_options(o.test.verb(), mtu, plan.out_reads);
        match connect {
            Connect::Client(peer) => {
                exchange.zeros()?;
                ctx.connect_rdma_cm(peer, &options)?;
            }
            Connect::Server(data) => {
                // Ready for them before the zeros that let the client connect.
                data.expect(exchange.peer_address(), o.qps);
                exchange.zeros()?;
                ctx.accept_rdma_cm(data, &options)?;
            }
            Connect::Modify => {}
        }
        exchange.zeros()?;
    }
    output.info(&TestInfo {
        title: title(o),
        device: address.to_string(),
        qps: o.qps,
        tx_depth: client.then_some(plan.tx_depth),
        rx_depth: (o.test.verb() == Verb::Send && !client).then_some(plan.rx_depth),
        cq_mod: o.test.is_bw().then_some(plan.cq_mod),
        mtu: mtu.bytes(),
        gid_index: o.gid_index,
        out_reads: matches!(o.test.verb(), Verb::Read | Verb::Atomic).then_some(plan.out_reads),
        rdma_cm,
        server: !client,
    })?;
    let mut session = Session {
        o,
        plan,
        client,
        mtu,
        exchange,
        ctx,
        output,
        mine: Vec::new(),
        theirs: Vec::new(),
    };
    session.handshake()?;
    let qpns = session.ctx.qps.iter().map(|qp| qp.qpn()).collect();
    let activity = PeerActivity::new(device, qpns, limits);
    session.exchange.watch_reads(activity)?;
    match o.test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => session.remote_report_bw()?,
        Test::SendBw => session.send_bw()?,
        Test::WriteLat => session.write_lat()?,
        Test::ReadLat => session.read_lat()?,
        Test::SendLat => session.send_lat()?,
    }
    session.output.finish()?;
    Ok(())
}

/// perftest's QP attributes: access for the test's verb, timeout 14, retry and RNR retry 7,
/// RNR timer 12, and `out_reads` READs and atomics outstanding each way (at least 1, at most
/// what the transport takes).
fn qp_options(verb: Verb, mtu: PathMtu, out_reads: u16) -> ConnectOptions {
    let access = match verb {
        Verb::Write => Access::REMOTE_WRITE,
        Verb::Read => Access::REMOTE_READ,
        Verb::Atomic => Access::REMOTE_ATOMIC,
        Verb::Send => Access::REMOTE_WRITE | Access::LOCAL_WRITE,
    };
    ConnectOptions {
        mtu: Some(mtu),
        access,
        timeout: QP_TIMEOUT,
        retry_cnt: RETRY_COUNT,
        rnr_retry: RETRY_COUNT,
        min_rnr_timer: RnrTimer::new(MIN_RNR_TIMER),
        max_rd_atomic: out_reads.clamp(1, MAX_RD_ATOMIC.into()) as u8,
    }
}

/// The test's line in the header block: "RDMA_Write BW Test", "Atomic FETCH_AND_ADD BW Test".
fn title(o: &Options) -> String {
    let verb = match o.test.verb() {
        Verb::Send => "Send".to_string(),
        Verb::Write => "RDMA_Write".to_string(),
        Verb::Read => "RDMA_Read".to_string(),
        Verb::Atomic => format!("Atomic {}", o.atomic.name()),
    };
    let kind = if o.test.is_bw() { "BW" } else { "Latency" };
    format!("{verb} {kind} Test")
}

/// `ceil(size / cache_line) * cache_line`, at least a cache line: how far apart consecutive
/// messages are placed (perftest's `INC`).
fn stride(size: u64, cache_line: u64) -> u64 {
    size.div_ceil(cache_line).max(1) * cache_line
}

/// Where the `k`th message of a bandwidth run goes, from the start of a slice: messages of up
/// to half a page step through the page by cache lines (`increase_loc_addr`,
/// `increase_rem_addr`), larger ones all use the start. The exchange keeps a cache line below
/// half a page; at least one place is kept whatever the values.
fn cycled(size: u64, k: u64, cycle: u64, cache_line: u64) -> u64 {
    if size > cycle / 2 {
        return 0;
    }
    let stride = stride(size, cache_line);
    k % (cycle / stride).max(1) * stride
}

/// The bytes a session registers (`ctx_init`): a send half and a receive half, one slice per
/// QP in each, of the largest message or the page (`cycle`), whichever is larger, rounded up
/// to the cache line.
fn buffer_len(o: &Options, max_size: u64, (cycle, cache_line): (u64, u64)) -> u64 {
    stride(max_size.max(cycle), cache_line) * 2 * o.qps as u64
}

/// What a server session of `o` registers at least: with this side's own page and cache-line
/// sizes, which a client can only raise. The daemon checks it against its caps at start.
pub fn least_buffer_len(o: &Options) -> Result<u64> {
    let plan = Plan::new(o, false)?;
    Ok(buffer_len(
        o,
        plan.max_size,
        (PAGE_SIZE.into(), CACHE_LINE.into()),
    ))
}

#[cfg(test)]
mod tests {
    use super::context::DataCheck;
    use super::*;

    /// perftest's `set_mtu`: `-m` up to the port's active MTU, the port's without `-m`.
    #[test]
    fn offered_mtu_is_at_most_the_ports() {
        let mut text = Vec::new();
        let mut output = Output::new(&mut text, false);
        let mut offer = |asked| offered_mtu(asked, PathMtu::Mtu1024, &mut output).unwrap();
        assert_eq!(offer(None), PathMtu::Mtu1024);
        assert_eq!(offer(Some(PathMtu::Mtu512)), PathMtu::Mtu512);
        assert_eq!(offer(Some(PathMtu::Mtu1024)), PathMtu::Mtu1024);
        assert_eq!(offer(Some(PathMtu::Mtu4096)), PathMtu::Mtu1024);
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "Requested mtu is higher than active mtu \nChanging to active mtu - 3\n"
        );
    }

    /// `--check-data` accepts bytes that landed as sent or not at all, and names the first
    /// that did neither: torn, misplaced or missing where the first message must be.
    #[test]
    fn the_data_check_finds_a_byte_out_of_place() {
        let device = crate::verbs::Device::open(crate::verbs::DeviceConfig::udp(
            "127.0.0.120".parse().unwrap(),
        ))
        .unwrap();
        let pd = device.alloc_pd().unwrap();
        let (slice, qps) = (256, 2);
        let mr = pd
            .register(slice as usize * 2 * qps, Access::LOCAL_WRITE)
            .unwrap();
        let check = DataCheck::ClientToServer;
        check.fill(&mr, slice, qps).unwrap();
        // What a WRITE of 100 bytes at offset 0 of QP 1's slice leaves on the server.
        let landing: Vec<u64> = check.landing(qps, slice).collect();
        let sent: Vec<u8> = (0..100).map(DataCheck::byte).collect();
        mr.write(landing[1] as usize, &sent).unwrap();
        mr.write(landing[0] as usize, &sent).unwrap();
        assert_eq!(check.verify(&mr, qps, slice, 100).unwrap(), 200);
        let nothing = check.verify(&mr, qps, slice, 101).unwrap_err().to_string();
        assert!(nothing.contains("byte 100 of QP 0"), "{nothing}");
        mr.write(landing[1] as usize + 7, &[DataCheck::byte(8)])
            .unwrap();
        let torn = check.verify(&mr, qps, slice, 100).unwrap_err().to_string();
        assert!(torn.contains("byte 7 of QP 1"), "{torn}");
    }

    #[test]
    fn plans_follow_perftests_rules() {
        let server = |test| Plan::new(&Options::new(test), false).unwrap();
        let write = server(Test::WriteBw);
        assert_eq!(write.sizes, [65536]);
        assert_eq!((write.iters, write.tx_depth, write.cq_mod), (5000, 128, 1));
        let atomic = server(Test::AtomicBw);
        assert_eq!(
            (atomic.sizes[0], atomic.cq_mod, atomic.out_reads),
            (8, 100, 128)
        );
        let send = server(Test::SendBw);
        assert_eq!((send.rx_depth, send.no_peak), (512, true));
        let client = |o: &Options| Plan::new(o, true).unwrap();
        let mut o = Options::new(Test::WriteBw);
        assert!(!client(&o).no_peak, "a peak within 20000 iterations");
        o.no_peak = true;
        assert!(client(&o).no_peak, "-N");
        let mut o = Options::new(Test::SendLat);
        o.no_peak = true;
        assert!(
            Plan::new(&o, true).is_err(),
            "-N is refused where perftest refuses it"
        );
        let lat = server(Test::SendLat);
        assert_eq!((lat.sizes[0], lat.tx_depth, lat.cq_mod), (2, 1, 1));

        let mut o = Options::new(Test::SendBw);
        o.iters = Some(5);
        o.size = Some(64);
        let few = Plan::new(&o, true).unwrap();
        // rx depth: the iterations, made even.
        assert_eq!((few.tx_depth, few.rx_depth, few.cq_mod), (5, 6, 5));

        o.all_sizes = true;
        let all = Plan::new(&o, true).unwrap();
        assert_eq!(all.sizes.len(), 23);
        assert_eq!((all.sizes[0], all.max_size), (2, MAX_SIZE));

        let refused = |o: &Options| Plan::new(o, true).unwrap_err().to_string();
        o.duration = Some(4);
        assert!(refused(&o).contains("Duration mode"));
        let mut atomic = Options::new(Test::AtomicBw);
        atomic.size = Some(16);
        assert!(refused(&atomic).contains("Atomic"));
        let mut lat = Options::new(Test::WriteLat);
        lat.qps = 2;
        assert!(refused(&lat).contains("Multiple QPs"));
    }

    #[test]
    fn timing_is_a_quarter_each_side() {
        let timing = Timing::new(4);
        assert_eq!(timing.phase(Duration::from_millis(999)), Phase::Warmup);
        assert_eq!(timing.phase(Duration::from_millis(1000)), Phase::Sample);
        assert_eq!(timing.phase(Duration::from_millis(3000)), Phase::Cooldown);
        assert_eq!(timing.phase(Duration::from_millis(4000)), Phase::End);
        assert_eq!(timing.sample_ns(), (1_000_000_000, 3_000_000_000));
        // Under 4 s the margin is 0 s: all of it is sampled.
        assert_eq!(Timing::new(3).phase(Duration::ZERO), Phase::Sample);
    }

    #[test]
    fn messages_cycle_through_a_page() {
        assert_eq!(stride(2, 64), 64);
        assert_eq!(stride(65, 64), 128);
        assert_eq!(stride(65536, 64), 65536);
        // 100-byte messages 128 bytes apart: 32 fit in a page, then the first place again.
        assert_eq!(cycled(100, 1, 4096, 64), 128);
        assert_eq!(cycled(100, 31, 4096, 64), 31 * 128);
        assert_eq!(cycled(100, 32, 4096, 64), 0);
        // Over half a page: always the start.
        assert_eq!(cycled(2049, 7, 4096, 64), 0);
    }

    #[test]
    fn titles_are_perftests() {
        assert_eq!(
            title(&Options {
                atomic: AtomicOp::CompareSwap,
                ..Options::new(Test::AtomicBw)
            }),
            "Atomic CMP_AND_SWAP BW Test"
        );
        assert_eq!(title(&Options::new(Test::SendLat)), "Send Latency Test");
    }
}
