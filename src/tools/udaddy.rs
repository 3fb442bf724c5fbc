//! `softroce udaddy`: librdmacm's `udaddy` (rdma-core, `librdmacm/examples/udaddy.c`) over
//! softroce: UD service resolution (SIDR) on RDMA-CM's UDP port space, then datagrams both
//! ways. What rping and ucmatose do not: no connection at all, a QPN and Q_Key learned from a
//! SIDR_REP, and a server that answers to an address handle made from a received datagram and
//! the QPN its immediate data names.
//!
//! The client resolves the server's port 7174 (udaddy's, fixed; its `-p` names the port space),
//! sends `-C` SENDs with immediate data (its QPN) of `-S` bytes, and waits for as many back.
//! The server answers each resolution with its UD QP and Q_Key 0x01234567, waits for `-C`
//! datagrams, and sends `-C` back to the first one's sender. The output lines are udaddy's.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::{failed, DeviceOptions, Error, Result};
use crate::cm::RDMA_UDP_QKEY;
use crate::memory::{Access, MemoryRegion};
use crate::transport::{
    AddressHandle, Payload, QpType, RecvWr, SendOp, SendWr, UdDest, WcOpcode, WcStatus,
    WorkCompletion, GRH_LEN,
};
use crate::verbs::{self, CompletionQueue, Device, QueuePair};
use crate::wire::{Psn, Qpn};

/// udaddy's port: fixed in udaddy.c, whose `-p` sets the port space.
pub const PORT: u16 = 7174;

/// How udaddy runs; the fields are its flags.
#[derive(Debug, Clone)]
pub struct Options {
    /// `-s`: the server to resolve; `None` makes this side the server.
    pub server: Option<IpAddr>,
    /// `-b`: the address to bind (the device's).
    pub bind: Option<IpAddr>,
    /// `-C`: datagrams each way.
    pub messages: usize,
    /// `-S`: datagram size, at most the port MTU.
    pub size: usize,
    /// How the device is opened: softroce's `--bind` (`-b` comes first), `--backend`, `--pcap`.
    pub device: DeviceOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            server: None,
            bind: None,
            messages: 10,
            size: 100,
            device: DeviceOptions::default(),
        }
    }
}

/// A UD QP with its CQ and a buffer of `-S` bytes and the GRH's 40 (`init_node`).
struct Node {
    qp: QueuePair,
    cq: CompletionQueue,
    buffer: MemoryRegion,
    pd: verbs::ProtectionDomain,
}

impl Node {
    fn new(device: &Device, o: &Options) -> Result<Node> {
        let depth = o.messages.max(1);
        let pd = device.alloc_pd().map_err(failed("ibv_alloc_pd"))?;
        let cq = device
            .create_cq(2 * depth)
            .map_err(failed("ibv_create_cq"))?;
        let buffer = pd
            .register(o.size + GRH_LEN, Access::LOCAL_WRITE)
            .map_err(failed("ibv_reg_mr"))?;
        let qp = pd
            .create_qp()
            .qp_type(QpType::Ud)
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(depth)
            .max_recv_wr(depth)
            // librdmacm's UD QPs send from PSN 0 (`ucma_init_ud_qp`).
            .sq_psn(Psn::new(0))
            .qkey(RDMA_UDP_QKEY)
            .build()
            .map_err(failed("rdma_create_qp"))?;
        qp.ready_datagram().map_err(failed("rdma_create_qp"))?;
        for i in 0..o.messages {
            let sge = buffer
                .sge(0, o.size + GRH_LEN)
                .map_err(failed("failed to post receives"))?;
            let wr = RecvWr::new(i as u64, sge);
            qp.post_recv(wr)
                .map_err(failed("failed to post receives"))?;
        }
        Ok(Node { qp, cq, buffer, pd })
    }

    /// `-C` SENDs with immediate data, this QP's number, to `dest`.
    fn post_sends(&self, o: &Options, dest: UdDest, signaled: bool) -> Result<()> {
        for i in 0..o.messages {
            let op = SendOp::SendWithImm {
                imm: self.qp.qpn().value(),
            };
            let sge = self
                .buffer
                .sge(GRH_LEN, o.size)
                .map_err(failed("failed to post send"))?;
            let mut wr = SendWr::new(i as u64, op, Payload::Sges(sge.into()));
            wr.signaled = signaled;
            wr.ud = Some(dest);
            self.qp.post_send(wr).map_err(|error| Error::Device {
                doing: "failed to post sends".into(),
                error,
            })?;
        }
        Ok(())
    }

