//! Queue-pair states and the attribute rules of `ibv_modify_qp` (IBTA 10.3.1, table 91;
//! the kernel keeps the same table as `qp_state_table` in drivers/infiniband/core/verbs.c).

use std::fmt;
use std::net::IpAddr;

use crate::memory::Access;
use crate::wire::{PKey, Psn, QKey, Qpn, RnrTimer};

/// The transport service of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable Connected (`IBV_QPT_RC`): acknowledged, retried, in order.
    Rc,
    /// Unreliable Connected (`IBV_QPT_UC`): no ACKs; a lost packet loses its message.
    Uc,
    /// Unreliable Datagram (`IBV_QPT_UD`): single-packet SENDs to any QP, checked by Q_Key.
    Ud,
}

/// IBTA 10.3.1 queue-pair states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Reset: nothing may be posted and packets are dropped; a new QP starts here.
    Reset,
    /// Initialized: receive requests may be posted; nothing is sent or received yet.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain.
    Sqd,
    /// Send queue error (UC and UD only).
    Sqe,
    /// Error: outstanding and newly posted requests complete with `WR_FLUSH_ERR`.
    Error,
}

impl QpState {
    /// Every state, in the order of `enum ibv_qp_state` (`IBV_QPS_RESET` is 0, `IBV_QPS_ERR`
    /// 6): a state's index here is its value there.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Error,
    ];
}

/// The path MTU, 256 to 4096 bytes. Serialised as its size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "u32", into = "u32"))]
pub enum PathMtu {
    /// 256 bytes (`IBV_MTU_256`).
    Mtu256,
    /// 512 bytes (`IBV_MTU_512`).
    Mtu512,
    /// 1024 bytes (`IBV_MTU_1024`).
    Mtu1024,
    /// 2048 bytes (`IBV_MTU_2048`).
    Mtu2048,
    /// 4096 bytes (`IBV_MTU_4096`).
    Mtu4096,
}

impl PathMtu {
    /// The MTU in bytes: the most payload one packet carries.
    pub const fn bytes(self) -> usize {
        match self {
            PathMtu::Mtu256 => 256,
            PathMtu::Mtu512 => 512,
            PathMtu::Mtu1024 => 1024,
            PathMtu::Mtu2048 => 2048,
            PathMtu::Mtu4096 => 4096,
        }
    }

    /// The value of `enum ibv_mtu`, which CM messages and perftest's exchange carry: 1 (256)
    /// to 5 (4096).
    pub const fn ibv_enum(self) -> u8 {
        match self {
            PathMtu::Mtu256 => 1,
            PathMtu::Mtu512 => 2,
            PathMtu::Mtu1024 => 3,
            PathMtu::Mtu2048 => 4,
            PathMtu::Mtu4096 => 5,
        }
    }

    /// The path MTU an `enum ibv_mtu` value names; `None` for any other value.
    pub const fn from_ibv_enum(value: u8) -> Option<PathMtu> {
        Some(match value {
            1 => PathMtu::Mtu256,
            2 => PathMtu::Mtu512,
            3 => PathMtu::Mtu1024,
            4 => PathMtu::Mtu2048,
            5 => PathMtu::Mtu4096,
            _ => return None,
        })
    }

    /// The active MTU of a port on a link whose IP MTU is `link_mtu`, by rxe's rule
    /// (`rxe_set_mtu` in rxe.c, `eth_mtu_int_to_enum` in rxe_param.h): the largest path MTU
    /// that fits once 80 bytes of headers (`RXE_MAX_HDR_LENGTH`) are set aside, at most 4096
    /// and never below 256. So 1500 gives 1024 and 9000 gives 4096, as `ibv_devinfo` shows.
    pub const fn of_link(link_mtu: u32) -> PathMtu {
        const HEADERS: u32 = 80;
        match link_mtu.saturating_sub(HEADERS) {
            4096.. => PathMtu::Mtu4096,
            2048.. => PathMtu::Mtu2048,
            1024.. => PathMtu::Mtu1024,
            512.. => PathMtu::Mtu512,
            _ => PathMtu::Mtu256,
        }
    }
}

