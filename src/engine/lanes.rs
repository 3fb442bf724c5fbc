//! A device of several engines: what each engine holds of the others.
//!
//! Every engine has its own endpoint, socket and thread; they share the memory table
//! ([`DeviceMemory`]) and nothing else. The kernel steers each datagram to its QP's engine
//! (`io::udp`'s reuse-port program), once per receive, so a datagram reaches its owner
//! directly unless it came in a coalesced train that mixes QPs (a peer of one engine sends
//! such trains unless told not to; a peer of several cuts its own per QP,
//! `UdpConfig::trains_per_qp`; GRO may merge a flow's datagrams), or came before the program
//! was set. Such a datagram is copied and handed to its owner through a bounded channel: a
//! hop, counted in [`IoCounters::handed_over`], and dropped and counted
//! ([`IoCounters::handover_dropped`]) when the owner is that far behind, as the socket would
//! have dropped it.
//!
//! The device's CM runs on the first engine. It moves QPs of the other engines with a call to
//! their engine ([`LaneQps`]), which waits for the answer: only the first engine ever waits on
//! another, and every engine of such a device runs on a thread of its own, so the call always
//! finds its engine running and cannot wait in a circle. Only the first engine holds the other
//! engines' command channels, and none its own, so an engine still learns that every handle of
//! the application is gone.
//!
//! The engines stop together: one whose socket fails or whose turn panics sets the device's
//! one failure and halts the others ([`Lanes::halt_all`]), which flush their QPs and let go
//! of their CQs' channels, so that no completion is waited for on an engine that is gone.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use mio::{Poll, Waker};
use rustc_hash::FxHashMap;

use super::{Command, Failure, WAKE};
use crate::cm::AppQps;
use crate::io::IoCounters;
use crate::memory::DeviceMemory;
use crate::transport::{
    Datagram, Endpoint, Lane, QpAttr, QpState, QpType, VerbsError, MAX_PACKET_LEN,
};
use crate::wire::{IcrcStatus, Qpn};

/// Datagrams waiting for their engine before more are dropped: four receive budgets. Only
/// datagrams of at most [`MAX_PACKET_LEN`] bytes are handed over, so about 1 MiB.
const HOPS_WAITING: usize = 256;
/// How long the CM takes an answer about another engine's QP to stay true (how many packets it
/// has received), so that a connection waiting for its RTU does not cost a call every turn.
const RECEIVED_FRESH: Duration = Duration::from_millis(1);

/// A datagram that reached the wrong engine, copied for the one that owns its QP.
#[derive(Debug)]
pub(crate) struct Hop {
    src: IpAddr,
    src_port: u16,
    dst: IpAddr,
    traffic_class: u8,
    icrc: IcrcStatus,
    /// The IP header's length at the front of `bytes`, if the io layer had one.
    header: Option<usize>,
    bytes: Vec<u8>,
}

impl Hop {
    fn of(datagram: &Datagram<'_>) -> Hop {
        let header = datagram.ip_header.unwrap_or_default();
        let mut bytes = Vec::with_capacity(header.len() + datagram.packet.len());
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(datagram.packet);
        Hop {
            src: datagram.src,
            src_port: datagram.src_port,
            dst: datagram.dst,
            traffic_class: datagram.traffic_class,
            icrc: datagram.icrc,
            header: datagram.ip_header.map(<[u8]>::len),
            bytes,
        }
    }

    fn datagram(&self) -> Datagram<'_> {
        let (header, packet) = self.bytes.split_at(self.header.unwrap_or(0));
        Datagram {
            src: self.src,
            src_port: self.src_port,
            dst: self.dst,
            ip_header: self.header.map(|_| header),
            traffic_class: self.traffic_class,
            icrc: self.icrc,
            packet,
        }
    }
}

/// How to reach one engine from another.
#[derive(Debug)]
pub(crate) struct Peer {
    hops: Sender<Hop>,
    waker: Arc<Waker>,
}

/// What one engine is given when the device starts, besides its backend.
pub(crate) struct LaneStart {
    pub lane: Lane,
    pub memory: DeviceMemory,
    pub poll: Poll,
    pub waker: Arc<Waker>,
    pub commands: (Sender<Command>, Receiver<Command>),
    pub lanes: Lanes,
    /// Why the device stopped, once one of its engines stopped on its own.
    pub failure: Failure,
}

