//! The communication manager (IBTA chapter 12) and RDMA-CM's addressing on top of it, as a
//! deterministic, sans-IO state machine.
//!
//! [`CmEndpoint`] is fed the MADs that arrive on QP1 ([`handle_mad`](CmEndpoint::handle_mad)),
//! timeouts ([`handle_timeout`](CmEndpoint::handle_timeout)) and the application's decisions
//! (connect, listen, accept, reject, disconnect, SIDR); it gives back MADs to send
//! ([`poll_transmit`](CmEndpoint::poll_transmit)), events ([`poll_event`](CmEndpoint::poll_event))
//! and its next deadline. It knows nothing of QPs beyond their numbers: [`agent::Agent`] binds it
//! to a transport [`Endpoint`](crate::transport::Endpoint), carrying MADs on QP1 and moving QPs
//! through the states a REQ and a REP negotiate.
//!
//! The protocol, from the kernel's cm.c and cma.c and IBTA 12.6 and 12.9:
//!
//! - **Active**: [`connect`](CmEndpoint::connect) sends a REQ and sends it again after the CM
//!   response timeout and twice the packet life time, up to its retry count (librdmacm on
//!   RoCE: 20 and 18, about 6.4 s, and 15; [`CmConfig::request_period`]). A REP becomes
//!   [`CmEvent::Reply`]: the QP goes to RTR and RTS, then [`establish`](CmEndpoint::establish)
//!   sends the RTU. An MRA stretches the wait; a REJ ends the attempt with its reason.
//! - **Passive**: a REQ for a service with a listener becomes [`CmEvent::ConnectRequest`];
//!   without one it is rejected at once with reason 8, invalid service ID, as cm.c does.
//!   [`accept`](CmEndpoint::accept) sends the REP and sends it again until the RTU (or, as
//!   IBTA's communication-established event allows, the first packet on the QP:
//!   [`notify_established`](CmEndpoint::notify_established));
//!   [`reject`](CmEndpoint::reject) sends a REJ with the application's data.
//! - **Duplicates** are answered as the first was: a repeated REQ while the application decides
//!   gets an MRA, one after the REP the REP again, one after a REJ the REJ again; a repeated REP
//!   after the RTU gets the RTU again; a repeated DREQ the DREP again. A DREQ for no connection
//!   gets a DREP all the same (cm.c `cm_issue_drep`).
//! - **Teardown**: [`disconnect`](CmEndpoint::disconnect) sends a DREQ, sent again until its
//!   DREP; a DREQ received is answered with a DREP at once and reported. Both sides then wait
//!   out a timewait (the connection's local ACK timeout) before the communication ID is free.
//! - **SIDR** resolves a UD service ID to a QPN and Q_Key:
//!   [`sidr_resolve`](CmEndpoint::sidr_resolve) and, for a listener,
//!   [`sidr_reply`](CmEndpoint::sidr_reply); no listener gets status 1, unsupported.
//!
//! Everything a peer sends is checked: the MAD header, the message's length, the source against
//! the connection's peer, the communication IDs, the state, the REQ's RDMA-CM header against the
//! packet's addresses; what fails is dropped or rejected, and counted ([`CmCounters`]). The
//! tables are bounded ([`CmConfig`]): a flood of REQs gets REJ "no resources", not memory.

mod active;
pub mod agent;
mod passive;
mod sidr;
mod teardown;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

pub use active::ReqParams;
pub use agent::{AppQps, OwnQps};
pub use passive::RepParams;

use crate::transport::{PathMtu, QpType, VerbsError};
use crate::wire::cm::{
    CmMessage, CmRejRepr, RejReason, ServiceId, SidrStatus, MAD_LEN, REJ_PRIVATE_DATA,
};
use crate::wire::{Psn, QKey, Qpn};

/// The Q_Key of RDMA-CM's UD services (`RDMA_UDP_QKEY` in cma.c): what a SIDR_REP names for
/// an IP-addressed UD QP.
pub const RDMA_UDP_QKEY: QKey = QKey(0x0123_4567);

/// The service timeout of our MRAs and how long a REQ may wait for the application's answer:
/// 24, about 69 s, as the kernel's `CMA_CM_MRA_SETTING`. A peer's MRA that asks for longer is
/// held to it.
pub const MRA_SERVICE_TIMEOUT: u8 = 24;

