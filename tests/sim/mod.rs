//! A deterministic network for transport endpoints: no sockets, no real time.
//!
//! Each packet an endpoint transmits is sealed with the ICRC a kernel-framed UDP datagram
//! would carry, then may be dropped, duplicated, delayed (which reorders) or have a bit flipped,
//! all drawn from one seeded generator. On delivery its ICRC is checked, so a flipped bit must
//! be caught there and never reach memory. Virtual time jumps to the next delivery or deadline.
//!
//! A node may be a device of several engines ([`Sim::with_lanes`]): one endpoint per lane, all
//! on the node's address and over one shared memory table, each datagram delivered to the
//! endpoint its DestQP belongs to, as the kernel's reuse-port steering does. `nodes` then holds
//! the endpoints, node `n`'s lane `l` at `n * lanes + l`.
//!
//! A [`Bottleneck`] puts a switch in front of one node: what is sent to it queues there for a
//! slower link, is marked CE above a threshold if it is ECN-capable, and is dropped at the
//! queue's limit.

#![allow(dead_code)] // each test binary uses a different part

pub mod cm;
pub mod exposure;
pub mod fuzz;
pub mod rc;
pub mod red;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::rc::Rc;
use std::time::Duration;

use red::Red;
use softroce::memory::DeviceMemory;
use softroce::transport::{
    CongestionConfig, Datagram, Endpoint, EndpointConfig, Lane, MAX_PACKET_LEN,
};
use softroce::wire::{
    BthRepr, Ecn, ExtHeaders, KernelFraming, Opcode, PacketRepr, Psn, RocePacket, ROCEV2_UDP_PORT,
};

/// xorshift64*: small, seedable, good enough to draw network faults.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// What the network does to packets, per direction.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub loss: f64,
    pub duplicate: f64,
    /// Probability of an extra delay of up to `jitter`, which reorders.
    pub reorder: f64,
    pub jitter: Duration,
    pub corrupt: f64,
}

/// Decides the fate of one packet; returning false drops it. Lets a test lose exactly the
/// packet it wants to lose.
pub type Filter = Box<dyn FnMut(usize, &[u8]) -> bool>;

/// Changes a packet a node sends before it is sealed: a peer that misbehaves on purpose.
pub type Rewrite = Box<dyn FnMut(usize, &mut Vec<u8>)>;

/// Sees each packet a node builds, as it built it ([`Sim::take`]), before any rewrite: an
/// oracle of what the node itself put on the wire.
pub type Observe = Box<dyn FnMut(usize, &[u8])>;

/// A switch in front of node `to`, whose port to it is slower than the links into it: a
/// queue that marks ECN-capable packets CE as RED with ECN does (RFC 3168; the DCQCN paper's
/// switch; [`Red`]) and drops what arrives past `limit`. Packets from `to` pass it by: the way
/// back is not congested.
#[derive(Debug, Clone)]
pub struct Bottleneck {
    pub to: usize,
    /// How long its port takes to send one byte.
    pub byte_time: Duration,
    pub red: Red,
    pub limit: usize,
    /// When the port has sent everything queued.
    free_at: Duration,
    /// The longest the queue grew, in bytes.
    pub max_queue: usize,
    pub marked: u64,
    pub dropped: u64,
    /// Bytes each node got through it, by sender.
    pub delivered: Vec<u64>,
}

impl Bottleneck {
    pub fn new(to: usize, byte_time: Duration, red: Red, limit: usize) -> Self {
        Bottleneck {
            to,
            byte_time,
            red,
            limit,
            free_at: Duration::ZERO,
            max_queue: 0,
            marked: 0,
            dropped: 0,
            delivered: Vec::new(),
        }
    }

    /// The bytes queued at `now`.
    pub fn queue_at(&self, now: Duration) -> usize {
        let waiting = self.free_at.saturating_sub(now);
        (waiting.as_nanos() / self.byte_time.as_nanos().max(1)) as usize
    }

