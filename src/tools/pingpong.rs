//! `softroce rc-pingpong`, `uc-pingpong` and `ud-pingpong`: rdma-core's `ibv_rc_pingpong`,
//! `ibv_uc_pingpong` and `ibv_ud_pingpong` (libibverbs/examples, rdma-core 44), over softroce.
//!
//! Either side may be softroce or rdma-core. What the peer sees is what those programs do:
//!
//! - the out-of-band exchange of [`super::oob`], the server answering once its QP can receive;
//! - one QP with `rx_depth` receives posted, a send queue of one, a CQ of `rx_depth + 1`, and one
//!   buffer filled with 0x7b that every receive lands in and every send goes out from, so the
//!   server echoes what it got;
//! - the client sends first; each side sends again once its previous send has completed and a
//!   receive has completed, until it has sent and received `iters` messages. Receives are
//!   topped up to `rx_depth` when one is left;
//! - RC: path MTU from `-m`, no remote access, timeout 14, retry and RNR retry 7, RNR timer 12,
//!   one READ/atomic each way; UC: the path MTU; UD: Q_Key 0x11111111, an address handle to the
//!   peer's GID, sends of `size` bytes from after the 40-byte GRH area that receives begin with.
//!
//! A softroce device has one GID: its address, which [`gid_of`] gives (`::ffff:a.b.c.d` for an
//! IPv4 address, what rxe holds at GID index 1). It is sent whatever `-g` says, and also
//! without `-g`, where rdma-core sends a zero GID that RoCE cannot route. The peer's GID is
//! turned back into an IP address the same way.

use std::fmt;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::oob::{self, Dest, DEFAULT_PORT};
use super::{failed, peer_address, DeviceOptions, Error, Limits, Reservation, Result, Watch};
use crate::memory::{Access, MemoryRegion};
use crate::transport::{
    PathMtu, QpAttr, QpState, QpType, RecvWr, SendWr, UdDest, WcStatus, WorkCompletion, GRH_LEN,
};
use crate::verbs::{self, CompletionQueue, ConnectOptions, Device, QpEndpoint, QueuePair};
use crate::wire::{QKey, RnrTimer};

/// The Q_Key `ibv_ud_pingpong` gives its QP and sends with.
pub const UD_QKEY: QKey = QKey(0x1111_1111);
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// What rdma-core fills its buffer with before the test.
const FILL_BYTE: u8 = 0x7b;
/// `sysconf(_SC_PAGESIZE)` on x86-64, the stride at which `-c` marks and checks the buffer.
const PAGE_SIZE: usize = 4096;
/// The byte `-c` puts at the start of each page: rdma-core writes `i / page_size %
/// sizeof(char)`, which is 0 whatever the page.
const CHECK_BYTE: u8 = 0;
/// How long one wait on the completion channel lasts before it is repeated: rdma-core sleeps
/// until a completion comes, however long that takes.
const EVENT_WAIT: Duration = Duration::from_secs(1);

/// Which of the three programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `ibv_rc_pingpong`: a Reliable Connected QP.
    Rc,
    /// `ibv_uc_pingpong`: an Unreliable Connected QP.
    Uc,
    /// `ibv_ud_pingpong`: an Unreliable Datagram QP and an address handle.
    Ud,
}

impl Transport {
    /// The subcommand: `rc-pingpong`, `uc-pingpong`, `ud-pingpong`.
    pub fn tool_name(self) -> &'static str {
        match self {
            Transport::Rc => "rc-pingpong",
            Transport::Uc => "uc-pingpong",
            Transport::Ud => "ud-pingpong",
        }
    }

    /// The message size when none is given. `ibv_ud_pingpong`'s help says 2048, but its code
    /// uses 1024.
    pub fn default_size(self) -> usize {
        match self {
            Transport::Rc | Transport::Uc => 4096,
            Transport::Ud => 1024,
        }
    }

    fn qp_type(self) -> QpType {
        match self {
            Transport::Rc => QpType::Rc,
            Transport::Uc => QpType::Uc,
            Transport::Ud => QpType::Ud,
        }
    }

    /// Where the message starts in the buffer: UD receives begin with the 40-byte GRH area.
    fn offset(self) -> usize {
        match self {
            Transport::Ud => GRH_LEN,
            Transport::Rc | Transport::Uc => 0,
        }
    }
}