/// The target ACK delay a REP announces: rxe's `RXE_LOCAL_CA_ACK_DELAY`.
pub const TARGET_ACK_DELAY: u8 = 15;

/// The hop limit of a REQ's path: the IP route's usual TTL, which makes the kernel write the
/// permissive LIDs and clear SubnetLocal (cm.c `cm_format_req`).
const HOP_LIMIT: u8 = 64;

/// A connection's handle: its local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId(pub u32);

/// A listener's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenerId(pub u32);

/// A SIDR request: the requester's address and request ID (ours, or a peer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrId {
    /// The other side: the requester of a request we received, the responder to one we sent.
    pub peer: IpAddr,
    /// The SIDR_REQ's Request ID.
    pub request_id: u32,
}

/// A MAD to send to QP1 of `dst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The peer's address; the MAD goes to its QP1.
    pub dst: IpAddr,
    /// The whole 256-byte MAD, the payload of a UD SEND to QP1.
    pub mad: Box<[u8; MAD_LEN]>,
}

/// How the CM behaves; the defaults are librdmacm's (cma.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// How long a peer may take to answer, as a CM response timeout (4.096 µs × 2^value):
    /// `CMA_CM_RESPONSE_TIMEOUT`, 20 (about 4.3 s).
    pub response_timeout: u8,
    /// How many times a REQ, REP, DREQ or SIDR_REQ is sent again: `CMA_MAX_CM_RETRIES`, 15.
    pub max_retries: u8,
    /// Connections and SIDR requests that may wait for the application's answer or for the
    /// peer's at once; a REQ beyond them is rejected with reason 3, no resources.
    pub max_pending: usize,
    /// Connections in any state at once, timewait included.
    pub max_connections: usize,
    /// How long a REQ for a service no one listens on is held before its REJ (reason 8): a
    /// listener that appears meanwhile takes it. The kernel rejects at once (cm.c
    /// `cm_issue_rej`); softroce's CM answers a process's peer sooner than a kernel's, which
    /// makes it likelier that a client connects right after a handshake and before its server's
    /// listen (perftest's `-R` data connections, whose retry after a REJ perftest 4.5 botches).
    /// At most [`MAX_HELD_REQS`] are held; zero rejects at once.
    pub listen_grace: Duration,
    /// The path's packet life time (4.096 µs × 2^value): RDMA-CM's on RoCE,
    /// `CMA_IBOE_PACKET_LIFETIME`, 18 (about 1.07 s). The active side waits twice that besides
    /// the peer's response time before it sends its REQ or DREQ again
    /// ([`request_period`](Self::request_period), cm.c `ib_send_cm_req`); kernel rxe's REQs
    /// come 6.2 to 6.4 s apart, measured in the lab, and announce an ACK timeout of 19.
    pub packet_life_time: u8,
}

impl CmConfig {
    /// How long the active side waits for an answer to its REQ or DREQ before it sends it
    /// again: the response time it asks of the peer plus twice the packet life time (6.4 s
    /// with the defaults).
    pub fn request_period(&self) -> Duration {
        ib_timeout(self.response_timeout) + 2 * ib_timeout(self.packet_life_time)
    }
}

/// REQs held for a listener at once ([`CmConfig::listen_grace`]); beyond them, a REQ for no
/// listener is rejected at once.
pub const MAX_HELD_REQS: usize = 16;

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            response_timeout: 20,
            max_retries: 15,
            max_pending: 256,
            max_connections: 4096,
            listen_grace: Duration::from_millis(250),
            packet_life_time: 18,
        }
    }
}

/// 4.096 µs × 2^`exponent`: the unit of IBTA's timeouts (CM response timeout, local ACK
/// timeout, service timeout), whose fields are five bits wide.
pub fn ib_timeout(exponent: u8) -> Duration {
    Duration::from_nanos(4096u64 << exponent.min(31))
}

