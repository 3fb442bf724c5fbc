//! perftest's RDMA-CM mode (`-R`, perftest_communication.c with `work_rdma_cm`): no TCP at all.
//!
//! - The exchange runs on a control RC connection made by RDMA-CM on the test's port: each
//!   message is one signalled SEND of exactly its size, into the one 56-byte receive the peer
//!   keeps posted (`rdma_write_data`, `rdma_read_data`). The rounds are those of the TCP
//!   exchange ([`super::perftest_oob`]), the client writing first, except that keys travel as
//!   `struct pingpong_dest` itself, 56 big-endian bytes (`rdma_write_keys`), and the close
//!   sends no `"done"`.
//! - Every data QP is connected by RDMA-CM too, on the same port, between two key rounds of
//!   zeros (`create_rdma_cm_connection`): the QPN and PSN of the later key rounds are then
//!   unused. perftest's server listens anew for them only once its zeros are sent, so its
//!   client retries a rejected connection ten times, 100 ms apart; softroce's client does the
//!   same, and softroce's server keeps the control connection's listener, which is listening
//!   before its zeros go out.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::perftest_keys::DEST_LEN;
use super::{failed, Error, Result};
use crate::cm::Failure;
use crate::memory::{Access, MemoryRegion};
use crate::transport::{ConnectOptions, Payload, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use crate::verbs::{self, CompletionQueue, Connection, Device, Listener, QueuePair};
use crate::wire::cm::RejReason;

/// `rdma_cm_client_connection`'s retries of a rejected connection, and its pause.
const CONNECT_TRIES: usize = 10;
const CONNECT_PAUSE: Duration = Duration::from_millis(100);
/// How long a control read waits before it asks whether the peer is still there.
const TICK: Duration = Duration::from_secs(1);

/// The control connection: its QP's SENDs carry this side's messages, its one posted receive
/// takes the peer's. The region comes first: fields drop in order, and a dropped region is
/// released at the device's next QP destruction, which the connection's then is.
pub struct CmLink {
    recv: MemoryRegion,
    conn: Connection,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
}

impl std::fmt::Debug for CmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmLink")
            .field("peer", &self.conn.peer())
            .finish()
    }
}

/// The connection parameters of perftest's control connection (`create_comm_struct`): RC,
/// no READs, seven retries of each kind; the path MTU the port's.
fn control_options(device: &Device) -> ConnectOptions {
    ConnectOptions {
        mtu: Some(device.port_mtu()),
        access: Access::LOCAL_WRITE,
        max_rd_atomic: 0,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOptions::default()
    }
}

/// Whether a failed connection is worth trying again: the server rejected it for want of a
/// listener, which perftest's server has between its two connection steps.
fn retry_rejected(error: &verbs::Error) -> bool {
    matches!(
        error,
        verbs::Error::ConnectFailed {
            failure: Failure::Rejected {
                reason: RejReason::INVALID_SERVICE_ID,
                ..
            },
            ..
        }
    )
}

/// Connects a QP that `make` creates to `to`, as `rdma_cm_client_connection` does: a
/// rejection for want of a listener is tried again with a new QP, ten times, 100 ms apart.
pub fn connect_retrying(
    to: SocketAddr,
    options: &ConnectOptions,
    make: &mut dyn FnMut() -> Result<QueuePair>,
) -> Result<Connection> {
    let mut tries = 0;
    loop {
        let qp = make()?;
        match Connection::connect(qp, to, options, &[]) {
            Ok(conn) => return Ok(conn),
            Err(error) if retry_rejected(&error) && tries + 1 < CONNECT_TRIES => {
                tries += 1;
                std::thread::sleep(CONNECT_PAUSE);
            }
            Err(error) => {
                return Err(Error::Device {
                    doing: format!(
                        "Failed to connect RDMA CM client, tried {} times",
                        tries + 1
                    ),
                    error,
                })
            }
        }
    }
}

/// The next connection request on `listener`, waiting as long as it takes.
pub fn next_request(listener: &Listener) -> Result<verbs::ConnectionRequest> {
    loop {
        let next = listener.next_request(TICK);
        if let Some(request) = next.map_err(failed("rdma_get_cm_event"))? {
            return Ok(request);
        }
    }
}

/// Where a `-R` server's data connection requests come from: its own listener (a tool run
/// from the command line), or the daemon, which hands a session the requests of its client
/// that come while it expects them.
pub trait DataRequests {
    /// The client at `peer` will now connect `count` data QPs (called before this side's
    /// round of zeros lets it).
    fn expect(&mut self, peer: IpAddr, count: usize);
    /// The next of them.
    fn next(&mut self) -> Result<verbs::ConnectionRequest>;
}