    /// A packet of `len` bytes from `from` arrives at `now`: when it leaves, or `None` if
    /// the queue is full.
    fn arrive(&mut self, now: Duration, from: usize, len: usize) -> Option<Duration> {
        let queued = self.queue_at(now);
        if queued + len > self.limit {
            self.dropped += 1;
            return None;
        }
        self.max_queue = self.max_queue.max(queued + len);
        self.free_at = self.free_at.max(now) + self.byte_time * len as u32;
        if self.delivered.len() <= from {
            self.delivered.resize(from + 1, 0);
        }
        self.delivered[from] += len as u64;
        Some(self.free_at)
    }

    /// A packet with traffic class `class` leaves at `now`: marked, if it is ECN-capable, as
    /// RED weighs the bytes queued behind it. Marking as packets leave rather than as they
    /// arrive, as switches built for RoCE do, tells the sender of a queue without making it
    /// wait for the queue first.
    fn leave(&mut self, now: Duration, class: u8, rng: &mut Rng) -> u8 {
        let ect = matches!(Ecn::of_traffic_class(class), Ecn::Ect0 | Ecn::Ect1);
        if ect && rng.chance(self.red.chance(self.queue_at(now))) {
            self.marked += 1;
            class | Ecn::Ce.bits()
        } else {
            class
        }
    }
}

/// Where a packet on its way is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// On the link to its node.
    Link,
    /// On the link to the bottleneck in front of its node.
    ToSwitch,
    /// Queued in the bottleneck, to leave for its node.
    Queued,
}

/// A packet on its way.
#[derive(Debug)]
struct Flight {
    /// The sending node (its address), not its endpoint.
    from: usize,
    /// The endpoint it is delivered to.
    to: usize,
    /// Its IP TOS byte: the ECN codepoint it was sent with, or CE once marked.
    class: u8,
    hop: Hop,
    bytes: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct NetStats {
    pub sent: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
}

pub struct Sim {
    pub now: Duration,
    /// The endpoints: one per node, or `lanes` per node.
    pub nodes: Vec<Endpoint>,
    /// Endpoints (engines) per node.
    pub lanes: usize,
    pub faults: Faults,
    pub rng: Rng,
    pub stats: NetStats,
    pub filter: Option<Filter>,
    pub rewrite: Option<Rewrite>,
    pub observe: Option<Observe>,
    /// How long a node's link takes to send one byte (8 ns is 1 Gbit/s). Zero, the default,
    /// sends at once; otherwise packets queue behind each other, as on a slow or congested link.
    pub byte_time: Duration,
    /// When each node's link (shared by its lanes) has sent everything queued on it.
    link_free: Vec<Duration>,
    latency: Duration,
    /// A switch in front of one node, if any.
    pub bottleneck: Option<Bottleneck>,
    /// (delivery time, sequence) -> the packet
    in_flight: BTreeMap<(Duration, u64), Flight>,
    seq: u64,
    /// Where the nodes build their packets, as an io layer's train: refilled with a junk byte
    /// before each one, so a byte the core failed to write shows (see `take`).
    scratch: Vec<u8>,
}

pub fn addr(node: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, node as u8 + 1))
}

fn framing(from: usize, to: usize) -> KernelFraming {
    let v4 = |n: usize| match addr(n) {
        IpAddr::V4(a) => SocketAddrV4::new(a, ROCEV2_UDP_PORT),
        IpAddr::V6(_) => unreachable!(),
    };
    KernelFraming::V4 {
        src: v4(from),
        dst: v4(to),
    }
}

impl Sim {
    /// Nodes that run congestion control as configured by default: ECT(0) on what they send,
    /// CNPs for CE marks, DCQCN for CNPs.
    pub fn new(nodes: usize, seed: u64, faults: Faults) -> Self {
        Self::with_congestion(nodes, seed, faults, CongestionConfig::default())
    }

    pub fn with_congestion(
        nodes: usize,
        seed: u64,
        faults: Faults,
        congestion: CongestionConfig,
    ) -> Self {
        Self::build(nodes, 1, seed, faults, congestion)
    }

    /// `nodes` devices of `lanes` engines each: node `n`'s lane `l` is endpoint
    /// `n * lanes + l`, on node `n`'s address, over the node's one memory table, drawing the
    /// QP numbers its lane owns, as a device's engines do.
    pub fn with_lanes(nodes: usize, lanes: usize, seed: u64, faults: Faults) -> Self {
        Self::build(nodes, lanes, seed, faults, CongestionConfig::default())
    }