/// The GID of an address on RoCEv2: the address itself, IPv4-mapped for IPv4.
pub fn gid_of(addr: IpAddr) -> Ipv6Addr {
    match addr.to_canonical() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// What a REQ asks of the passive side, as the active side's CM sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The service ID the REQ names.
    pub service_id: ServiceId,
    /// The active side's address and, from RDMA-CM's header, its source port (0 for a
    /// service outside RDMA-CM's IP port spaces).
    pub peer: IpAddr,
    /// The active side's source port, from RDMA-CM's header; 0 outside its IP port spaces.
    pub peer_port: u16,
    /// The active side's QPN, and the PSN its QP expects first: the passive side sends from
    /// it. (Each side's starting PSN is its receive queue's, as cm.c sets it: the fixture of
    /// kernel rxe's rping shows the client sending from the REP's PSN.)
    pub peer_qpn: Qpn,
    /// The PSN the active side's QP expects first (the REQ's Starting PSN).
    pub peer_psn: Psn,
    /// The PSN our QP is to expect first, drawn when the REQ came: the REP names it. A program
    /// that moves its QP itself learns it (`rdma_init_qp_attr`) before it accepts.
    pub local_psn: Psn,
    /// RC or UC.
    pub qp_type: QpType,
    /// The path MTU the REQ names.
    pub path_mtu: PathMtu,
    /// The active side's `max_dest_rd_atomic` and `max_rd_atomic`.
    pub responder_resources: u8,
    /// The active side's `max_rd_atomic` (the REQ's Initiator Depth).
    pub initiator_depth: u8,
    /// The transport retry count and RNR retry count the passive side is to use.
    pub retry_count: u8,
    /// The RNR retry count the passive side is to use.
    pub rnr_retry_count: u8,
    /// The local ACK timeout the active side uses, which the passive side uses too.
    pub local_ack_timeout: u8,
    /// Whether the active side's QP takes its receives from a shared receive queue.
    pub srq: bool,
    /// The application's private data, after RDMA-CM's header: 56 bytes in an IP service
    /// (zero-padded by the sender), 92 otherwise.
    pub private_data: Vec<u8>,
}

/// What a REP says, for the active side's QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The passive side's QPN, and the PSN its QP expects first: the active side sends from it.
    pub peer_qpn: Qpn,
    /// The PSN the passive side's QP expects first (the REP's Starting PSN).
    pub peer_psn: Psn,
    /// The PSN our QP expects first: the one our REQ named.
    pub local_psn: Psn,
    /// The passive side's `max_dest_rd_atomic` and `max_rd_atomic`.
    pub responder_resources: u8,
    /// The passive side's `max_rd_atomic` (the REP's Initiator Depth).
    pub initiator_depth: u8,
    /// The RNR retry count the active side is to use.
    pub rnr_retry_count: u8,
    /// The REP's Target ACK Delay: how long the passive side may take to ACK
    /// (4.096 µs × 2^value).
    pub target_ack_delay: u8,
    /// 196 bytes, zero-padded by the sender.
    pub private_data: Vec<u8>,
}

/// Why a connection attempt or a connection ended without a DREQ.
#[derive(Clone, PartialEq, Eq)]
pub enum Failure {
    /// The peer rejected it (REJ), with its reason and private data.
    Rejected {
        /// The REJ's reason.
        reason: RejReason,
        /// The REJ's 148 bytes of private data.
        private_data: Vec<u8>,
    },
    /// The peer never answered, however often asked (`RDMA_CM_EVENT_UNREACHABLE`,
    /// `ETIMEDOUT`); or the application never answered a request.
    TimedOut,
    /// The local QP could not take the negotiated attributes; the peer was sent a REJ.
    Qp(VerbsError),
    /// The peer's host cannot be reached: the network refused our MADs (an ICMP port
    /// unreachable where no RoCE device listens, or no route).
    Unreachable,
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Rejected {
                reason,
                private_data,
            } => {
                let mut rejected = f.debug_struct("Rejected");
                rejected.field("reason", reason);
                // A REJ's 148 bytes are zero-padded by its sender: only what it wrote shows.
                let written = private_data
                    .iter()
                    .rposition(|&b| b != 0)
                    .map_or(0, |last| last + 1);
                if written > 0 {
                    rejected.field("private_data", &&private_data[..written]);
                }
                rejected.finish()
            }
            Failure::TimedOut => f.write_str("TimedOut"),
            Failure::Qp(e) => f.debug_tuple("Qp").field(e).finish(),
            Failure::Unreachable => f.write_str("Unreachable"),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Rejected { reason, .. } => {
                write!(f, "rejected: reason {} ({})", reason.0, reason.name())
            }
            Failure::TimedOut => f.write_str("timed out: no answer, however often asked"),
            Failure::Qp(e) => write!(f, "the QP refused the negotiated attributes: {e}"),
            Failure::Unreachable => f.write_str("the peer's host is unreachable"),
        }
    }
}

