//! `softroce ucmatose`: librdmacm's `ucmatose` (rdma-core, `librdmacm/examples/cmatose.c`)
//! over softroce: RC connections made by RDMA-CM, each carrying `-C` SENDs of `-S` bytes one
//! way and as many back, then ended by the server's DREQs. Where rping exercises one
//! connection's READ and WRITE, ucmatose exercises several connections at once (`-c`), the
//! server sending first, the server disconnecting, and a client that asks for no RNR retries:
//! its receives must be posted before it connects.
//!
//! The server accepts `-c` connections, then on each posts `-C` SENDs and waits for their
//! completions, then for `-C` receives; then it disconnects them all and waits for their ends.
//! The client connects `-c` times, waits for `-C` receives on each, posts `-C` SENDs back, and
//! waits for the server's disconnects. The output lines are ucmatose's.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::{failed, DeviceOptions, Error, Result};
use crate::memory::{Access, MemoryRegion};
use crate::transport::{ConnectOptions, PathMtu, RecvWr, SendWr, WcOpcode, WcStatus};
use crate::verbs::{self, CompletionQueue, Connection, ConnectionEvent, Device, QueuePair};

/// ucmatose's port.
pub const DEFAULT_PORT: u16 = 7471;

/// How ucmatose runs; the fields are its flags.
#[derive(Debug, Clone)]
pub struct Options {
    /// `-s`: the server to connect to; `None` makes this side the server.
    pub server: Option<IpAddr>,
    /// `-b`: the address to bind (the device's).
    pub bind: Option<IpAddr>,
    /// `-p`.
    pub port: u16,
    /// `-c`: connections.
    pub connections: usize,
    /// `-C`: messages each way on each connection.
    pub messages: usize,
    /// `-S`: message size.
    pub size: usize,
    /// softroce's: the path MTU a client's REQs ask for; `None`, the port's.
    pub mtu: Option<PathMtu>,
    /// How the device is opened: softroce's `--bind` (`-b` comes first), `--backend`, `--pcap`.
    pub device: DeviceOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            server: None,
            bind: None,
            port: DEFAULT_PORT,
            connections: 1,
            messages: 10,
            size: 100,
            mtu: None,
            device: DeviceOptions::default(),
        }
    }
}

/// One connection's verbs: its CQs, QP and the buffer every message uses (as ucmatose's).
struct Node {
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    buffer: MemoryRegion,
}

impl Node {
    /// The node's CQs, buffer and QP in INIT with its `-C` receives posted (`init_node`,
    /// `post_recvs`): the peer may send as soon as it is connected.
    fn new(device: &Device, o: &Options) -> Result<(Node, QueuePair)> {
        let depth = o.messages.max(1);
        let pd = device.alloc_pd().map_err(failed("ibv_alloc_pd"))?;
        let send_cq = device.create_cq(depth).map_err(failed("ibv_create_cq"))?;
        let recv_cq = device.create_cq(depth).map_err(failed("ibv_create_cq"))?;
        let buffer = pd
            .register(o.size.max(1), Access::LOCAL_WRITE)
            .map_err(failed("ibv_reg_mr"))?;
        let qp = pd
            .create_qp()
            .send_cq(&send_cq)
            .recv_cq(&recv_cq)
            .max_send_wr(depth)
            .max_recv_wr(depth)
            .build()
            .map_err(failed("rdma_create_qp"))?;
        qp.init(Access::LOCAL_WRITE)
            .map_err(failed("rdma_create_qp"))?;
        for i in 0..o.messages {
            let sge = buffer
                .sge(0, o.size)
                .map_err(failed("failed to post receives"))?;
            let wr = RecvWr::new(i as u64, sge);
            qp.post_recv(wr)
                .map_err(failed("failed to post receives"))?;
        }
        let node = Node {
            send_cq,
            recv_cq,
            buffer,
        };
        Ok((node, qp))
    }

    fn post_sends(&self, qp: &QueuePair, o: &Options) -> Result<()> {
        for i in 0..o.messages {
            let sge = self
                .buffer
                .sge(0, o.size)
                .map_err(failed("failed to post send"))?;
            let wr = SendWr::send(i as u64, sge);
            qp.post_send(wr).map_err(|error| Error::Device {
                doing: "failed to post sends".into(),
                error,
            })?;
        }
        Ok(())
    }
}

/// Waits for `count` successful completions of `opcode` on `cq` (`poll_cqs`).
fn poll(cq: &CompletionQueue, count: usize, opcode: WcOpcode, size: usize) -> Result<()> {
    for _ in 0..count {
        let wc = loop {
            let polled = cq.wait(Duration::from_secs(1));
            match polled.map_err(|error| Error::Device {
                doing: "cmatose: failed polling CQ".into(),
                error,
            })? {
                Some(wc) => break wc,
                None => continue,
            }
        };
        if wc.status != WcStatus::Success {
            return Err(Error::Completion {
                wr_id: wc.wr_id,
                status: wc.status,
            });
        }
        if wc.opcode != opcode || (opcode == WcOpcode::Recv && wc.byte_len as usize != size) {
            return Err(Error::Exchange(format!(
                "a {:?} completion of {} bytes where ucmatose waits for {opcode:?} of {size}",
                wc.opcode, wc.byte_len
            )));
        }
    }
    Ok(())
}