    /// The next successful completion of `opcode`.
    fn next(&self, opcode: WcOpcode) -> Result<WorkCompletion> {
        loop {
            let polled = self.cq.wait(Duration::from_secs(1));
            let wc = polled.map_err(|error| Error::Device {
                doing: "udaddy: failed polling CQ".into(),
                error,
            })?;
            let Some(wc) = wc else { continue };
            if wc.status != WcStatus::Success {
                return Err(Error::Completion {
                    wr_id: wc.wr_id,
                    status: wc.status,
                });
            }
            if wc.opcode == opcode {
                return Ok(wc);
            }
        }
    }

    fn ah(&self, to: IpAddr) -> Result<AddressHandle> {
        self.pd.create_ah(to).map_err(|error| Error::Device {
            doing: "udaddy: failure creating address handle".into(),
            error,
        })
    }
}

/// Runs udaddy: the server, or with `-s` the client.
pub fn run(o: &Options, out: &mut dyn Write) -> Result<()> {
    let result = match o.server {
        Some(server) => client(o, server, out),
        None => server(o, out),
    };
    super::librdmacm_test_end(out, result)
}

/// The device, and udaddy's check of the datagram size against its port MTU.
fn open(o: &Options, towards: Option<IpAddr>) -> Result<super::CmToolDevice> {
    let device = super::cm_tool_device(o.bind, &o.device, towards, "-b")?;
    let mtu = device.port_mtu().bytes();
    if o.size > mtu {
        return Err(Error::Usage(format!(
            "udaddy: message_size {} is larger than active mtu {mtu}",
            o.size
        )));
    }
    Ok(device)
}

fn server(o: &Options, out: &mut dyn Write) -> Result<()> {
    let device = open(o, None)?;
    let listener = device
        .listen_datagram(PORT)
        .map_err(|error| Error::Device {
            doing: "udaddy: failure trying to listen".into(),
            error,
        })?;
    // Once listening, so that a client started on this line finds the port served.
    writeln!(out, "udaddy: starting server")?;
    let request = loop {
        let next = listener.next_request(Duration::from_secs(1));
        if let Some(request) = next.map_err(|error| Error::Device {
            doing: "rdma_get_cm_event".into(),
            error,
        })? {
            break request;
        }
    };
    // The QP's receives are posted before the answer names it.
    let node = Node::new(&device, o)?;
    request
        .reply(&node.qp, &[])
        .map_err(|error| Error::Device {
            doing: "udaddy: failure accepting".into(),
            error,
        })?;
    if o.messages == 0 || o.size == 0 {
        return Ok(());
    }
    writeln!(out, "receiving data transfers")?;
    // The first datagram says where the replies go (`create_reply_ah`): its source address,
    // and the QPN its immediate data names; the Q_Key is the server's own.
    let first = node.next(WcOpcode::Recv)?;
    let (Some(from), Some(qpn)) = (first.src_addr, first.imm_data) else {
        return Err(Error::Exchange(
            "udaddy: failed to create reply AH: a datagram without its sender or immediate data"
                .into(),
        ));
    };
    for _ in 1..o.messages {
        node.next(WcOpcode::Recv)?;
    }
    writeln!(out, "sending replies")?;
    let dest = UdDest {
        ah: node.ah(from)?,
        remote_qpn: Qpn::new(qpn),
        remote_qkey: RDMA_UDP_QKEY,
    };
    node.post_sends(o, dest, true)?;
    for _ in 0..o.messages {
        node.next(WcOpcode::Send)?;
    }
    writeln!(out, "data transfers complete")?;
    Ok(())
}

fn client(o: &Options, server: IpAddr, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "udaddy: starting client")?;
    let device = open(o, Some(server))?;
    let node = Node::new(&device, o)?;
    writeln!(out, "udaddy: connecting")?;
    let peer = device
        .resolve_datagram(SocketAddr::new(server, PORT), &[])
        .map_err(|error| {
            let (event, status) = match &error {
                verbs::Error::Unresolved(status) => {
                    ("RDMA_CM_EVENT_UNREACHABLE", i32::from(status.0))
                }
                verbs::Error::ConnectFailed { failure, .. } => super::cm_event(failure),
                _ => ("RDMA_CM_EVENT_ADDR_ERROR", -22),
            };
            let _ = writeln!(out, "udaddy: event: {event}, error: {status}");
            Error::Device {
                doing: "udaddy: resolving the server".into(),
                error,
            }
        })?;
    if o.messages == 0 || o.size == 0 {
        return Ok(());
    }
    writeln!(out, "initiating data transfers")?;
    let dest = peer.dest(node.ah(peer.addr)?);
    // Unsignaled, as udaddy's client's (sq_sig_all 0): only the replies complete.
    node.post_sends(o, dest, false)?;
    writeln!(out, "receiving data transfers")?;
    for _ in 0..o.messages {
        node.next(WcOpcode::Recv)?;
    }
    writeln!(out, "data transfers complete")?;
    Ok(())
}