/// The parts of `count` engines, in engine order, which share one memory table whose keys
/// come from `seed`.
pub(crate) fn prepare(count: u32, seed: u64) -> io::Result<Vec<LaneStart>> {
    if Lane::new(0, count).is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a device runs 1 to {} engines", crate::transport::MAX_LANES),
        ));
    }
    let mut parts = Vec::new();
    let mut peers = Vec::new();
    let mut senders = Vec::new();
    let tables = DeviceMemory::shared_by(count as usize, seed);
    for (index, memory) in (0..count).zip(tables) {
        let lane = Lane::new(index, count).expect("a valid count");
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let commands = crossbeam_channel::unbounded();
        let (hops, inbox) = bounded(HOPS_WAITING);
        peers.push(Peer {
            hops,
            waker: waker.clone(),
        });
        senders.push(commands.0.clone());
        parts.push((lane, memory, poll, waker, commands, inbox));
    }
    let peers: Arc<[Peer]> = peers.into();
    let (halt, failure) = (Arc::new(AtomicBool::new(false)), Failure::default());
    let parts = parts
        .into_iter()
        .map(|(lane, memory, poll, waker, commands, inbox)| {
            // The first engine's CM calls the others; no engine holds its own channel.
            let others = match lane.index() {
                0 => (senders.iter().enumerate())
                    .map(|(index, tx)| (index != 0).then(|| tx.clone()))
                    .collect(),
                _ => Vec::new(),
            };
            let lanes = Lanes {
                lane,
                inbox,
                peers: peers.clone(),
                commands: others,
                halt: halt.clone(),
                to_wake: 0,
                handed_over: 0,
                handover_dropped: 0,
            };
            LaneStart {
                lane,
                memory,
                poll,
                waker,
                commands,
                lanes,
                failure: failure.clone(),
            }
        });
    Ok(parts.collect())
}

/// One engine's view of the device's other engines.
pub(crate) struct Lanes {
    lane: Lane,
    /// Datagrams other engines handed over.
    inbox: Receiver<Hop>,
    /// Every engine, this one included, by index.
    peers: Arc<[Peer]>,
    /// The first engine's: the other engines' command channels, by index (`None` for its
    /// own). Empty on the others.
    commands: Vec<Option<Sender<Command>>>,
    /// Set when an engine stopped on its own: every engine stops.
    halt: Arc<AtomicBool>,
    /// The engines handed datagrams since the last [`wake`](Self::wake), one bit each.
    to_wake: u64,
    handed_over: u64,
    handover_dropped: u64,
}

impl Lanes {
    /// Hands `datagram` to the engine that owns its QP, if that is another; false if it is
    /// this engine's to handle.
    pub fn hand_over(&mut self, datagram: &Datagram<'_>) -> bool {
        if self.lane.count() == 1 {
            return false;
        }
        // Longer than any packet softroce takes: no use copying it anywhere, and this engine's
        // endpoint drops and counts it.
        if datagram.packet.len() > MAX_PACKET_LEN {
            return false;
        }
        let owner = match Lane::owner_of_packet(datagram.packet, self.lane.count()) {
            Some(owner) if owner != self.lane.index() => owner,
            // Its own, or too short to say: this engine's endpoint drops and counts a runt.
            _ => return false,
        };
        match self.peers[owner as usize].hops.try_send(Hop::of(datagram)) {
            Ok(()) => {
                self.handed_over += 1;
                self.to_wake |= 1 << owner;
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.handover_dropped += 1;
            }
        }
        true
    }

    /// Wakes the engines handed datagrams since the last call.
    pub fn wake(&mut self) {
        while self.to_wake != 0 {
            let owner = self.to_wake.trailing_zeros();
            self.to_wake &= self.to_wake - 1;
            // An engine that cannot be woken has stopped; what it was handed is lost with it.
            let _ = self.peers[owner as usize].waker.wake();
        }
    }