/// Runs ucmatose: the server, or with `-s` the client. Prints "return status N" as ucmatose's
/// `main` does, 0 or the failure's.
pub fn run(o: &Options, out: &mut dyn Write) -> Result<()> {
    let result = match o.server {
        Some(server) => client(o, server, out),
        None => server(o, out),
    };
    super::librdmacm_test_end(out, result)
}

fn server(o: &Options, out: &mut dyn Write) -> Result<()> {
    let device = super::cm_tool_device(o.bind, &o.device, None, "-b")?;
    let listener = device.listen(o.port).map_err(|error| Error::Device {
        doing: "cmatose: failure trying to listen".into(),
        error,
    })?;
    // Once listening, so that a client started on this line finds the port served.
    writeln!(out, "cmatose: starting server")?;
    // The peer's retry counts and depths come with its REQ; the server asks for 7 RNR retries
    // of the client, as rdma_accept with no parameters does.
    let options = ConnectOptions {
        mtu: Some(device.port_mtu()),
        rnr_retry: 7,
        retry_cnt: 7,
        ..ConnectOptions::default()
    };
    let mut nodes = Vec::with_capacity(o.connections);
    while nodes.len() < o.connections {
        let request = listener
            .next_request(Duration::from_secs(1))
            .map_err(|error| Error::Device {
                doing: "rdma_get_cm_event".into(),
                error,
            })?;
        let Some(request) = request else { continue };
        let (node, qp) = Node::new(&device, o)?;
        let conn = request
            .accept(qp, &options, &[])
            .map_err(|error| Error::Device {
                doing: "cmatose: failure accepting".into(),
                error,
            })?;
        nodes.push((node, conn));
    }
    if o.messages > 0 && o.size > 0 {
        writeln!(out, "initiating data transfers")?;
        for (node, conn) in &nodes {
            node.post_sends(conn, o)?;
        }
        writeln!(out, "completing sends")?;
        for (node, _) in &nodes {
            poll(&node.send_cq, o.messages, WcOpcode::Send, o.size)?;
        }
        writeln!(out, "receiving data transfers")?;
        for (node, _) in &nodes {
            poll(&node.recv_cq, o.messages, WcOpcode::Recv, o.size)?;
        }
        writeln!(out, "data transfers complete")?;
    }
    writeln!(out, "cmatose: disconnecting")?;
    super::disconnect_and_wait(nodes.iter().map(|(_, conn)| conn))?;
    // Once every connection has ended (`disconnect_events`).
    writeln!(out, "disconnected")?;
    Ok(())
}

fn client(o: &Options, server: IpAddr, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "cmatose: starting client")?;
    let device = super::cm_tool_device(o.bind, &o.device, Some(server), "-b")?;
    writeln!(out, "cmatose: connecting")?;
    // cmatose's conn_param: one READ each way, five retries, and no RNR retry at all (a
    // memset zero), which becomes the server's QP's RNR retry count.
    let port_mtu = device.port_mtu();
    let options = ConnectOptions {
        mtu: Some(o.mtu.unwrap_or(port_mtu).min(port_mtu)),
        max_rd_atomic: 1,
        retry_cnt: 5,
        rnr_retry: 0,
        ..ConnectOptions::default()
    };
    let mut nodes = Vec::with_capacity(o.connections);
    for _ in 0..o.connections {
        let (node, qp) = Node::new(&device, o)?;
        let to = SocketAddr::new(server, o.port);
        let conn = Connection::connect(qp, to, &options, &[]).map_err(|error| {
            if let verbs::Error::ConnectFailed { failure, .. } = &error {
                let (event, status) = super::cm_event(failure);
                let _ = writeln!(out, "cmatose: event: {event}, error: {status}");
            }
            Error::Device {
                doing: "cmatose: failure connecting".into(),
                error,
            }
        })?;
        nodes.push((node, conn));
    }
    if o.messages > 0 && o.size > 0 {
        writeln!(out, "receiving data transfers")?;
        for (node, _) in &nodes {
            poll(&node.recv_cq, o.messages, WcOpcode::Recv, o.size)?;
        }
        writeln!(out, "sending replies")?;
        for (node, conn) in &nodes {
            node.post_sends(conn, o)?;
        }
        writeln!(out, "data transfers complete")?;
    }
    // The server ends every connection (`disconnect_events`).
    for (_, conn) in &nodes {
        loop {
            let event = conn.wait_cm_end(Duration::from_secs(1));
            match event.map_err(|error| Error::Device {
                doing: "rdma_get_cm_event".into(),
                error,
            })? {
                Some(ConnectionEvent::Failed(failure)) => {
                    return Err(Error::Exchange(format!("the connection failed: {failure}")))
                }
                Some(_) => break,
                None => {}
            }
        }
    }
    Ok(())
}
