//! `softroce rping`: librdmacm's `rping` (rdma-core, `librdmacm/examples/rping.c`) over
//! softroce, connected by RDMA-CM, so that either side may be softroce or `rping` on kernel
//! rxe or a ConnectX NIC.
//!
//! The protocol of each ping, as rping's: the client SENDs the address, rkey and size of its
//! source buffer (16 bytes, big-endian: `struct rping_rdma_info`); the server READs it and
//! SENDs a "go ahead" (16 zero bytes); the client SENDs its sink buffer's description; the
//! server WRITEs what it read there and SENDs another "go ahead". Each side keeps one receive
//! posted. The client fills its source with rping's text (`rdma-ping-N: ` and a rotating run of
//! letters), checks the sink against it with `-V` and prints it with `-v`; it ends with a DREQ
//! after `-C` pings (0: for ever). The server serves one connection (`-P`: one after another)
//! and ends when its client disconnects, with rping's two lines on standard error.
//!
//! Errors from the CM are reported as rping reports them (`cma event RDMA_CM_EVENT_REJECTED,
//! error 8`), and end the run with rping's status, 255.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::{failed, DeviceOptions, Error, Limits, Result, Watch};
use crate::memory::{Access, MemoryRegion};
use crate::transport::{
    ConnectOptions, PathMtu, Payload, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use crate::verbs::{self, CompletionQueue, Connection, Device, ProtectionDomain, QueuePair};
use crate::wire::RKey;

/// rping's port.
pub const DEFAULT_PORT: u16 = 7174;
/// rping's buffer size.
pub const DEFAULT_SIZE: usize = 64;
/// `RPING_MIN_BUFSIZE`: room for the text and a ping number.
pub const MIN_SIZE: usize = 23;
/// `RPING_BUFSIZE - 1`.
pub const MAX_SIZE: usize = 65535;
/// `struct rping_rdma_info`: address (8), rkey (4), size (4).
const INFO_LEN: usize = 16;

/// How rping runs; the fields are its flags.
#[derive(Debug, Clone)]
pub struct Options {
    /// `-s`; otherwise `-c`.
    pub server: bool,
    /// `-a`: the address to listen on (the server's device), or the server to connect to.
    pub addr: Option<IpAddr>,
    /// `-I`: the client's source address (its device).
    pub source: Option<IpAddr>,
    /// `-p`.
    pub port: u16,
    /// `-S`.
    pub size: usize,
    /// `-C`: pings, 0 for ever (the client's; the server serves what comes).
    pub count: u32,
    /// `-v`: print the ping data.
    pub verbose: bool,
    /// `-V`: check the ping data.
    pub validate: bool,
    /// `-d`: debug lines.
    pub debug: bool,
    /// `-P`: serve connections one after another, for ever.
    pub persistent: bool,
    /// softroce's: the path MTU a client's REQ asks for; `None`, the port's.
    pub mtu: Option<PathMtu>,
    /// How the device is opened: softroce's `--bind` (`-a` or `-I` comes first), `--backend`,
    /// `--pcap`.
    pub device: DeviceOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            server: false,
            addr: None,
            source: None,
            port: DEFAULT_PORT,
            size: DEFAULT_SIZE,
            count: 0,
            verbose: false,
            validate: false,
            debug: false,
            persistent: false,
            mtu: None,
            device: DeviceOptions::default(),
        }
    }
}

/// rping's connection parameters (`rping_init_conn_param`): one READ each way, seven
/// retries of each kind; the path MTU is `--mtu` or the port's.
fn conn_options(o: &Options, device: &Device) -> ConnectOptions {
    ConnectOptions {
        mtu: Some(o.mtu.unwrap_or(device.port_mtu()).min(device.port_mtu())),
        max_rd_atomic: 1,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOptions::default()
    }
}

/// The text of ping `ping`, as `rping_test_client` writes it: `rdma-ping-N: `, then letters
/// from `start` on, `A` again after `z`, and a NUL in the last byte.
pub fn ping_text(ping: u32, start: u8, size: usize) -> Vec<u8> {
    let mut text = format!("rdma-ping-{ping}: ").into_bytes();
    text.truncate(size);
    let mut c = start;
    while text.len() < size {
        text.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = text.last_mut() {
        *last = 0;
    }
    text
}

/// The bytes of a NUL-terminated buffer, before its NUL: what rping's `%s` prints.
fn c_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// `struct rping_rdma_info` for `len` bytes at `offset` into `region`.
fn info(region: &MemoryRegion, offset: usize, len: usize) -> [u8; INFO_LEN] {
    let mut bytes = [0; INFO_LEN];
    bytes[..8].copy_from_slice(&(region.iova() + offset as u64).to_be_bytes());
    bytes[8..12].copy_from_slice(&region.rkey().0.to_be_bytes());
    bytes[12..].copy_from_slice(&(len as u32).to_be_bytes());
    bytes
}

/// Runs rping: the server or the client, as `o.server` says.
pub fn run(o: &Options, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&o.size) {
        return Err(Error::Usage(format!(
            "Invalid size {} (valid range is {MIN_SIZE} to {})",
            o.size,
            MAX_SIZE + 1
        )));
    }
    let result = if o.server {
        server(o, out, err)
    } else {
        client(o, out)
    };
    if let Err(Error::Device {
        error: verbs::Error::ConnectFailed { failure, .. },
        ..
    }) = &result
    {
        let (event, status) = super::cm_event(failure);
        let _ = writeln!(err, "cma event {event}, error {status}");
    }
    result
}