/// What to run: the options of rdma-core's programs, and the device's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Which of the three programs runs.
    pub transport: Transport,
    /// The server to connect to (a host name or address); `None` makes this side the server.
    pub server: Option<String>,
    /// The TCP port of the exchange.
    pub port: u16,
    /// The message size in bytes.
    pub size: usize,
    /// The path MTU of RC and UC (UD messages are bounded by the device's port MTU instead).
    pub mtu: PathMtu,
    /// Receives kept posted.
    pub rx_depth: usize,
    /// Messages each way.
    pub iters: u32,
    /// Sleep on the completion channel instead of polling the CQ.
    pub events: bool,
    /// `-c`: the client marks the start of each page of what it sends, the server checks the
    /// marks in what it received last and prints `invalid data in page N` for each one missing.
    pub validate: bool,
    /// How the device is opened: softroce's `--bind`, `--backend` and `--pcap`.
    pub device: DeviceOptions,
}

impl Options {
    /// rdma-core's defaults: a server on port 18515, 1000 messages, a receive depth of 500,
    /// path MTU 1024, polling.
    pub fn new(transport: Transport) -> Self {
        Options {
            transport,
            server: None,
            port: DEFAULT_PORT,
            size: transport.default_size(),
            mtu: PathMtu::Mtu1024,
            rx_depth: 500,
            iters: 1000,
            events: false,
            validate: false,
            device: DeviceOptions::default(),
        }
    }
}

/// `pp_mtu_to_enum`: the path MTU of a size in bytes, if it is one.
pub fn path_mtu(bytes: u64) -> Option<PathMtu> {
    Some(match bytes {
        256 => PathMtu::Mtu256,
        512 => PathMtu::Mtu512,
        1024 => PathMtu::Mtu1024,
        2048 => PathMtu::Mtu2048,
        4096 => PathMtu::Mtu4096,
        _ => return None,
    })
}

/// The GID of a device address: IPv4-mapped for IPv4, the address itself for IPv6.
pub fn gid_of(address: IpAddr) -> Ipv6Addr {
    match address {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// What a run measured: printed as rdma-core's two result lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Bytes moved both ways: size × iters × 2.
    pub bytes: u64,
    /// Messages each way (`-n`), as the `iters in` line shows.
    pub iters: u32,
    /// From after the client's first send to the last completion; printed in whole µs.
    pub elapsed: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Whole microseconds, as rdma-core's gettimeofday gives them.
        let usec = self.elapsed.as_micros() as f64;
        let seconds = usec / 1e6;
        writeln!(
            f,
            "{} bytes in {seconds:.2} seconds = {:.2} Mbit/sec",
            self.bytes,
            self.bytes as f64 * 8.0 / usec
        )?;
        write!(
            f,
            "{} iters in {seconds:.2} seconds = {:.2} usec/iter",
            self.iters,
            usec / f64::from(self.iters)
        )
    }
}

/// Runs one side to the end, printing to `out` what rdma-core prints to standard output: the
/// local and remote address lines, the result lines and, with `validate` on the server, a line
/// per page whose mark is missing.
pub fn run(o: &Options, out: &mut dyn Write) -> Result<Report> {
    check(o)?;
    enum Role<'a> {
        Client(&'a str),
        Server(TcpListener),
    }
    // The server listens before it opens the device, so that once its local address line is
    // out a client may connect.
    let role = match &o.server {
        Some(host) => Role::Client(host),
        None => Role::Server(listen(o.port, o.device.bind)?),
    };
    let limits = Limits::default();
    let open = |address: IpAddr, out: &mut dyn Write| -> Result<Context> {
        let ctx = Context::open(o, &o.device.open(address)?, &limits)?;
        ctx.announce(out)?;
        Ok(ctx)
    };
    // With --bind, the device is set up first, as rdma-core does; without, the TCP connection
    // tells which local address the peer reaches.
    let early = o
        .device
        .bind
        .map(|address| open(address, out))
        .transpose()?;
    let (stream, client) = match role {
        Role::Client(host) => (connect(host, o.port)?, true),
        Role::Server(listener) => (accept(listener)?, false),
    };
    let ctx = match early {
        Some(ctx) => ctx,
        None => open(local_address(&stream)?, out)?,
    };
    session(o, ctx, stream, client, out)
}

/// Serves one client that `stream` has accepted, on `device`, as the server of [`run`] would:
/// the daemon's way in. `limits` bound its waits.
pub fn serve(
    o: &Options,
    device: &Device,
    stream: TcpStream,
    limits: &Limits,
    out: &mut dyn Write,
) -> Result<Report> {
    check(o)?;
    limits.watch_connection(&stream)?;
    let ctx = Context::open(o, device, limits)?;
    ctx.announce(out)?;
    session(o, ctx, stream, false, out)
}