    /// Handles up to `budget` datagrams other engines handed over; how many there were.
    pub fn receive(&mut self, budget: usize, deliver: &mut dyn FnMut(Datagram<'_>)) -> usize {
        // Alone, nothing is handed over: no look at the channel (a turn's fixed cost).
        if self.lane.count() == 1 {
            return 0;
        }
        let mut n = 0;
        for hop in self.inbox.try_iter().take(budget) {
            deliver(hop.datagram());
            n += 1;
        }
        n
    }

    /// Stops every engine of the device: this one stopped on its own (its socket failed, or a
    /// turn panicked), and the device stops with it.
    pub fn halt_all(&self) {
        self.halt.store(true, Ordering::SeqCst);
        for (index, peer) in self.peers.iter().enumerate() {
            if index != self.lane.index() as usize {
                // An engine that cannot be woken has stopped already.
                let _ = peer.waker.wake();
            }
        }
    }

    /// Whether another engine of the device stopped on its own ([`halt_all`](Self::halt_all)).
    pub fn halted(&self) -> bool {
        self.halt.load(Ordering::SeqCst)
    }

    /// Adds what this engine handed over to the backend's counters.
    pub fn count(&self, io: &mut IoCounters) {
        io.handed_over += self.handed_over;
        io.handover_dropped += self.handover_dropped;
    }

    /// The application's QPs as the CM sees them from this engine.
    pub fn app_qps(&self) -> LaneQps {
        LaneQps {
            lane: self.lane,
            peers: self.peers.clone(),
            commands: self.commands.clone(),
            received: FxHashMap::default(),
        }
    }
}

/// The first engine's way to the QPs of every engine, for the CM (see the module
/// documentation).
#[derive(Debug)]
pub(crate) struct LaneQps {
    lane: Lane,
    peers: Arc<[Peer]>,
    /// The other engines' command channels, by index.
    commands: Vec<Option<Sender<Command>>>,
    /// What other engines' QPs answered when asked how many packets they received (`None`:
    /// the QP is gone), and when.
    received: FxHashMap<Qpn, (Duration, Option<u64>)>,
}

impl LaneQps {
    /// Runs a command on the engine that owns `qpn` (not this one), and waits for its answer;
    /// `None` if that engine has stopped.
    fn call<T>(&self, qpn: Qpn, make: impl FnOnce(Sender<T>) -> Command) -> Option<T> {
        let owner = Lane::owner(qpn, self.lane.count()) as usize;
        let commands = self.commands.get(owner)?.as_ref()?;
        let (reply, answer) = bounded(1);
        commands.send(make(reply)).ok()?;
        self.peers[owner].waker.wake().ok()?;
        answer.recv().ok()
    }
}

impl LaneQps {
    /// The type and state of `qpn`, wherever it is.
    fn info(&self, ep: &Endpoint, qpn: Qpn) -> Option<(QpType, QpState)> {
        if self.lane.owns(qpn) {
            return ep.qp_type(qpn).zip(ep.qp_state(qpn));
        }
        self.call(qpn, |reply| Command::QpInfo(qpn, reply))
            .flatten()
    }
}

impl AppQps for LaneQps {
    fn qp_type(&mut self, ep: &Endpoint, qpn: Qpn) -> Option<QpType> {
        self.info(ep, qpn).map(|(qp_type, _)| qp_type)
    }

    fn qp_state(&mut self, ep: &Endpoint, qpn: Qpn) -> Option<QpState> {
        self.info(ep, qpn).map(|(_, state)| state)
    }

    fn qp_received(&mut self, ep: &Endpoint, now: Duration, qpn: Qpn) -> Option<u64> {
        if self.lane.owns(qpn) {
            return ep.qp_received(qpn);
        }
        if let Some(&(asked, n)) = self.received.get(&qpn) {
            if now.saturating_sub(asked) < RECEIVED_FRESH {
                return n;
            }
        }
        let n = self
            .call(qpn, |reply| Command::QpReceived(qpn, reply))
            .flatten();
        // Only answers still fresh are kept, so the map holds no more than the connections
        // asked about in the last millisecond.
        self.received
            .retain(|_, &mut (asked, _)| now.saturating_sub(asked) < RECEIVED_FRESH);
        self.received.insert(qpn, (now, n));
        n
    }