impl DataRequests for &Listener {
    fn expect(&mut self, _peer: IpAddr, _count: usize) {}

    fn next(&mut self) -> Result<verbs::ConnectionRequest> {
        next_request(self)
    }
}

impl CmLink {
    /// The control QP, its CQs and its receive buffer, the receive posted.
    fn prepare(
        device: &Device,
    ) -> Result<(QueuePair, CompletionQueue, CompletionQueue, MemoryRegion)> {
        let pd = device.alloc_pd().map_err(failed("Couldn't allocate PD"))?;
        let send_cq = device.create_cq(1).map_err(failed("Couldn't create CQ"))?;
        let recv_cq = device.create_cq(1).map_err(failed("Couldn't create CQ"))?;
        let recv = pd
            .register(DEST_LEN, Access::LOCAL_WRITE)
            .map_err(failed("Couldn't allocate MR"))?;
        let qp = pd
            .create_qp()
            .send_cq(&send_cq)
            .recv_cq(&recv_cq)
            .max_send_wr(1)
            .max_recv_wr(1)
            .build()
            .map_err(failed("Couldn't create QP"))?;
        qp.init(Access::LOCAL_WRITE)
            .map_err(failed("Couldn't create QP"))?;
        post_recv(&qp, &recv)?;
        Ok((qp, send_cq, recv_cq, recv))
    }

    /// The client's control connection to `to` (`rdma_client_connect`).
    pub fn connect(device: &Device, to: SocketAddr) -> Result<CmLink> {
        let options = control_options(device);
        let mut parts = None;
        let conn = connect_retrying(to, &options, &mut || {
            let (qp, send_cq, recv_cq, recv) = CmLink::prepare(device)?;
            parts = Some((send_cq, recv_cq, recv));
            Ok(qp)
        })?;
        let (send_cq, recv_cq, recv) = parts.expect("a connection was made of the last parts");
        Ok(CmLink {
            conn,
            send_cq,
            recv_cq,
            recv,
        })
    }

    /// The server's control connection (`rdma_server_connect`), for `request`.
    pub fn accept(device: &Device, request: verbs::ConnectionRequest) -> Result<CmLink> {
        let (qp, send_cq, recv_cq, recv) = CmLink::prepare(device)?;
        let conn = request
            .accept(qp, &control_options(device), &[])
            .map_err(failed("rdma_accept"))?;
        Ok(CmLink {
            conn,
            send_cq,
            recv_cq,
            recv,
        })
    }

    /// One message (`rdma_write_data`): a signalled SEND, waited for.
    pub fn write(&self, msg: &[u8], what: &str) -> Result<()> {
        let wr = SendWr::new(5, SendOp::Send, Payload::Inline(msg.into()));
        self.conn.post_send(wr).map_err(|error| Error::Device {
            doing: format!("Couldn't send {what}"),
            error,
        })?;
        loop {
            let done = self.send_cq.wait(TICK).map_err(failed("Couldn't send"))?;
            let Some(wc) = done else { continue };
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Send {
                return Err(Error::Exchange(format!(
                    "Couldn't send {what}: Bad wc status {:?}",
                    wc.status
                )));
            }
            return Ok(());
        }
    }

    /// The peer's next message of `len` bytes (`rdma_read_data`); its receive is posted again.
    /// `waited` is asked after each second without one: it may end the wait.
    pub fn read(
        &self,
        len: usize,
        what: &str,
        waited: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<u8>> {
        let wc = loop {
            let got = self.recv_cq.wait(TICK).map_err(failed("Couldn't read"))?;
            match got {
                Some(wc) => break wc,
                None => waited()?,
            }
        };
        if wc.status != WcStatus::Success {
            return Err(Error::Exchange(format!(
                "Couldn't read {what}: Bad wc status {:?} (the peer disconnected?)",
                wc.status
            )));
        }
        if wc.byte_len as usize != len {
            return Err(Error::Exchange(format!(
                "Couldn't read {what}: the peer sent {} bytes where perftest sends {len}",
                wc.byte_len
            )));
        }
        let mut msg = vec![0; len];
        self.recv
            .read(0, &mut msg)
            .map_err(failed("Couldn't read"))?;
        post_recv(&self.conn, &self.recv)?;
        Ok(msg)
    }

    /// The data QPs' connections' peer: the control connection's.
    pub fn peer_address(&self) -> IpAddr {
        self.conn.peer().ip()
    }
}

fn post_recv(qp: &QueuePair, recv: &MemoryRegion) -> Result<()> {
    let sge = recv
        .sge(0, DEST_LEN)
        .map_err(failed("Couldn't post receive"))?;
    qp.post_recv(RecvWr::new(5, sge))
        .map_err(failed("Couldn't post receive"))
}