    fn build(
        nodes: usize,
        lanes: usize,
        seed: u64,
        faults: Faults,
        congestion: CongestionConfig,
    ) -> Self {
        let link_free = vec![Duration::ZERO; nodes];
        let endpoints = (0..nodes)
            .flat_map(|n| {
                let node_seed = seed ^ (n as u64 + 1).wrapping_mul(0x5851_f42d_4c95_7f2d);
                let memories = DeviceMemory::shared_by(lanes, node_seed);
                memories.into_iter().enumerate().map(move |(l, memory)| {
                    let lane = Lane::new(l as u32, lanes as u32).expect("1 to 64 lanes");
                    let config = EndpointConfig {
                        local_addr: addr(n),
                        seed: node_seed ^ (l as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                        lane,
                        congestion,
                    };
                    Endpoint::with_memory(config, memory)
                })
            })
            .collect();
        Sim {
            now: Duration::ZERO,
            nodes: endpoints,
            lanes,
            faults,
            rng: Rng::new(seed),
            stats: NetStats::default(),
            filter: None,
            rewrite: None,
            observe: None,
            scratch: vec![0; MAX_PACKET_LEN],
            byte_time: Duration::ZERO,
            link_free,
            latency: Duration::from_micros(5),
            bottleneck: None,
            in_flight: BTreeMap::new(),
            seq: 0,
        }
    }

    fn node_of(&self, ip: IpAddr) -> Option<usize> {
        (0..self.nodes.len() / self.lanes).find(|&n| addr(n) == ip)
    }

    /// The node endpoint `endpoint` belongs to.
    pub fn node(&self, endpoint: usize) -> usize {
        endpoint / self.lanes
    }

    /// The address of endpoint `endpoint`: its node's.
    pub fn addr_of(&self, endpoint: usize) -> IpAddr {
        addr(self.node(endpoint))
    }

    /// The endpoint of node `node` a packet is steered to: its DestQP's lane (QP1's is the
    /// first), as the reuse-port BPF program does; a packet too short for a BTH goes to the
    /// first, which drops it.
    fn steer(&self, node: usize, packet: &[u8]) -> usize {
        let lane = Lane::owner_of_packet(packet, self.lanes as u32).unwrap_or(0);
        node * self.lanes + lane as usize
    }

    /// Queues `bytes` from node `from` for endpoint `to`.
    fn enqueue(&mut self, from: usize, to: usize, class: u8, bytes: Vec<u8>) {
        let sent = self.now.max(self.link_free[from]) + self.byte_time * bytes.len() as u32;
        self.link_free[from] = sent;
        let mut at = sent + self.latency;
        if self.rng.chance(self.faults.reorder) {
            self.stats.reordered += 1;
            let jitter = self.faults.jitter.as_nanos() as u64;
            at += Duration::from_nanos(self.rng.below(jitter + 1));
        }
        self.seq += 1;
        let to_node = self.node(to);
        let hop = if self.bottleneck.as_ref().is_some_and(|b| b.to == to_node) {
            Hop::ToSwitch
        } else {
            Hop::Link
        };
        self.in_flight.insert(
            (at, self.seq),
            Flight {
                from,
                to,
                class,
                hop,
                bytes,
            },
        );
    }

    /// The ECN bits node `from` sends with, as its io layer would write them: ECT(0) if its
    /// congestion control says so.
    fn class_of(&self, from: usize) -> u8 {
        self.nodes[from].congestion_config().ecn().bits()
    }

    /// Node `from`'s next packet and where it goes, its ICRC left zero. It is built into a
    /// buffer of junk, as the io layer's train holds earlier packets' bytes, so every byte on
    /// the wire in every simulator test, fixture comparisons included, is one the core wrote.
    pub fn take(&mut self, from: usize) -> Option<(IpAddr, Vec<u8>)> {
        self.scratch.fill(0xa5);
        let (dst, len) = self.nodes[from].poll_transmit_into(&mut self.scratch)?;
        let packet = &self.scratch[..len];
        if let Some(observe) = &mut self.observe {
            observe(from, packet);
        }
        Some((dst, packet.to_vec()))
    }

    /// Moves every queued transmit onto the wire.
    fn collect(&mut self) {
        for from in 0..self.nodes.len() {
            while let Some((dst, mut bytes)) = self.take(from) {
                let Some(to_node) = self.node_of(dst) else {
                    continue;
                };
                if let Some(rewrite) = &mut self.rewrite {
                    rewrite(from, &mut bytes);
                }
                let (from_node, to) = (self.node(from), self.steer(to_node, &bytes));
                framing(from_node, to_node).seal(&mut bytes);
                self.stats.sent += 1;
                if let Some(filter) = &mut self.filter {
                    if !filter(from, &bytes) {
                        self.stats.dropped += 1;
                        continue;
                    }
                }
                if self.rng.chance(self.faults.loss) {
                    self.stats.dropped += 1;
                    continue;
                }
                if self.rng.chance(self.faults.corrupt) {
                    let bit = self.rng.below(bytes.len() as u64 * 8);
                    bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
                    self.stats.corrupted += 1;
                }
                let class = self.class_of(from);
                if self.rng.chance(self.faults.duplicate) {
                    self.stats.duplicated += 1;
                    self.enqueue(from_node, to, class, bytes.clone());
                }
                self.enqueue(from_node, to, class, bytes);
            }
        }
    }

    /// Puts a packet (its ICRC left zero) on the wire from `from` to node `to`, now, sealed as
    /// the kernel would frame it. `from` need not be a node: any index names an address
    /// (`addr`), so a test can forge packets from a stranger.
    pub fn inject(&mut self, from: usize, to: usize, mut packet: Vec<u8>) {
        framing(from, self.node(to)).seal(&mut packet);
        self.seq += 1;
        let flight = Flight {
            from,
            to,
            class: 0,
            hop: Hop::Link,
            bytes: packet,
        };
        self.in_flight.insert((self.now, self.seq), flight);
    }

    /// Takes up to `limit` packets node `from` has to send and delivers them to node `to` at
    /// once, bypassing the network: a test that wants a responder's lazily built responses to
    /// stay unbuilt drains them a few at a time. Returns how many it moved.
    pub fn hand_over(&mut self, from: usize, to: usize, limit: usize) -> usize {
        let mut moved = 0;
        while moved < limit {
            let Some((_, mut bytes)) = self.take(from) else {
                break;
            };
            let (from_node, to_node) = (self.node(from), self.node(to));
            framing(from_node, to_node).seal(&mut bytes);
            self.deliver(from_node, to, 0, &bytes);
            moved += 1;
        }
        moved
    }

    /// Seals `packet` (its ICRC left zero) and hands it to node `to` at once, bypassing the
    /// network and the nodes' transmissions: a test that wants several requests to arrive
    /// before the node answers any. `from` need not be a node, as with [`inject`](Self::inject).
    pub fn deliver_now(&mut self, from: usize, to: usize, mut packet: Vec<u8>) {
        framing(from, self.node(to)).seal(&mut packet);
        self.deliver(from, to, 0, &packet);
    }

    /// Seals `packet` and hands it to node `to` at once with IP TOS byte `class`: a packet a
    /// switch marked (`Ecn::Ce`), as the io layer reports it.
    pub fn deliver_with_class(&mut self, from: usize, to: usize, class: u8, mut packet: Vec<u8>) {
        framing(from, self.node(to)).seal(&mut packet);
        self.deliver(from, to, class, &packet);
    }

    /// Hands a sealed packet from node (address) `from` to endpoint `to` now, as a UDP socket
    /// with IP_PKTINFO reports it: addresses, no IP header, and the ICRC as far as the
    /// kernel's framing lets it be checked.
    fn deliver(&mut self, from: usize, to: usize, class: u8, bytes: &[u8]) {
        let to_node = self.node(to);
        let datagram = Datagram {
            src: addr(from),
            src_port: ROCEV2_UDP_PORT,
            dst: addr(to_node),
            ip_header: None,
            traffic_class: class,
            icrc: framing(from, to_node).verify(bytes),
            packet: bytes,
        };
        self.nodes[to].handle_received(self.now, datagram);
    }

    /// Advances to the next event and handles it. Returns false when nothing is left to do.
    pub fn step(&mut self) -> bool {
        self.step_with(None)
    }

    /// [`step`](Self::step), with a deadline of the caller's besides the nodes' (a CM
    /// agent's): time stops there too.
    pub fn step_with(&mut self, deadline: Option<Duration>) -> bool {
        self.collect();
        let next_packet = self.in_flight.keys().next().map(|k| k.0);
        let next_timer = self.nodes.iter().filter_map(|n| n.next_deadline()).min();
        let next = [next_packet, next_timer, deadline]
            .into_iter()
            .flatten()
            .min();
        let Some(next) = next else {
            return false;
        };
        self.now = self.now.max(next);
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (at, seq) = *entry.key();
            let mut flight = entry.remove();
            match (flight.hop, &mut self.bottleneck) {
                (Hop::ToSwitch, Some(bottleneck)) => {
                    match bottleneck.arrive(at, flight.from, flight.bytes.len()) {
                        Some(leaves) => {
                            flight.hop = Hop::Queued;
                            self.in_flight.insert((leaves, seq), flight);
                        }
                        None => self.stats.dropped += 1,
                    }
                    continue;
                }
                (Hop::Queued, Some(bottleneck)) => {
                    flight.class = bottleneck.leave(at, flight.class, &mut self.rng);
                }
                _ => {}
            }
            self.deliver(flight.from, flight.to, flight.class, &flight.bytes);
        }
        for node in &mut self.nodes {
            if node.next_deadline().is_some_and(|d| d <= self.now) {
                node.handle_timeout(self.now);
            }
        }
        self.collect();
        true
    }