/// The options rdma-core refuses before it starts.
fn check(o: &Options) -> Result<()> {
    // No port carries a larger UD message. Refused here, before any TCP, since without --bind
    // the device, and so its own port MTU (checked in `Context::open`), comes after it.
    check_ud_size(o, PathMtu::Mtu4096)?;
    if o.rx_depth == 0 {
        return Err(Error::Usage("the receive depth must be at least 1".into()));
    }
    Ok(())
}

/// A UD message is one packet: ibv_ud_pingpong refuses a size over its port's MTU once it has
/// queried the port, before it creates anything.
fn check_ud_size(o: &Options, port_mtu: PathMtu) -> Result<()> {
    let mtu = port_mtu.bytes();
    if o.transport == Transport::Ud && o.size > mtu {
        return Err(Error::Usage(format!(
            "Requested size larger than port MTU ({mtu})"
        )));
    }
    Ok(())
}

/// The local address of the exchange's connection: the one the peer reaches this host at.
pub(super) fn local_address(stream: &TcpStream) -> Result<IpAddr> {
    let local = stream
        .local_addr()
        .map_err(|e| Error::Exchange(format!("the TCP connection's address: {e}")))?;
    Ok(local.ip().to_canonical())
}

/// From the exchange on the connected `stream` to the result lines.
fn session(
    o: &Options,
    mut ctx: Context,
    mut stream: TcpStream,
    client: bool,
    out: &mut dyn Write,
) -> Result<Report> {
    let me = ctx.me;
    let remote = if client {
        oob::client_exchange(&mut stream, &me)?
    } else {
        let idle = ctx.watch.limits.idle;
        oob::server_exchange(&mut stream, &me, idle, |client| ctx.connect(client, o.mtu))?
    };
    drop(stream);
    writeln!(
        out,
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        remote.lid,
        remote.qpn.value(),
        remote.psn.value(),
        remote.gid
    )?;
    if client {
        ctx.connect(&remote, o.mtu)?;
    }
    let elapsed = ctx.ping_pong(client, o)?;
    let report = Report {
        bytes: o.size as u64 * u64::from(o.iters) * 2,
        iters: o.iters,
        elapsed,
    };
    writeln!(out, "{report}")?;
    if !client && o.validate {
        for page in ctx.unmarked_pages() {
            writeln!(out, "invalid data in page {page}")?;
        }
    }
    // No closing round follows the last message: the QP stays to acknowledge it again if our
    // ACK was lost.
    if ctx.transport == Transport::Rc {
        super::answer_late_resends(&ctx.device, ctx.qp.qpn(), &ctx.cq)?;
    }
    Ok(report)
}

pub(super) fn listen(port: u16, bind: Option<IpAddr>) -> Result<TcpListener> {
    // On every address of the device's family, as rdma-core listens on every address.
    let any: IpAddr = match bind {
        Some(IpAddr::V6(_)) => Ipv6Addr::UNSPECIFIED.into(),
        _ => Ipv4Addr::UNSPECIFIED.into(),
    };
    TcpListener::bind((any, port))
        .map_err(|e| Error::Exchange(format!("Couldn't listen to port {port}: {e}")))
}

pub(super) fn accept(listener: TcpListener) -> Result<TcpStream> {
    // One client: the listener closes once it has one, as rdma-core's does.
    let (stream, _) = listener
        .accept()
        .map_err(|e| Error::Exchange(format!("accept() failed: {e}")))?;
    Ok(stream)
}

pub(super) fn connect(host: &str, port: u16) -> Result<TcpStream> {
    TcpStream::connect((host, port))
        .map_err(|e| Error::Exchange(format!("Couldn't connect to {host}:{port}: {e}")))
}

/// The bytes a session registers: the message, and for UD the 40 bytes of the GRH before it.
pub fn buffer_len(o: &Options) -> usize {
    o.transport.offset() + o.size
}

/// One side's device, queue pair and buffer (`struct pingpong_context`).
struct Context {
    device: Device,
    transport: Transport,
    size: usize,
    rx_depth: usize,
    pd: verbs::ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qp: QueuePair,
    me: Dest,
    /// Where UD sends go, once the peer is known; `None` on connected QPs.
    ud: Option<UdDest>,
    watch: Watch,
    /// The buffer's share of the daemon's memory budget, given back with the context.
    _memory: Option<Reservation>,
}

impl Drop for Context {
    /// The address handle goes with the run: a daemon serves many (the rest of the context
    /// frees itself with its handles).
    fn drop(&mut self) {
        if let Some(ud) = &self.ud {
            let _ = self.pd.destroy_ah(ud.ah);
        }
    }
}