/// What the CM tells its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for `listener`'s service: answer with [`CmEndpoint::accept`] or
    /// [`CmEndpoint::reject`].
    ConnectRequest {
        /// The new connection's handle, for `accept` or `reject`.
        conn: ConnId,
        /// The listener whose service ID the REQ names.
        listener: ListenerId,
        /// What the REQ asks.
        request: Box<ConnectRequest>,
    },
    /// The peer accepted: move the QP to RTR and RTS with these values, then call
    /// [`CmEndpoint::establish`].
    Reply {
        /// The connection's handle, as `connect` returned it.
        conn: ConnId,
        /// What the REP says.
        reply: Box<Reply>,
    },
    /// Both sides are ready: the passive side got its RTU, or the active side sent it.
    Established {
        /// The connection's handle.
        conn: ConnId,
    },
    /// The attempt or the connection ended: rejected, or unanswered.
    Failed {
        /// The connection's handle; it is no longer valid.
        conn: ConnId,
        /// Why it ended.
        failure: Failure,
    },
    /// The connection is over: a DREQ arrived (answered already), or our DREQ was answered or
    /// went unanswered. Its QP should leave RTS.
    Disconnected {
        /// The connection's handle.
        conn: ConnId,
    },
    /// A SIDR_REQ for `listener`'s UD service: answer with [`CmEndpoint::sidr_reply`].
    SidrRequest {
        /// The request's handle, for `sidr_reply`.
        id: SidrId,
        /// The listener whose service ID the SIDR_REQ names.
        listener: ListenerId,
        /// The service ID to resolve.
        service_id: ServiceId,
        /// The requester's source port, from RDMA-CM's header; 0 outside its IP port spaces.
        peer_port: u16,
        /// The SIDR_REQ's private data, after RDMA-CM's header if it has one.
        private_data: Vec<u8>,
    },
    /// A SIDR_REQ of ours was answered: the QPN and Q_Key serving the service, or the status.
    SidrResolved {
        /// The request's handle, as `sidr_resolve` returned it.
        id: SidrId,
        /// The serving QPN and Q_Key, or the SIDR_REP's status if it is not success.
        result: Result<(Qpn, QKey), SidrStatus>,
        /// The SIDR_REP's 136 bytes of private data.
        private_data: Vec<u8>,
    },
    /// A SIDR_REQ of ours was never answered.
    SidrTimedOut {
        /// The request's handle, as `sidr_resolve` returned it.
        id: SidrId,
    },
}

macro_rules! cm_counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// What the CM received, sent and dropped.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct CmCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl fmt::Display for CmCounters {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                $(writeln!(f, "{:<24}{}", stringify!($name), self.$name)?;)*
                Ok(())
            }
        }
    };
}

cm_counters!(
    /// MADs handed to `handle_mad`, whether they parsed or not.
    mads_received,
    /// MADs queued for sending, retransmissions included.
    mads_sent,
    /// MADs sent again because the peer did not answer in time.
    retransmissions,
    /// Repeated messages: answered as the first was, or ignored where no answer is due.
    duplicates,
    /// Not a CM MAD, or one that does not parse.
    dropped_malformed,
    /// For no connection we know, from another peer than the connection's, or in a state that
    /// does not take it.
    dropped_unexpected,
    /// REQs and SIDR_REQs for a service no one listens on, answered with a rejection.
    rejected_no_listener,
    /// REQs and SIDR_REQs rejected for want of room ([`CmConfig::max_pending`]).
    rejected_no_resources,
    /// REQs and SIDR_REQs whose fields do not hold together (addresses, GIDs, transport,
    /// MTU, QPN), rejected with the reason.
    rejected_invalid,
    /// REQs from a QP already in one of our connections: rejected with reason 10, stale
    /// connection, and the old connection, if established, sent a DREQ.
    rejected_stale,
    /// REQs the application let go of unanswered, with nothing sent, for want of room in its
    /// listen backlog ([`CmEndpoint::ignore`]): the peer sends them again.
    ignored,
    /// DREQs for no connection, answered with a DREP all the same.
    unknown_dreqs_answered,
    /// ICMP destination-unreachable reports that ended an unanswered REQ or SIDR request
    /// ([`CmEndpoint::peer_refused`]).
    icmp_accepted,
    /// ICMP destination-unreachable reports that named nothing waiting for an answer, or
    /// another packet than a REQ or SIDR_REQ: ignored.
    icmp_ignored,
);