/// One side's verbs: a CQ, a QP with rping's queue depths, the 16-byte receive buffer, and a
/// remotely accessible region: the client's source and sink, the server's one buffer.
struct Resources {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    recv: MemoryRegion,
    buffers: MemoryRegion,
}

impl Resources {
    fn new(device: &Device, buffers_len: usize) -> Result<Resources> {
        let doing = |what: &str| {
            let what = what.to_string();
            move |error| Error::Device { doing: what, error }
        };
        let pd = device.alloc_pd().map_err(doing("ibv_alloc_pd"))?;
        let cq = device.create_cq(32).map_err(doing("ibv_create_cq"))?;
        let recv = pd
            .register(INFO_LEN, Access::LOCAL_WRITE)
            .map_err(doing("ibv_reg_mr"))?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let buffers = pd
            .register(buffers_len, access)
            .map_err(doing("ibv_reg_mr"))?;
        Ok(Resources {
            pd,
            cq,
            recv,
            buffers,
        })
    }

    /// An RC QP in INIT with its one receive posted, ready to be connected.
    fn qp(&self) -> Result<QueuePair> {
        let doing = |what: &'static str| {
            move |error| Error::Device {
                doing: what.into(),
                error,
            }
        };
        let qp = self
            .pd
            .create_qp()
            .send_cq(&self.cq)
            .recv_cq(&self.cq)
            .max_send_wr(16)
            .max_recv_wr(2)
            .build()
            .map_err(doing("rdma_create_qp"))?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        qp.init(access).map_err(doing("rdma_create_qp"))?;
        post_recv(&qp, &self.recv)?;
        Ok(qp)
    }
}

fn post_recv(qp: &QueuePair, recv: &MemoryRegion) -> Result<()> {
    let wr = RecvWr::new(0, recv.sge(0, INFO_LEN).map_err(failed("post recv error"))?);
    qp.post_recv(wr).map_err(|error| Error::Device {
        doing: "post recv error".into(),
        error,
    })
}

fn post_send(qp: &QueuePair, wr: SendWr) -> Result<()> {
    qp.post_send(wr).map_err(|error| Error::Device {
        doing: "post send error".into(),
        error,
    })
}

/// A connection's completions, taken in the order the protocol needs them: a SEND's
/// completion and the peer's answer may come either way round (the ACK that completes the
/// SEND can come after the answer), so what comes early waits here for its turn.
struct Completions<'a> {
    conn: &'a Connection,
    cq: &'a CompletionQueue,
    early: Vec<WorkCompletion>,
    /// A served session's limits: a peer silent for the idle limit, or the daemon stopping,
    /// ends the wait. None for a tool run from the command line, which waits as rping does.
    watch: Watch,
}

impl<'a> Completions<'a> {
    fn new(conn: &'a Connection, cq: &'a CompletionQueue, limits: &Limits) -> Self {
        Completions {
            conn,
            cq,
            early: Vec::new(),
            watch: Watch::new(limits),
        }
    }

    /// The next successful completion of `opcode`; `None` once the peer has disconnected.
    /// A completion in error ends the run, as rping's `cq completion failed status`.
    fn expect(&mut self, opcode: WcOpcode) -> Result<Option<WorkCompletion>> {
        loop {
            if let Some(at) = self.early.iter().position(|wc| wc.opcode == opcode) {
                return Ok(Some(self.early.remove(at)));
            }
            let device = |error| Error::Device {
                doing: "poll error".into(),
                error,
            };
            let next = self.cq.wait(Duration::from_millis(50)).map_err(device)?;
            if next.is_some() {
                self.watch.heard();
            }
            match next {
                Some(wc) if wc.status == WcStatus::Success => self.early.push(wc),
                // Flushed: the QP went to ERROR as the connection ended.
                Some(wc) if wc.status == WcStatus::WrFlushErr => return Ok(None),
                Some(wc) => {
                    return Err(Error::Completion {
                        wr_id: wc.wr_id,
                        status: wc.status,
                    })
                }
                None => match self.conn.wait_cm_end(Duration::ZERO).map_err(device)? {
                    Some(_) => return Ok(None),
                    None => self.watch.expired()?,
                },
            }
        }
    }