/// Where a connected QP's peer is: the IP address its GID maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// The peer's IP address, which its RoCEv2 GID maps to.
    pub dest: IpAddr,
}

impl AddressVector {
    /// The address vector as a device at `local` sends to it: an IPv4-mapped IPv6 destination
    /// becomes its IPv4 address. Refused, with the reason, where no RoCE packet could go: an
    /// unspecified, multicast (softroce has no multicast groups) or IPv4 broadcast address,
    /// and an address of the other family than the device's, which its socket cannot reach.
    pub fn resolve(self, local: IpAddr) -> Result<AddressVector, &'static str> {
        let dest = self.dest.to_canonical();
        if dest.is_unspecified() {
            return Err("the destination is an unspecified address (0.0.0.0 or ::)");
        }
        if dest.is_multicast() {
            return Err("the destination is a multicast address: softroce has no multicast");
        }
        if dest == IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
            return Err("the destination is the IPv4 broadcast address");
        }
        if dest.is_ipv4() != local.to_canonical().is_ipv4() {
            return Err("the destination and the device are of different address families");
        }
        Ok(AddressVector { dest })
    }
}

/// The attributes of a modify call; `None` means "not in the mask".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// The state to move to. Required.
    pub state: Option<QpState>,
    /// The state the caller believes the QP is in.
    pub cur_state: Option<QpState>,
    /// The P_Key table index; only 0, whose P_Key is 0xFFFF.
    pub pkey_index: Option<u16>,
    /// The port number; only 1.
    pub port: Option<u8>,
    /// What the peer may do to this side's memory: remote read, write and atomic rights.
    pub access: Option<Access>,
    /// UD: the Q_Key received DETHs must carry.
    pub qkey: Option<QKey>,
    /// RC and UC: where the peer is.
    pub av: Option<AddressVector>,
    /// The path MTU; capped at the port's active MTU.
    pub path_mtu: Option<PathMtu>,
    /// RC and UC: the peer's QP number.
    pub dest_qpn: Option<Qpn>,
    /// The first PSN the receive side expects.
    pub rq_psn: Option<Psn>,
    /// The first PSN the send side uses.
    pub sq_psn: Option<Psn>,
    /// RC: READs and atomics the responder answers at once (responder resources), 0 to 16.
    pub max_dest_rd_atomic: Option<u8>,
    /// RC: READs and atomics the requester has outstanding at once, 0 to 16.
    pub max_rd_atomic: Option<u8>,
    /// RC: the delay this side's RNR NAKs ask for (IBTA table 45 code).
    pub min_rnr_timer: Option<RnrTimer>,
    /// Local ACK timeout: 4.096 µs × 2^timeout; 0 waits forever.
    pub timeout: Option<u8>,
    /// 0 to 7; 7 gives up after 7 retries, as ConnectX does (rxe retries forever).
    pub retry_cnt: Option<u8>,
    /// 0 to 7; 7 retries forever.
    pub rnr_retry: Option<u8>,
}