/// Why a CM call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmError {
    /// No connection, listener or SIDR request has this handle.
    Unknown,
    /// The connection is not in a state that takes this call.
    WrongState(&'static str),
    /// The service ID has a listener already.
    ServiceInUse(ServiceId),
    /// Private data beyond what the message carries.
    PrivateDataTooLong {
        /// The private data's length, in bytes.
        len: usize,
        /// The most the message carries, in bytes.
        max: usize,
    },
    /// Every communication ID, or the table's room, is taken.
    NoResources,
    /// The address cannot be connected to; the text says why.
    BadAddress(&'static str),
    /// A parameter is out of range; the text says which.
    Invalid(&'static str),
    /// The QP refused a transition the connection needs.
    Qp(VerbsError),
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::Unknown => f.write_str("no such connection, listener or request"),
            CmError::WrongState(what) => write!(f, "not now: {what}"),
            CmError::ServiceInUse(id) => write!(f, "service ID {id} has a listener already"),
            CmError::PrivateDataTooLong { len, max } => {
                write!(
                    f,
                    "{len} bytes of private data: this message carries at most {max}"
                )
            }
            CmError::NoResources => f.write_str("out of connection resources"),
            CmError::BadAddress(why) => write!(f, "address: {why}"),
            CmError::Invalid(what) => write!(f, "invalid: {what}"),
            CmError::Qp(e) => write!(f, "QP: {e}"),
        }
    }
}

impl std::error::Error for CmError {}

impl From<VerbsError> for CmError {
    fn from(e: VerbsError) -> Self {
        CmError::Qp(e)
    }
}

/// Where a connection stands (IBTA 12.9.6's states, those a RoCE CM without LAP needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: the REQ is out (or the peer sent an MRA for it).
    ReqSent,
    /// Active: the REP arrived; the QP is being moved.
    RepRcvd,
    /// Passive: the REQ arrived; the application decides.
    ReqRcvd,
    /// Passive: the REP is out, the RTU awaited.
    RepSent,
    Established,
    /// Our DREQ is out.
    DreqSent,
    /// Waiting before the communication ID may be used again; a rejected REQ waits here too,
    /// to answer its repeats.
    TimeWait,
}

/// One connection.
#[derive(Debug)]
struct Conn {
    state: State,
    peer: IpAddr,
    /// The peer's communication ID; 0 until its REP names it.
    remote_id: u32,
    /// The transaction ID of the REQ, which REP, RTU, MRA and REJ reuse.
    tid: u64,
    local_qpn: Qpn,
    remote_qpn: Qpn,
    /// The PSN our QP expects first: our REQ's or our REP's Starting PSN.
    local_psn: Psn,
    /// The connection's local ACK timeout: timewait lasts as long.
    ack_timeout: u8,
    /// How long the peer has to answer our last message before it is sent again.
    period: Duration,
    /// How long the peer waits for our answer before it sends again: after we answer its DREQ,
    /// how long a lost DREP may keep it asking.
    peer_period: Duration,
    /// We answered the peer's DREQ: in timewait, it may ask again (see [`CmEndpoint::lingering`]).
    answered_dreq: bool,
    retries_left: u8,
    deadline: Option<Duration>,
    /// The message to send again when the timer fires, or when a duplicate asks for it.
    last: Option<Box<[u8; MAD_LEN]>>,
    /// We rejected its REQ: a repeated REQ gets `last`, the REJ, again.
    rejected: bool,
}

/// MADs waiting to be sent, and how many were.
#[derive(Debug, Default)]
struct Outbox {
    queue: VecDeque<Outgoing>,
}

impl Outbox {
    /// Emits `message` in transaction `tid`, queues it for `dst` and returns the bytes, for a
    /// retransmission.
    fn send(
        &mut self,
        counters: &mut CmCounters,
        dst: IpAddr,
        tid: u64,
        message: &CmMessage,
    ) -> Box<[u8; MAD_LEN]> {
        let mut mad = Box::new([0u8; MAD_LEN]);
        message.emit(tid, 0, &mut mad);
        self.resend(counters, dst, mad.clone());
        mad
    }