    /// Steps until `done` holds, or panics after `limit` of virtual time.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Sim) -> bool) {
        while !done(self) {
            assert!(self.now < limit, "simulation did not finish by {limit:?}");
            if !self.step() {
                assert!(done(self), "simulation went idle before finishing");
                return;
            }
        }
    }

    /// Steps until nothing is in flight and no timer is armed.
    pub fn run_idle(&mut self, limit: Duration) {
        while self.step() {
            assert!(self.now < limit, "simulation did not settle by {limit:?}");
        }
    }
}

/// The seed to use: `SOFTROCE_SIM_SEED` if set, so that a failing run can be repeated.
pub fn seed(default: u64) -> u64 {
    let seed = std::env::var("SOFTROCE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("simulation seed {seed} (rerun with SOFTROCE_SIM_SEED={seed})");
    seed
}

/// Everything completed on `cq` of node `node`, in order.
pub fn drain(
    sim: &mut Sim,
    node: usize,
    cq: softroce::transport::CqId,
) -> Vec<softroce::transport::WorkCompletion> {
    std::iter::from_fn(|| sim.nodes[node].poll_cq(cq)).collect()
}

/// `len` bytes of a reproducible pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// Whether `opcode` is one of the four READ responses.
pub fn is_read_response(opcode: Opcode) -> bool {
    matches!(
        opcode,
        Opcode::RcReadResponseFirst
            | Opcode::RcReadResponseMiddle
            | Opcode::RcReadResponseLast
            | Opcode::RcReadResponseOnly
    )
}

/// One packet seen on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub from: usize,
    pub opcode: Opcode,
    pub psn: Psn,
    pub payload_len: usize,
    pub ack_req: bool,
}

/// Records every packet any node sends from now on (it replaces the filter).
pub fn record(sim: &mut Sim) -> Rc<RefCell<Vec<Seen>>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    sim.filter = Some(Box::new(move |from, bytes| {
        if let Ok(p) = RocePacket::new_checked(bytes) {
            log.borrow_mut().push(Seen {
                from,
                opcode: p.bth().opcode(),
                psn: p.bth().psn(),
                payload_len: p.payload().len(),
                ack_req: p.bth().ack_req(),
            });
        }
        true
    }));
    seen
}

/// A RoCE packet with these headers and payload, its ICRC left zero as `poll_transmit`'s are:
/// what a test forges and [`Sim::inject`]s.
pub fn forge(bth: BthRepr, ext: ExtHeaders, payload: &[u8]) -> Vec<u8> {
    let repr = PacketRepr::new(bth, ext, payload.len());
    let mut packet = vec![0; repr.buffer_len()];
    repr.emit_with_payload(&mut packet, payload)
        .expect("a test forges only packets its opcode allows");
    packet
}