impl Context {
    /// `pp_init_ctx` and the first receives: a device on `address`, the QP in INIT with
    /// `rx_depth` receives posted.
    fn open(o: &Options, device: &Device, limits: &Limits) -> Result<Context> {
        check_ud_size(o, device.port_mtu())?;
        let len = buffer_len(o);
        let memory = limits.reserve(len as u64)?;
        let pd = device.alloc_pd().map_err(failed("Couldn't allocate PD"))?;
        let mr = pd
            .register(len, Access::LOCAL_WRITE)
            .map_err(failed("Couldn't register MR"))?;
        mr.write(0, &vec![FILL_BYTE; len])
            .map_err(failed("Couldn't fill the buffer"))?;
        let cq = device
            .create_cq(o.rx_depth + 1)
            .map_err(failed("Couldn't create CQ"))?;
        let qp = pd
            .create_qp()
            .qp_type(o.transport.qp_type())
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(1)
            .max_recv_wr(o.rx_depth)
            .qkey(UD_QKEY)
            .build()
            .map_err(failed("Couldn't create QP"))?;
        // INIT before the receives are posted: a QP in RESET takes none.
        let ud = o.transport == Transport::Ud;
        qp.modify(&QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: (!ud).then_some(Access::NONE),
            qkey: ud.then_some(UD_QKEY),
            ..Default::default()
        })
        .map_err(failed("Failed to modify QP to INIT"))?;
        let me = Dest {
            lid: 0,
            qpn: qp.qpn(),
            psn: qp.endpoint().psn,
            gid: gid_of(device.address()),
        };
        let ctx = Context {
            device: device.clone(),
            transport: o.transport,
            size: o.size,
            rx_depth: o.rx_depth,
            pd,
            cq,
            mr,
            qp,
            me,
            ud: None,
            watch: Watch::new(limits),
            _memory: memory,
        };
        let posted = ctx.post_recvs(o.rx_depth);
        if posted < o.rx_depth {
            return Err(Error::PostRecv { posted });
        }
        Ok(ctx)
    }

    /// The local address line.
    fn announce(&self, out: &mut dyn Write) -> Result<()> {
        // ibv_ud_pingpong prints a colon before the GID where the others print a comma.
        let separator = if self.transport == Transport::Ud {
            ':'
        } else {
            ','
        };
        writeln!(
            out,
            "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{separator} GID {}",
            self.me.lid,
            self.me.qpn.value(),
            self.me.psn.value(),
            self.me.gid
        )?;
        Ok(())
    }

    /// `pp_connect_ctx`: RTR and RTS towards the peer, or for UD, RTS and an address handle.
    fn connect(&mut self, peer: &Dest, mtu: PathMtu) -> Result<()> {
        let addr = peer_address(peer.gid, self.me.gid.to_canonical(), "peer")?;
        if self.transport == Transport::Ud {
            self.qp
                .ready_datagram()
                .map_err(failed("Failed to modify QP to RTS"))?;
            let ah = self
                .pd
                .create_ah(addr)
                .map_err(failed("Failed to create AH"))?;
            self.ud = Some(UdDest {
                ah,
                remote_qpn: peer.qpn,
                remote_qkey: UD_QKEY,
            });
            return Ok(());
        }
        let options = ConnectOptions {
            mtu: Some(mtu),
            access: Access::NONE,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: RnrTimer::new(12),
            max_rd_atomic: 1,
        };
        let remote = QpEndpoint {
            addr,
            qpn: peer.qpn,
            psn: peer.psn,
            mtu,
            qkey: UD_QKEY,
        };
        self.qp
            .connect(&remote, &options)
            .map_err(failed("Couldn't connect to remote QP"))
    }

    /// Posts up to `n` receives, stopping at the first refused; returns how many were posted.
    fn post_recvs(&self, n: usize) -> usize {
        let Ok(sge) = self.mr.sge(0, self.transport.offset() + self.size) else {
            return 0;
        };
        let wr = RecvWr::new(RECV_WRID, sge);
        (0..n)
            .take_while(|_| self.qp.post_recv(wr.clone()).is_ok())
            .count()
    }

    fn post_send(&self) -> Result<()> {
        let sge = self
            .mr
            .sge(self.transport.offset(), self.size)
            .map_err(failed("Couldn't post send"))?;
        let mut wr = SendWr::send(SEND_WRID, sge);
        wr.ud = self.ud;
        self.qp.post_send(wr).map_err(failed("Couldn't post send"))
    }

    /// The next one or two completions, polling or sleeping on the completion channel.
    fn next_completions(&self, events: bool, wcs: &mut Vec<WorkCompletion>) -> Result<()> {
        if events {
            let first = loop {
                let waited = self.cq.wait(EVENT_WAIT);
                if let Some(wc) = waited.map_err(failed("Failed to get cq_event"))? {
                    break wc;
                }
                self.watch.nothing()?;
            };
            wcs.push(first);
            self.cq
                .poll(wcs, 1)
                .map_err(failed("Failed to poll completions"))?;
        } else {
            // rdma-core spins on the CQ.
            while self
                .cq
                .poll(wcs, 2)
                .map_err(failed("Failed to poll completions"))?
                == 0
            {
                self.watch.nothing()?;
            }
        }
        self.watch.heard();
        Ok(())
    }

    /// The test: returns the time from the first send to the last completion.
    fn ping_pong(&self, client: bool, o: &Options) -> Result<Duration> {
        let iters = o.iters;
        let mut pending = RECV_WRID;
        if client {
            if o.validate {
                for page in (0..self.size).step_by(PAGE_SIZE) {
                    self.mr
                        .write(self.transport.offset() + page, &[CHECK_BYTE])
                        .map_err(failed("Couldn't mark the buffer"))?;
                }
            }
            self.post_send()?;
            pending |= SEND_WRID;
        }
        let start = Instant::now();
        let (mut received, mut sent) = (0, 0);
        let mut posted = self.rx_depth;
        let mut wcs = Vec::with_capacity(2);
        while received < iters || sent < iters {
            self.next_completions(o.events, &mut wcs)?;
            for wc in wcs.drain(..) {
                if wc.status != WcStatus::Success {
                    return Err(Error::Completion {
                        wr_id: wc.wr_id,
                        status: wc.status,
                    });
                }
                // Only two kinds of request are ever posted: this send and the receives.
                if wc.wr_id == SEND_WRID {
                    sent += 1;
                } else {
                    posted -= 1;
                    if posted <= 1 {
                        posted += self.post_recvs(self.rx_depth - posted);
                        if posted < self.rx_depth {
                            return Err(Error::PostRecv { posted });
                        }
                    }
                    received += 1;
                }
                pending &= !wc.wr_id;
                if sent < iters && pending == 0 {
                    self.post_send()?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        Ok(start.elapsed())
    }

    /// With `-c`, the pages whose first byte is not the client's mark.
    fn unmarked_pages(&self) -> Vec<usize> {
        let buffer = self.mr.to_vec();
        let message = &buffer[self.transport.offset()..];
        (0..self.size)
            .step_by(PAGE_SIZE)
            .filter(|&at| message[at] != CHECK_BYTE)
            .map(|at| at / PAGE_SIZE)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::DeviceConfig;

    /// The device's own port MTU bounds a UD message: 1024 here, below what any check made
    /// before the device opens allows.
    #[test]
    fn ud_sizes_over_the_devices_port_mtu_are_refused() {
        let device = Device::open(DeviceConfig {
            port_mtu: Some(PathMtu::Mtu1024),
            ..DeviceConfig::udp("127.0.0.34".parse().unwrap())
        })
        .unwrap();
        let mut o = Options::new(Transport::Ud);
        o.size = 1025;
        let limits = Limits::default();
        let refused = Context::open(&o, &device, &limits).err().unwrap();
        assert_eq!(
            refused.to_string(),
            "Requested size larger than port MTU (1024)"
        );
        o.size = 1024;
        assert!(Context::open(&o, &device, &limits).is_ok());
    }

    #[test]
    fn result_lines_are_rdma_cores() {
        let report = Report {
            bytes: 819_200,
            iters: 100,
            elapsed: Duration::from_micros(40_000),
        };
        assert_eq!(
            report.to_string(),
            "819200 bytes in 0.04 seconds = 163.84 Mbit/sec\n\
             100 iters in 0.04 seconds = 400.00 usec/iter"
        );
    }

    #[test]
    fn gids_and_mtus() {
        let v4: IpAddr = "10.99.0.1".parse().unwrap();
        assert_eq!(gid_of(v4).to_string(), "::ffff:10.99.0.1");
        assert_eq!(IpAddr::from(gid_of(v4)).to_canonical(), v4);
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(IpAddr::V6(gid_of(v6)), v6);
        assert_eq!(path_mtu(2048), Some(PathMtu::Mtu2048));
        assert_eq!(path_mtu(1500), None);
    }
}