    /// Queues bytes sent before.
    fn resend(&mut self, counters: &mut CmCounters, dst: IpAddr, mad: Box<[u8; MAD_LEN]>) {
        counters.mads_sent += 1;
        self.queue.push_back(Outgoing { dst, mad });
    }
}

/// The CM of one device.
pub struct CmEndpoint {
    config: CmConfig,
    local: IpAddr,
    /// The node GUID the CM messages carry.
    ca_guid: u64,
    /// The upper half of every transaction ID of ours (the kernel's MAD agent `hi_tid`).
    tid_hi: u32,
    rng: ChaCha20Rng,
    conns: HashMap<u32, Conn>,
    /// Passive connections by the peer's address and communication ID, to find repeated REQs.
    by_remote: HashMap<(IpAddr, u32), u32>,
    listeners: HashMap<ServiceId, ListenerId>,
    next_listener: u32,
    /// REQs for no listener, oldest first, waiting out the listen grace.
    held: VecDeque<passive::HeldReq>,
    sidr: sidr::SidrTable,
    outbox: Outbox,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
    now: Duration,
    /// The low byte of every communication and SIDR request ID, on a device that shares its
    /// address with other processes ([`CmEndpoint::end_ids_in`]).
    id_place: Option<u8>,
}

impl fmt::Debug for CmEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEndpoint")
            .field("local", &self.local)
            .field("connections", &self.conns.len())
            .field("listeners", &self.listeners.len())
            .finish()
    }
}

/// A random ID, ending in `place`, the device's place in its address group, if it has one.
fn draw_id(rng: &mut ChaCha20Rng, place: Option<u8>) -> u32 {
    let id = rng.next_u32();
    match place {
        Some(place) => (id & !0xff) | u32::from(place),
        None => id,
    }
}

/// A node GUID for a device at `addr`: the EUI-64 of the locally administered MAC address
/// 02:00 and the address's last four bytes, made as rxe makes its GUID from its netdev's MAC
/// (the universal/local bit flipped, ff:fe in the middle).
pub fn node_guid(addr: IpAddr) -> u64 {
    let tail = match addr.to_canonical() {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    u64::from_be_bytes([0x00, 0x00, tail[0], 0xff, 0xfe, tail[1], tail[2], tail[3]])
}

/// The connection `id`, if `src` is its peer; a message from anyone else, or for no
/// connection, is dropped and counted.
fn lookup<'a>(
    conns: &'a mut HashMap<u32, Conn>,
    counters: &mut CmCounters,
    src: IpAddr,
    id: u32,
) -> Option<&'a mut Conn> {
    match conns.get_mut(&id) {
        Some(conn) if conn.peer == src => Some(conn),
        _ => {
            counters.dropped_unexpected += 1;
            None
        }
    }
}

/// `data` at `at` in a zeroed private-data field of `N` bytes; refused if it does not fit.
fn private_data<const N: usize>(data: &[u8], at: usize) -> Result<[u8; N], CmError> {
    let max = N - at;
    if data.len() > max {
        return Err(CmError::PrivateDataTooLong {
            len: data.len(),
            max,
        });
    }
    let mut out = [0u8; N];
    out[at..at + data.len()].copy_from_slice(data);
    Ok(out)
}

/// Refuses a peer address no CM message could reach: the checks of an address vector
/// ([`AddressVector::resolve`](crate::transport::AddressVector::resolve)).
fn check_peer(local: IpAddr, peer: IpAddr) -> Result<IpAddr, CmError> {
    let av = crate::transport::AddressVector { dest: peer };
    let av = av.resolve(local).map_err(CmError::BadAddress)?;
    Ok(av.dest)
}

impl CmEndpoint {
    /// The CM of the device at `local`; `seed` draws its communication and transaction IDs.
    pub fn new(local: IpAddr, seed: u64, config: CmConfig) -> Self {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        CmEndpoint {
            config,
            local: local.to_canonical(),
            ca_guid: node_guid(local),
            tid_hi: rng.next_u32(),
            rng,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            listeners: HashMap::new(),
            next_listener: 1,
            held: VecDeque::new(),
            sidr: sidr::SidrTable::default(),
            outbox: Outbox::default(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
            now: Duration::ZERO,
            id_place: None,
        }
    }

    /// The device's address; an IPv4-mapped IPv6 address is given as IPv4.
    pub fn local_addr(&self) -> IpAddr {
        self.local
    }

    /// The configuration the CM was made with.
    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    /// What the CM received, sent and dropped so far.
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }

    /// How many connections the CM holds, in any state, and SIDR requests in flight.
    pub fn connections(&self) -> usize {
        self.conns.len() + self.sidr.len()
    }

    /// Disconnects still in flight: our DREQs not yet answered, and peers whose DREQ we
    /// answered and that could still send it again, had our DREP been lost. The kernel's CM
    /// outlives the processes that use it and answers such repeats for ever (cm.c
    /// `cm_issue_drep`); softroce's lives in the process, so a process that exits right after
    /// a disconnect waits for this to reach zero, or a peer that lost our DREP retries its DREQ
    /// for a minute before it reports the disconnect ([`Device::linger`]).
    ///
    /// [`Device::linger`]: crate::verbs::Device::linger
    pub fn lingering(&self) -> usize {
        let in_flight = |c: &&Conn| {
            c.state == State::DreqSent || (c.state == State::TimeWait && c.answered_dreq)
        };
        self.conns.values().filter(in_flight).count()
    }

    /// A random 24-bit starting PSN, as the kernel draws one for each RDMA-CM ID.
    pub fn random_psn(&mut self) -> Psn {
        Psn::new(self.rng.next_u32())
    }

    /// Listens on `service_id`: its REQs and SIDR_REQs become events of the returned listener.
    pub fn listen(&mut self, service_id: ServiceId) -> Result<ListenerId, CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::ServiceInUse(service_id));
        }
        let id = ListenerId(self.next_listener);
        self.next_listener = self.next_listener.wrapping_add(1);
        self.listeners.insert(service_id, id);
        self.claim_held(service_id);
        Ok(id)
    }

    /// Stops listening: later REQs for the service are rejected as for no listener.
    pub fn unlisten(&mut self, listener: ListenerId) {
        self.listeners.retain(|_, id| *id != listener);
    }

    /// The next MAD to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.outbox.queue.pop_front()
    }

    /// The next event for the application, if any.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) has work.
    pub fn next_deadline(&self) -> Option<Duration> {
        let conns = self.conns.values().filter_map(|c| c.deadline);
        let held = self.held.front().map(|h| h.until);
        conns.chain(self.sidr.deadline()).chain(held).min()
    }

    /// A MAD from QP1 of `src`.
    pub fn handle_mad(&mut self, now: Duration, src: IpAddr, mad: &[u8]) {
        self.now = self.now.max(now);
        self.counters.mads_received += 1;
        let Ok((header, message)) = CmMessage::parse(mad) else {
            self.counters.dropped_malformed += 1;
            return;
        };
        let src = src.to_canonical();
        let tid = header.tid;
        match message {
            CmMessage::Req(req) => self.on_req(src, tid, &req),
            CmMessage::Rep(rep) => self.on_rep(src, &rep),
            CmMessage::Rtu(rtu) => self.on_rtu(src, rtu.remote_comm_id, rtu.local_comm_id),
            CmMessage::Rej(rej) => self.on_rej(src, &rej),
            CmMessage::Mra(mra) => self.on_mra(src, &mra),
            CmMessage::Dreq(dreq) => self.on_dreq(src, tid, &dreq),
            CmMessage::Drep(drep) => self.on_drep(src, drep.remote_comm_id, drep.local_comm_id),
            CmMessage::SidrReq(req) => self.on_sidr_req(src, tid, &req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(src, &rep),
            // LAP, APR and the rest: path migration has no meaning on RoCE.
            CmMessage::Other { .. } => self.counters.dropped_unexpected += 1,
        }
    }

    /// Runs the timers due at `now`: retransmissions, their exhaustion, timewait's end.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.now = self.now.max(now);
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.on_conn_timer(id);
        }
        self.sidr_timers();
        self.reject_held(now);
    }

    /// A connection's timer fired.
    fn on_conn_timer(&mut self, id: u32) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.deadline = None;
        match conn.state {
            State::TimeWait => self.forget(id),
            State::ReqSent | State::RepSent | State::DreqSent if conn.retries_left > 0 => {
                conn.retries_left -= 1;
                conn.deadline = Some(self.now + conn.period);
                if let Some(mad) = conn.last.clone() {
                    self.counters.retransmissions += 1;
                    self.outbox.resend(&mut self.counters, conn.peer, mad);
                }
            }
            State::DreqSent => {
                // No DREP however often asked: the connection is over all the same.
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
                self.enter_timewait(id);
            }
            // The peer never answered, or the application never did (a REQ waiting for
            // accept, a REP whose QP was never moved): the peer hears why.
            State::ReqSent | State::RepSent | State::ReqRcvd | State::RepRcvd => {
                self.send_rej(id, RejReason::TIMEOUT, &[]);
                self.fail(id, Failure::TimedOut);
            }
            State::Established => {}
        }
    }

    /// Sends a REJ for connection `id`: of its REQ while the application had not answered
    /// (as the kernel, with local communication ID 0), of its REP on the active side, of the
    /// rest otherwise. Returns the bytes.
    fn send_rej(&mut self, id: u32, reason: RejReason, data: &[u8]) -> Option<Box<[u8; MAD_LEN]>> {
        use crate::wire::cm::rej::{REJECTED_OTHER, REJECTED_REP, REJECTED_REQ};
        let conn = self.conns.get(&id)?;
        let (local_comm_id, message_rejected) = match conn.state {
            State::ReqRcvd => (0, REJECTED_REQ),
            State::ReqSent => (id, REJECTED_OTHER),
            State::RepRcvd => (id, REJECTED_REP),
            _ => (id, REJECTED_OTHER),
        };
        let rej = CmRejRepr {
            local_comm_id,
            remote_comm_id: conn.remote_id,
            message_rejected,
            info_length: 0,
            reason,
            ari: [0; crate::wire::cm::rej::REJ_ARI],
            private_data: private_data::<REJ_PRIVATE_DATA>(data, 0).ok()?,
        };
        let (peer, tid) = (conn.peer, conn.tid);
        Some(self.outbox.send(
            &mut self.counters,
            peer,
            tid,
            &CmMessage::Rej(Box::new(rej)),
        ))
    }

    /// Sends connection `id`'s last message again: a repeat asked for it.
    fn resend_last(&mut self, id: u32) {
        if let Some(conn) = self.conns.get(&id) {
            if let Some(mad) = conn.last.clone() {
                self.outbox.resend(&mut self.counters, conn.peer, mad);
            }
        }
    }

    /// The connection ended without a DREQ: reports why and frees its ID.
    fn fail(&mut self, id: u32, failure: Failure) {
        self.events.push_back(CmEvent::Failed {
            conn: ConnId(id),
            failure,
        });
        self.forget(id);
    }

    /// A fresh local communication ID: random, not zero, not in use (cm.c XORs a counter with
    /// a random word; a random draw needs no counter and says nothing of the next one).
    fn fresh_id(&mut self) -> Option<u32> {
        let place = self.id_place;
        (0..64)
            .map(|_| draw_id(&mut self.rng, place))
            .find(|id| *id != 0 && !self.conns.contains_key(id))
    }

    /// Ends every communication and SIDR request ID drawn from now on in `place`: the device
    /// shares its address with other processes, and the kernel steers a CM reply to the process
    /// that its remote ID (or request ID) names by the ID's low byte (`io::group`).
    pub fn end_ids_in(&mut self, place: u8) {
        self.id_place = Some(place);
    }

    /// Our transaction ID for a connection: the agent's half and the communication ID
    /// (cm.c `cm_form_tid`).
    fn tid(&self, local_id: u32) -> u64 {
        (u64::from(self.tid_hi) << 32) | u64::from(local_id)
    }

    /// Connections waiting on a person or a peer: the application's answer to a REQ, or the
    /// RTU after our REP. A flood of REQs fills these first.
    fn pending(&self) -> usize {
        let waiting = |c: &&Conn| matches!(c.state, State::ReqRcvd | State::RepSent);
        self.conns.values().filter(waiting).count()
    }

    /// A connection is gone for good: its ID is free again.
    fn forget(&mut self, id: u32) {
        if let Some(conn) = self.conns.remove(&id) {
            if self.by_remote.get(&(conn.peer, conn.remote_id)) == Some(&id) {
                self.by_remote.remove(&(conn.peer, conn.remote_id));
            }
        }
    }
}