    fn modify_qp(
        &mut self,
        ep: &mut Endpoint,
        now: Duration,
        qpn: Qpn,
        attr: &QpAttr,
    ) -> Result<(), VerbsError> {
        if self.lane.owns(qpn) {
            return ep.modify_qp(now, qpn, attr);
        }
        let attr = Box::new(attr.clone());
        self.call(qpn, |reply| Command::ModifyQp(qpn, attr, reply))
            .unwrap_or(Err(VerbsError::UnknownQp(qpn)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram to `qpn` from a UDP socket (no IP header) or a raw one (with one).
    fn datagram<'a>(packet: &'a [u8], ip_header: Option<&'a [u8]>) -> Datagram<'a> {
        Datagram {
            src: "127.0.0.1".parse().unwrap(),
            src_port: 0xc000,
            dst: "127.0.0.2".parse().unwrap(),
            ip_header,
            traffic_class: 0,
            icrc: IcrcStatus::Ok,
            packet,
        }
    }

    fn to_qp(qpn: u32) -> [u8; 16] {
        let mut packet = [0x5a; 16];
        packet[4..8].copy_from_slice(&qpn.to_be_bytes());
        packet
    }

    fn handed(lanes: &mut Lanes) -> Vec<(Option<Vec<u8>>, Vec<u8>, u16)> {
        let mut got = Vec::new();
        lanes.receive(64, &mut |d| {
            got.push((
                d.ip_header.map(<[u8]>::to_vec),
                d.packet.to_vec(),
                d.src_port,
            ))
        });
        got
    }

    /// What each of two engines holds of the other.
    fn two_engines() -> Vec<Lanes> {
        let parts = prepare(2, 1).unwrap().into_iter();
        parts.map(|parts| parts.lanes).collect()
    }

    /// A datagram for another engine's QP reaches that engine as it arrived, IP header and
    /// all; one for this engine's, or too short to name a QP, stays.
    #[test]
    fn a_datagram_for_another_engine_is_handed_to_it_whole() {
        let mut lanes = two_engines();
        let (odd, even) = (to_qp(0x13), to_qp(0x14));
        let header = [0x45; 20];
        assert!(lanes[0].hand_over(&datagram(&odd, None)));
        assert!(lanes[0].hand_over(&datagram(&odd, Some(&header))));
        assert!(!lanes[0].hand_over(&datagram(&even, None)));
        assert!(
            !lanes[0].hand_over(&datagram(&to_qp(1), None)),
            "QP1 is the first's"
        );
        assert!(
            !lanes[0].hand_over(&datagram(&odd[..7], None)),
            "a runt stays"
        );
        // Longer than any packet: not copied, but dropped where it arrived.
        let mut long = vec![0x5a; MAX_PACKET_LEN + 1];
        long[4..8].copy_from_slice(&0x13u32.to_be_bytes());
        assert!(
            !lanes[0].hand_over(&datagram(&long, None)),
            "too long to copy"
        );
        assert!(!lanes[1].hand_over(&datagram(&odd, None)));
        assert_eq!(
            handed(&mut lanes[1]),
            [
                (None, odd.to_vec(), 0xc000),
                (Some(header.to_vec()), odd.to_vec(), 0xc000)
            ]
        );
        assert!(handed(&mut lanes[0]).is_empty());
        let mut io = IoCounters::default();
        lanes[0].count(&mut io);
        assert_eq!((io.handed_over, io.handover_dropped), (2, 0));
    }

    /// An engine that has fallen behind by a whole channel of datagrams loses the next ones,
    /// counted, as its socket would have: the engine handing over never waits.
    #[test]
    fn a_full_engine_drops_what_it_is_handed_and_counts_it() {
        let mut lanes = two_engines();
        let odd = to_qp(0x13);
        for _ in 0..HOPS_WAITING + 3 {
            assert!(lanes[0].hand_over(&datagram(&odd, None)));
        }
        let mut io = IoCounters::default();
        lanes[0].count(&mut io);
        assert_eq!(
            (io.handed_over, io.handover_dropped),
            (HOPS_WAITING as u64, 3)
        );
    }
}