/// One attribute, by the name `ibv_qp_attr_mask` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttrName {
    /// `IBV_QP_STATE`: [`QpAttr::state`].
    State,
    /// `IBV_QP_CUR_STATE`: [`QpAttr::cur_state`].
    CurState,
    /// `IBV_QP_PKEY_INDEX`: [`QpAttr::pkey_index`].
    PkeyIndex,
    /// `IBV_QP_PORT`: [`QpAttr::port`].
    Port,
    /// `IBV_QP_ACCESS_FLAGS`: [`QpAttr::access`].
    AccessFlags,
    /// `IBV_QP_QKEY`: [`QpAttr::qkey`].
    Qkey,
    /// `IBV_QP_AV`: [`QpAttr::av`].
    Av,
    /// `IBV_QP_PATH_MTU`: [`QpAttr::path_mtu`].
    PathMtu,
    /// `IBV_QP_DEST_QPN`: [`QpAttr::dest_qpn`].
    DestQpn,
    /// `IBV_QP_RQ_PSN`: [`QpAttr::rq_psn`].
    RqPsn,
    /// `IBV_QP_SQ_PSN`: [`QpAttr::sq_psn`].
    SqPsn,
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`: [`QpAttr::max_dest_rd_atomic`].
    MaxDestRdAtomic,
    /// `IBV_QP_MAX_QP_RD_ATOMIC`: [`QpAttr::max_rd_atomic`].
    MaxQpRdAtomic,
    /// `IBV_QP_MIN_RNR_TIMER`: [`QpAttr::min_rnr_timer`].
    MinRnrTimer,
    /// `IBV_QP_TIMEOUT`: [`QpAttr::timeout`].
    Timeout,
    /// `IBV_QP_RETRY_CNT`: [`QpAttr::retry_cnt`].
    RetryCnt,
    /// `IBV_QP_RNR_RETRY`: [`QpAttr::rnr_retry`].
    RnrRetry,
}

type Mask = u32;

const fn bit(name: AttrName) -> Mask {
    1 << name as u32
}

const ALL_NAMES: [AttrName; 17] = [
    AttrName::State,
    AttrName::CurState,
    AttrName::PkeyIndex,
    AttrName::Port,
    AttrName::AccessFlags,
    AttrName::Qkey,
    AttrName::Av,
    AttrName::PathMtu,
    AttrName::DestQpn,
    AttrName::RqPsn,
    AttrName::SqPsn,
    AttrName::MaxDestRdAtomic,
    AttrName::MaxQpRdAtomic,
    AttrName::MinRnrTimer,
    AttrName::Timeout,
    AttrName::RetryCnt,
    AttrName::RnrRetry,
];

/// Why a modify was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModifyError {
    /// IBTA 10.3.1 allows no move between these states for this QP type.
    InvalidTransition {
        /// The QP's state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// `cur_state` does not match the QP's state.
    WrongCurrentState {
        /// The QP's state.
        actual: QpState,
        /// The `cur_state` given.
        claimed: QpState,
    },
    /// The transition requires an attribute the call does not give.
    MissingAttribute {
        /// The attribute missing.
        name: AttrName,
        /// The QP's state.
        from: QpState,
        /// The state asked for (the current one if `state` itself is missing).
        to: QpState,
    },
    /// The call gives an attribute the transition does not take.
    UnexpectedAttribute {
        /// The attribute not taken.
        name: AttrName,
        /// The QP's state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// An attribute's value is refused whatever the transition.
    InvalidValue {
        /// The attribute refused.
        name: AttrName,
        /// The rule it breaks, in words.
        reason: &'static str,
    },
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModifyError::InvalidTransition { from, to } => {
                write!(f, "no transition from {from:?} to {to:?}")
            }
            ModifyError::WrongCurrentState { actual, claimed } => {
                write!(
                    f,
                    "cur_state {claimed:?} given, but the QP is in {actual:?}"
                )
            }
            ModifyError::MissingAttribute { name, from, to } => {
                write!(f, "{from:?} -> {to:?} requires {name:?}")
            }
            ModifyError::UnexpectedAttribute { name, from, to } => {
                write!(f, "{from:?} -> {to:?} does not take {name:?}")
            }
            ModifyError::InvalidValue { name, reason } => write!(f, "{name:?}: {reason}"),
        }
    }
}

impl std::error::Error for ModifyError {}

impl QpAttr {
    fn mask(&self) -> Mask {
        let present = [
            (self.state.is_some(), AttrName::State),
            (self.cur_state.is_some(), AttrName::CurState),
            (self.pkey_index.is_some(), AttrName::PkeyIndex),
            (self.port.is_some(), AttrName::Port),
            (self.access.is_some(), AttrName::AccessFlags),
            (self.qkey.is_some(), AttrName::Qkey),
            (self.av.is_some(), AttrName::Av),
            (self.path_mtu.is_some(), AttrName::PathMtu),
            (self.dest_qpn.is_some(), AttrName::DestQpn),
            (self.rq_psn.is_some(), AttrName::RqPsn),
            (self.sq_psn.is_some(), AttrName::SqPsn),
            (self.max_dest_rd_atomic.is_some(), AttrName::MaxDestRdAtomic),
            (self.max_rd_atomic.is_some(), AttrName::MaxQpRdAtomic),
            (self.min_rnr_timer.is_some(), AttrName::MinRnrTimer),
            (self.timeout.is_some(), AttrName::Timeout),
            (self.retry_cnt.is_some(), AttrName::RetryCnt),
            (self.rnr_retry.is_some(), AttrName::RnrRetry),
        ];
        present
            .iter()
            .filter(|(set, _)| *set)
            .fold(0, |mask, (_, name)| mask | bit(*name))
    }

    /// Checks values that are wrong whatever the transition.
    fn check_values(&self) -> Result<(), ModifyError> {
        let invalid = |name, reason| Err(ModifyError::InvalidValue { name, reason });
        if self.retry_cnt.is_some_and(|v| v > 7) {
            return invalid(AttrName::RetryCnt, "0 to 7");
        }
        if self.rnr_retry.is_some_and(|v| v > 7) {
            return invalid(AttrName::RnrRetry, "0 to 7");
        }
        if self.timeout.is_some_and(|v| v > 31) {
            return invalid(AttrName::Timeout, "0 to 31");
        }
        if self.max_rd_atomic.is_some_and(|v| v > MAX_RD_ATOMIC) {
            return invalid(
                AttrName::MaxQpRdAtomic,
                "at most 128 outstanding READs and atomics",
            );
        }
        if self.max_dest_rd_atomic.is_some_and(|v| v > MAX_RD_ATOMIC) {
            return invalid(
                AttrName::MaxDestRdAtomic,
                "at most 128 outstanding READs and atomics",
            );
        }
        if self.pkey_index.is_some_and(|v| v != 0) {
            return invalid(
                AttrName::PkeyIndex,
                "the P_Key table has one entry, 0xFFFF at index 0",
            );
        }
        if self.port.is_some_and(|v| v != 1) {
            return invalid(AttrName::Port, "the device has one port, port 1");
        }
        Ok(())
    }
}

/// The largest max_rd_atomic and max_dest_rd_atomic softroce accepts: rxe's (`max_qp_rd_atom`
/// and `max_qp_init_rd_atom` in rxe_param.h), since perftest sets a QP's max_rd_atomic to the
/// depth its peer advertised, which is rxe's 128 against kernel rxe. Nothing is allocated by
/// the depth: a responder keeps as many resources as it negotiated and its peer uses.
pub const MAX_RD_ATOMIC: u8 = 128;

/// The required and optional attributes of a transition, or `None` if it is not allowed.
fn rules(qp_type: QpType, from: QpState, to: QpState) -> Option<(Mask, Mask)> {
    use AttrName::*;
    use QpState::*;
    let m = |names: &[AttrName]| names.iter().fold(0, |acc, n| acc | bit(*n));
    let rc = qp_type == QpType::Rc;
    let ud = qp_type == QpType::Ud;
    Some(match (from, to) {
        (_, Reset) | (_, Error) => (0, 0),
        (Reset, Init) => {
            if ud {
                (m(&[PkeyIndex, Port, Qkey]), 0)
            } else {
                (m(&[PkeyIndex, Port, AccessFlags]), 0)
            }
        }
        (Init, Init) => {
            if ud {
                (0, m(&[PkeyIndex, Port, Qkey]))
            } else {
                (0, m(&[PkeyIndex, Port, AccessFlags]))
            }
        }
        (Init, Rtr) => match qp_type {
            QpType::Rc => (
                m(&[Av, PathMtu, DestQpn, RqPsn, MaxDestRdAtomic, MinRnrTimer]),
                m(&[AccessFlags, PkeyIndex]),
            ),
            QpType::Uc => (
                m(&[Av, PathMtu, DestQpn, RqPsn]),
                m(&[AccessFlags, PkeyIndex]),
            ),
            QpType::Ud => (0, m(&[PkeyIndex, Qkey])),
        },
        (Rtr, Rts) => match qp_type {
            QpType::Rc => (
                m(&[SqPsn, Timeout, RetryCnt, RnrRetry, MaxQpRdAtomic]),
                m(&[CurState, AccessFlags, MinRnrTimer]),
            ),
            QpType::Uc => (m(&[SqPsn]), m(&[CurState, AccessFlags])),
            QpType::Ud => (m(&[SqPsn]), m(&[CurState, Qkey])),
        },
        (Rts, Rts) | (Sqd, Rts) => {
            if ud {
                (0, m(&[CurState, Qkey]))
            } else if rc {
                (0, m(&[CurState, AccessFlags, MinRnrTimer]))
            } else {
                (0, m(&[CurState, AccessFlags]))
            }
        }
        (Rts, Sqd) => (0, 0),
        (Sqd, Sqd) => {
            if ud {
                (0, m(&[PkeyIndex, Qkey]))
            } else {
                (
                    0,
                    m(&[
                        AccessFlags,
                        Av,
                        PkeyIndex,
                        MinRnrTimer,
                        Timeout,
                        RetryCnt,
                        RnrRetry,
                    ]) & if rc {
                        !0
                    } else {
                        m(&[AccessFlags, Av, PkeyIndex])
                    },
                )
            }
        }
        (Sqe, Rts) if !rc => {
            if ud {
                (0, m(&[CurState, Qkey]))
            } else {
                (0, m(&[CurState, AccessFlags]))
            }
        }
        _ => return None,
    })
}

/// Checks a modify against the QP's type and state; returns the target state.
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    attr: &QpAttr,
) -> Result<QpState, ModifyError> {
    attr.check_values()?;
    let to = attr.state.ok_or(ModifyError::MissingAttribute {
        name: AttrName::State,
        from: current,
        to: current,
    })?;
    if let Some(claimed) = attr.cur_state {
        if claimed != current {
            return Err(ModifyError::WrongCurrentState {
                actual: current,
                claimed,
            });
        }
    }
    let (required, optional) =
        rules(qp_type, current, to).ok_or(ModifyError::InvalidTransition { from: current, to })?;
    let given = attr.mask() & !bit(AttrName::State);
    let name_of = |mask: Mask| ALL_NAMES.into_iter().find(|n| mask & bit(*n) != 0);
    if let Some(name) = name_of(required & !given) {
        return Err(ModifyError::MissingAttribute {
            name,
            from: current,
            to,
        });
    }
    if let Some(name) = name_of(given & !(required | optional)) {
        return Err(ModifyError::UnexpectedAttribute {
            name,
            from: current,
            to,
        });
    }
    Ok(to)
}

/// The settings a QP accumulates through its modifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSettings {
    /// What the peer may do to this side's memory: remote read, write and atomic rights.
    pub access: Access,
    /// The P_Key every BTH carries and received ones must match (IBTA 10.9.3); 0xFFFF.
    pub pkey: PKey,
    /// UD: the Q_Key received DETHs must carry, sent where a request asks for the QP's own.
    pub qkey: QKey,
    /// RC and UC: where the peer is; `None` until RTR.
    pub av: Option<AddressVector>,
    /// The most payload bytes per packet.
    pub path_mtu: PathMtu,
    /// RC and UC: the peer's QP number, every BTH's destination.
    pub dest_qpn: Qpn,
    /// RC: READs and atomics the responder answers at once; one more is NAKed (IBTA 9.7.5.1.3).
    pub max_dest_rd_atomic: u8,
    /// RC: READs and atomics the requester has outstanding at once; 0 counts as 1.
    pub max_rd_atomic: u8,
    /// RC: the delay this side's RNR NAKs ask for (IBTA table 45 code; 12 is 0.64 ms).
    pub min_rnr_timer: RnrTimer,
    /// RC: the local ACK timeout, 4.096 µs × 2^timeout; 0 waits forever.
    pub timeout: u8,
    /// RC: resends after a timeout, PSN gap or sequence NAK before `RETRY_EXC_ERR`; 0 to 7.
    pub retry_cnt: u8,
    /// RC: resends after an RNR NAK before `RNR_RETRY_EXC_ERR`; 7 retries forever.
    pub rnr_retry: u8,
}

impl Default for QpSettings {
    fn default() -> Self {
        QpSettings {
            access: Access::NONE,
            pkey: PKey::DEFAULT,
            qkey: QKey(0),
            av: None,
            path_mtu: PathMtu::Mtu1024,
            dest_qpn: Qpn::new(0),
            max_dest_rd_atomic: 1,
            max_rd_atomic: 1,
            min_rnr_timer: RnrTimer::new(12),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

impl QpSettings {
    /// Takes every attribute present in `attr`.
    pub fn apply(&mut self, attr: &QpAttr) {
        macro_rules! take {
            ($($field:ident),*) => {$(
                if let Some(v) = attr.$field {
                    self.$field = v;
                }
            )*};
        }
        take!(
            access,
            qkey,
            path_mtu,
            dest_qpn,
            max_dest_rd_atomic,
            max_rd_atomic
        );
        take!(min_rnr_timer, timeout, retry_cnt, rnr_retry);
        if attr.av.is_some() {
            self.av = attr.av;
        }
    }
}

impl TryFrom<u32> for PathMtu {
    type Error = &'static str;

    /// The path MTU of `bytes` bytes: 256, 512, 1024, 2048 or 4096, and nothing else.
    fn try_from(bytes: u32) -> Result<PathMtu, Self::Error> {
        Ok(match bytes {
            256 => PathMtu::Mtu256,
            512 => PathMtu::Mtu512,
            1024 => PathMtu::Mtu1024,
            2048 => PathMtu::Mtu2048,
            4096 => PathMtu::Mtu4096,
            _ => return Err("a path MTU is 256, 512, 1024, 2048 or 4096 bytes"),
        })
    }
}

impl From<PathMtu> for u32 {
    fn from(mtu: PathMtu) -> u32 {
        mtu.bytes() as u32
    }
}

/// One side of a connection, as its peer needs to know it: what an out-of-band exchange
/// carries (perftest's and ibv_rc_pingpong's `pingpong_dest`, a CM REQ's or REP's fields).
///
/// Each side hands its own to the other ([`QueuePair::endpoint`](crate::verbs::QueuePair::endpoint))
/// and connects with the one it receives. With the `serde` feature it serialises, the numbers
/// as plain integers and the MTU in bytes; deserialising refuses a QPN or PSN wider than 24 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpEndpoint {
    /// The address the side's device is reached at (its GID).
    pub addr: IpAddr,
    /// The side's queue pair.
    pub qpn: Qpn,
    /// The PSN this side sends from: the first one its peer expects (the peer's `rq_psn`).
    pub psn: Psn,
    /// The largest path MTU this side takes: its port's active MTU. A connection uses the
    /// smaller of the two sides' unless told otherwise.
    pub mtu: PathMtu,
    /// The Q_Key a UD QP checks on receive, which senders to it put in their requests. RC and
    /// UC QPs carry none (0).
    pub qkey: QKey,
}

/// The attributes [`connect_steps`] sets, with the values ibv_rc_pingpong and perftest use.
///
/// The defaults a user should know: the peer may write, read and do atomics on whatever
/// memory this side's regions grant it (the QP's own access is the widest; each region's
/// access still limits what its key allows), 7 retries of each kind, and 16 READs or atomics
/// in flight each way.
///
/// ```
/// use softroce::memory::Access;
/// use softroce::verbs::ConnectOptions;
///
/// let o = ConnectOptions::default();
/// assert_eq!(
///     o.access,
///     Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
/// );
/// assert_eq!((o.retry_cnt, o.rnr_retry, o.max_rd_atomic), (7, 7, 16));
/// assert_eq!(o.mtu, None); // the smaller of the two ports'
/// // A QP whose peer may only read:
/// let read_only = ConnectOptions {
///     access: Access::LOCAL_WRITE | Access::REMOTE_READ,
///     ..ConnectOptions::default()
/// };
/// # let _ = read_only;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The path MTU. `None` (the default): the smaller of the peer's [`QpEndpoint::mtu`] and
    /// this port's active MTU.
    pub mtu: Option<PathMtu>,
    /// What the peer may do to this side's memory through the QP. Default: write, read and
    /// atomics (and local write), each region's own access limiting it further.
    pub access: Access,
    /// 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// Transport retries before a request completes with RETRY_EXC_ERR (0 to 7).
    pub retry_cnt: u8,
    /// RNR NAK retries before RNR_RETRY_EXC_ERR; 7 retries for ever (IBTA 9.7.5.2.8).
    pub rnr_retry: u8,
    /// How long this side asks a peer to wait after an RNR NAK.
    pub min_rnr_timer: RnrTimer,
    /// READs and atomics outstanding at once, each way (`max_rd_atomic` and
    /// `max_dest_rd_atomic`).
    pub max_rd_atomic: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            mtu: None,
            access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: RnrTimer::new(12),
            max_rd_atomic: 16,
        }
    }
}