    /// Both `opcodes`' completions, in whatever order they come; false once disconnected.
    fn expect_all(&mut self, opcodes: &[WcOpcode]) -> Result<bool> {
        for &opcode in opcodes {
            if self.expect(opcode)?.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

fn client(o: &Options, out: &mut dyn Write) -> Result<()> {
    let server = o
        .addr
        .ok_or_else(|| Error::Usage("a client needs the server's address: -a".into()))?;
    // -I, --bind, or the source address of the route to the server, as rdma_resolve_addr.
    let device = super::cm_tool_device(o.source, &o.device, Some(server), "-I")?;
    // The source buffer, then the sink.
    let r = Resources::new(&device, 2 * o.size)?;
    let (source, sink) = (0, o.size);
    let qp = r.qp()?;
    let conn = Connection::connect(
        qp,
        SocketAddr::new(server, o.port),
        &conn_options(o, &device),
        &[],
    )
    .map_err(|error| Error::Device {
        doing: "connect error".into(),
        error,
    })?;
    if o.debug {
        writeln!(out, "rdma_connect successful")?;
    }
    let mut completions = Completions::new(&conn, &r.cq, &Limits::default());
    let mut start = b'A';
    let mut ping = 0u32;
    while o.count == 0 || ping < o.count {
        let text = ping_text(ping, start, o.size);
        start = if start >= b'z' { b'A' } else { start + 1 };
        r.buffers.write(source, &text).map_err(|e| Error::Device {
            doing: "writing the ping".into(),
            error: e.into(),
        })?;
        for (step, offset) in [("source", source), ("sink", sink)] {
            let wr = SendWr::new(
                1,
                SendOp::Send,
                Payload::Inline(info(&r.buffers, offset, o.size)[..].into()),
            );
            post_send(&conn, wr)?;
            if !completions.expect_all(&[WcOpcode::Send, WcOpcode::Recv])? {
                return Err(Error::Exchange(format!(
                    "the server disconnected while this client waited for its go ahead after \
                     the {step}"
                )));
            }
            post_recv(&conn, &r.recv)?;
        }
        let mut landed = vec![0; o.size];
        r.buffers
            .read(sink, &mut landed)
            .map_err(|e| Error::Device {
                doing: "reading the pong".into(),
                error: e.into(),
            })?;
        if o.validate && landed != text {
            return Err(Error::DataCheck("data mismatch!".into()));
        }
        if o.verbose {
            writeln!(out, "ping data: {}", c_str(&landed))?;
        }
        ping += 1;
    }
    super::disconnect_and_wait([&conn])
}

fn server(o: &Options, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    // rping's default, the wildcard address, names no device here.
    let address = o.addr.filter(|a| !a.is_unspecified());
    let device = super::cm_tool_device(address, &o.device, None, "-a")?;
    let listener = device.listen(o.port).map_err(|error| Error::Device {
        doing: "rdma_listen".into(),
        error,
    })?;
    if o.debug {
        writeln!(out, "rdma_bind_addr successful")?;
        writeln!(out, "rdma_listen")?;
    }
    loop {
        serve_one(o, &device, &listener, out, err)?;
        if !o.persistent {
            return Ok(());
        }
    }
}

/// Waits for a connection and serves it until its client disconnects.
fn serve_one(
    o: &Options,
    device: &Device,
    listener: &verbs::Listener,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<()> {
    let request = loop {
        let next = listener.next_request(Duration::from_secs(1));
        let next = next.map_err(|error| Error::Device {
            doing: "rdma_get_cm_event".into(),
            error,
        })?;
        if let Some(request) = next {
            break request;
        }
    };
    serve(o, device, request, &Limits::default(), (out, err))
}

/// Serves the client whose connection `request` asks for until it disconnects, as rping's
/// server: the command line's way and the daemon's, whose `limits` bound its waits.
pub fn serve(
    o: &Options,
    device: &Device,
    request: verbs::ConnectionRequest,
    limits: &Limits,
    (out, err): (&mut dyn Write, &mut dyn Write),
) -> Result<()> {
    if o.debug {
        writeln!(out, "accepting client connection request")?;
    }
    let memory = limits.reserve(o.size as u64)?;
    let r = Resources::new(device, o.size)?;
    let qp = r.qp()?;
    let conn = request
        .accept(qp, &conn_options(o, device), &[])
        .map_err(|error| Error::Device {
            doing: "rdma_accept".into(),
            error,
        })?;
    let served = serve_pings(o, (&conn, &r), limits, out);
    // The regions go first: a dropped region is released at the device's next QP
    // destruction, which the connection's then is.
    drop(r);
    drop(conn);
    drop(memory);
    served?;
    writeln!(err, "server DISCONNECT EVENT...")?;
    writeln!(err, "wait for RDMA_READ_ADV state 10")?;
    Ok(())
}

/// Answers pings until the client disconnects.
fn serve_pings(
    o: &Options,
    (conn, r): (&Connection, &Resources),
    limits: &Limits,
    out: &mut dyn Write,
) -> Result<()> {
    let mut completions = Completions::new(conn, &r.cq, limits);
    loop {
        // The source's description, then the READ of it.
        let Some((addr, rkey, len)) = receive_info(&mut completions, conn, r)? else {
            return Ok(());
        };
        if len > o.size {
            return Err(Error::Exchange(format!(
                "the client's buffer is {len} bytes, this server's {}: run both with one -S",
                o.size
            )));
        }
        let read = SendOp::Read {
            remote_addr: addr,
            rkey,
        };
        let sge = r.buffers.sge(0, len).map_err(failed("post send error"))?;
        let wr = SendWr::new(2, read, Payload::Sges(sge.into()));
        post_send(conn, wr)?;
        if completions.expect(WcOpcode::RdmaRead)?.is_none() {
            return Ok(());
        }
        let mut data = vec![0; len];
        r.buffers.read(0, &mut data).map_err(|e| Error::Device {
            doing: "reading the ping".into(),
            error: e.into(),
        })?;
        if o.verbose {
            writeln!(out, "server ping data: {}", c_str(&data))?;
        }
        // The go ahead: 16 zero bytes, as rping's server never fills its send buffer.
        post_send(conn, go_ahead())?;
        // The sink's description, then the WRITE of what was read: its text and NUL.
        let Some((addr, rkey, sink_len)) = receive_info(&mut completions, conn, r)? else {
            return Ok(());
        };
        let text_len = data.iter().position(|&b| b == 0).map_or(len, |n| n + 1);
        let write = SendOp::Write {
            remote_addr: addr,
            rkey,
        };
        let sge = r
            .buffers
            .sge(0, text_len.min(sink_len))
            .map_err(failed("post send error"))?;
        post_send(conn, SendWr::new(3, write, Payload::Sges(sge.into())))?;
        if !completions.expect_all(&[WcOpcode::Send, WcOpcode::RdmaWrite])? {
            return Ok(());
        }
        post_send(conn, go_ahead())?;
        if completions.expect(WcOpcode::Send)?.is_none() {
            return Ok(());
        }
    }
}

fn go_ahead() -> SendWr {
    SendWr::new(4, SendOp::Send, Payload::Inline(vec![0; INFO_LEN].into()))
}

/// The next `struct rping_rdma_info` from the client, its receive posted again; `None` once
/// the client has disconnected.
fn receive_info(
    completions: &mut Completions<'_>,
    conn: &Connection,
    r: &Resources,
) -> Result<Option<(u64, RKey, usize)>> {
    let Some(wc) = completions.expect(WcOpcode::Recv)? else {
        return Ok(None);
    };
    if wc.byte_len as usize != INFO_LEN {
        return Err(Error::Exchange(format!(
            "Received bogus data, size {}",
            wc.byte_len
        )));
    }
    let mut bytes = [0u8; INFO_LEN];
    r.recv.read(0, &mut bytes).map_err(|e| Error::Device {
        doing: "reading the receive".into(),
        error: e.into(),
    })?;
    post_recv(conn, &r.recv)?;
    let addr = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
    let rkey = RKey(u32::from_be_bytes(
        bytes[8..12].try_into().expect("4 bytes"),
    ));
    let len = u32::from_be_bytes(bytes[12..].try_into().expect("4 bytes")) as usize;
    Ok(Some((addr, rkey, len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rping's first ping at the default size, as the research of rping.c gives it: 13
    /// characters of text, 50 letters from `A`, and the NUL.
    #[test]
    fn the_first_ping_is_rpings_text() {
        let text = ping_text(0, b'A', 64);
        assert_eq!(text.len(), 64);
        assert_eq!(
            c_str(&text),
            "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        let second = ping_text(1, b'B', 64);
        assert!(c_str(&second).ends_with('s'));
        let wrapped = ping_text(7, b'y', 30);
        assert_eq!(c_str(&wrapped), "rdma-ping-7: yzABCDEFGHIJKLMN");
    }
}