/// `ibv_modify_qp` to INIT, RTR and RTS: what connects a QP of type `qp_type` to `remote`,
/// sending from `sq_psn`. UC gets only the attributes UC takes: the timeouts, retry counts and
/// READ/atomic depths are RC's alone, and `check_modify` refuses them on UC. Without an MTU in
/// `o`, the path MTU is the peer's; the transport lowers it to the port's.
pub fn connect_steps(
    qp_type: QpType,
    remote: &QpEndpoint,
    sq_psn: Psn,
    o: &ConnectOptions,
) -> [QpAttr; 3] {
    let rc = qp_type == QpType::Rc;
    [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(o.access),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AddressVector { dest: remote.addr }),
            path_mtu: Some(o.mtu.unwrap_or(remote.mtu)),
            dest_qpn: Some(remote.qpn),
            rq_psn: Some(remote.psn),
            max_dest_rd_atomic: rc.then_some(o.max_rd_atomic),
            min_rnr_timer: rc.then_some(o.min_rnr_timer),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            timeout: rc.then_some(o.timeout),
            retry_cnt: rc.then_some(o.retry_cnt),
            rnr_retry: rc.then_some(o.rnr_retry),
            max_rd_atomic: rc.then_some(o.max_rd_atomic),
            ..Default::default()
        },
    ]
}

/// `ibv_modify_qp` to INIT, RTR and RTS of a UD QP that checks `qkey`, sending from PSN 0: as
/// the CM readies QP1 (Q_Key 0x80010000) and librdmacm its UD QPs (RDMA-CM's Q_Key).
pub fn datagram_steps(qkey: QKey) -> [QpAttr; 3] {
    [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(qkey),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0)),
            ..Default::default()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn init() -> QpAttr {
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(Access::REMOTE_WRITE),
            ..Default::default()
        }
    }

    fn rtr() -> QpAttr {
        QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AddressVector {
                dest: Ipv4Addr::LOCALHOST.into(),
            }),
            path_mtu: Some(PathMtu::Mtu1024),
            dest_qpn: Some(Qpn::new(5)),
            rq_psn: Some(Psn::new(0)),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(RnrTimer::new(12)),
            ..Default::default()
        }
    }

    #[test]
    fn address_vectors_a_device_cannot_send_to_are_refused() {
        let v4: IpAddr = Ipv4Addr::new(10, 0, 0, 1).into();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let av = |dest: &str| AddressVector {
            dest: dest.parse().unwrap(),
        };
        assert_eq!(
            av("::ffff:10.0.0.2").resolve(v4),
            Ok(av("10.0.0.2")),
            "an IPv4-mapped GID is its IPv4 address"
        );
        assert_eq!(av("fd00::2").resolve(v6), Ok(av("fd00::2")));
        for (dest, local, why) in [
            ("0.0.0.0", v4, "unspecified"),
            ("::", v6, "unspecified"),
            ("224.0.0.1", v4, "multicast"),
            ("ff02::1", v6, "multicast"),
            ("::ffff:255.255.255.255", v4, "broadcast"),
            ("fd00::2", v4, "families"),
            ("10.0.0.2", v6, "families"),
            ("::ffff:10.0.0.2", v6, "families"),
        ] {
            let err = av(dest).resolve(local).unwrap_err();
            assert!(err.contains(why), "{dest} from {local}: {err}");
        }
    }

    #[test]
    fn the_rc_path_to_rts() {
        use QpState::*;
        assert_eq!(check_modify(QpType::Rc, Reset, &init()), Ok(Init));
        assert_eq!(check_modify(QpType::Rc, Init, &rtr()), Ok(Rtr));
        let rts = QpAttr {
            state: Some(Rts),
            sq_psn: Some(Psn::new(0)),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..Default::default()
        };
        assert_eq!(check_modify(QpType::Rc, Rtr, &rts), Ok(Rts));
        assert_eq!(
            check_modify(
                QpType::Rc,
                Rts,
                &QpAttr {
                    state: Some(Error),
                    ..Default::default()
                }
            ),
            Ok(Error)
        );
    }

    #[test]
    fn missing_unexpected_and_invalid() {
        use QpState::*;
        let mut attr = rtr();
        attr.dest_qpn = None;
        assert_eq!(
            check_modify(QpType::Rc, Init, &attr),
            Err(ModifyError::MissingAttribute {
                name: AttrName::DestQpn,
                from: Init,
                to: Rtr
            })
        );
        let mut attr = rtr();
        attr.sq_psn = Some(Psn::new(1));
        assert_eq!(
            check_modify(QpType::Rc, Init, &attr),
            Err(ModifyError::UnexpectedAttribute {
                name: AttrName::SqPsn,
                from: Init,
                to: Rtr
            })
        );
        assert_eq!(
            check_modify(QpType::Rc, Reset, &rtr()),
            Err(ModifyError::InvalidTransition {
                from: Reset,
                to: Rtr
            })
        );
        let mut attr = init();
        attr.retry_cnt = Some(8);
        assert!(matches!(
            check_modify(QpType::Rc, Reset, &attr),
            Err(ModifyError::InvalidValue {
                name: AttrName::RetryCnt,
                ..
            })
        ));
        // SQE exists for UC and UD only.
        let back = QpAttr {
            state: Some(Rts),
            ..Default::default()
        };
        assert!(check_modify(QpType::Uc, Sqe, &back).is_ok());
        assert!(check_modify(QpType::Rc, Sqe, &back).is_err());
        // UD takes a Q_Key at INIT, not access flags.
        let mut ud = init();
        ud.access = None;
        ud.qkey = Some(QKey(0x11111111));
        assert!(check_modify(QpType::Ud, Reset, &ud).is_ok());
        assert!(check_modify(QpType::Rc, Reset, &ud).is_err());
    }

    /// rxe's active MTU for a link MTU (rxe_param.h): 80 bytes set aside, then rounded down.
    #[test]
    fn port_mtu_of_a_link_as_rxe_has_it() {
        for (link, port) in [
            (0, PathMtu::Mtu256),
            (576, PathMtu::Mtu256),
            (1023 + 80, PathMtu::Mtu512),
            (1024 + 80, PathMtu::Mtu1024),
            (1500, PathMtu::Mtu1024),
            (2048 + 80, PathMtu::Mtu2048),
            (4095 + 80, PathMtu::Mtu2048),
            (4096 + 80, PathMtu::Mtu4096),
            (9000, PathMtu::Mtu4096),
            (65536, PathMtu::Mtu4096),
        ] {
            assert_eq!(PathMtu::of_link(link), port, "link MTU {link}");
        }
    }
}
