//! A structure-aware driver of the transport core, in quinn-proto's manner: the bytes of a
//! fuzz input choose a sequence of verbs and network events for two endpoints on the
//! simulator, with a peer that forges and mutates packets. The fuzz target `transport`
//! (fuzz/fuzz_targets/transport.rs) and a property test (tests/transport_fuzz.rs) both run
//! [`run`].
//!
//! What must hold, whatever the input: nothing panics, and memory of node 1's that no key
//! grants neither changes nor leaves in a READ response, at the moment it is built
//! ([`Oracle`]): regions with no remote rights or READ only, regions node 1 deregisters or
//! releases, and regions only a window reaches, which node 1 binds and invalidates, and a
//! peer's SEND with Invalidate too. Node 0 knows every rkey and tries it with every operation,
//! at every address. In half the inputs (the simulator's seed at 128 or above) node 1's QP takes
//! its receives from an SRQ, which the input also resizes and arms.

use super::exposure::{
    Oracle, PRIVATE_IOVA, READ_ONLY_IOVA, REVOCABLE_IOVA, STRIDE, WATCHED_LEN, WINDOWED_IOVA,
};
use super::rc::{connect_end, connect_sharing, Options, Side, ALL, IOVA, MR_LEN};
use super::{addr, forge, Faults, Sim};
use softroce::memory::{inc_rkey, Access, BindMw, MwType};
use softroce::transport::{
    Counters, Datagram, PathMtu, Payload, QpAttr, QpState, RecvWr, SendOp, SendWr, Sge, SgeList,
    SrqId, SrqModify,
};
use softroce::wire::{
    AckSyndrome, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, ExtHeader,
    ExtHeaders, IcrcStatus, IethRepr, ImmDtRepr, Msn, Opcode, PKey, Psn, QKey, Qpn, RKey, RethRepr,
    ROCEV2_UDP_PORT,
};

/// The input, read a value at a time; an exhausted input reads zeros and says so.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.data.len());
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        out
    }

    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A number below `n` (0 for `n` = 0).
    fn below(&mut self, n: u32) -> u32 {
        self.u32().checked_rem(n).unwrap_or(0)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u32) as usize]
    }
}

/// An input written by hand, value by value, as [`Input`] reads it: what a test writes to
/// check that the driver reaches a case and its oracle would see it go wrong.
#[derive(Debug, Default)]
pub struct Script(pub Vec<u8>);

impl Script {
    /// A value that `Input::u32`, `below` or `pick` (an index) reads.
    pub fn u32(mut self, value: u32) -> Self {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// A value that `Input::u8` or `bool` reads.
    pub fn u8(mut self, value: u8) -> Self {
        self.0.push(value);
        self
    }
}

/// What the driver knows of the two sides.
struct World {
    sim: Sim,
    a: Side,
    b: Side,
    /// The SRQ node 1's QP takes its receives from, if it has one.
    srq: Option<SrqId>,
    oracle: Oracle,
    /// rkeys node 0 tries: node 1's regions, revoked or not, and nonsense; and its windows'.
    rkeys: Vec<RKey>,
    wr_id: u64,
}

/// The most actions one input runs, and the most simulator steps one action takes.
const MAX_ACTIONS: usize = 256;
const MAX_STEPS: usize = 64;
/// The depth of node 1's SRQ, when it has one: small, so that inputs fill it.
const SRQ_DEPTH: usize = 16;

/// Runs one input. Panics only where the transport broke an invariant; returns node 1's
/// counters, for a test to see that an input went where it meant to.
pub fn run(data: &[u8]) -> Counters {
    let mut input = Input::new(data);
    let mtu = input.pick(&[PathMtu::Mtu256, PathMtu::Mtu1024, PathMtu::Mtu4096]);
    let seed = input.u8();
    let mut sim = Sim::new(2, u64::from(seed), Faults::default());
    for node in &mut sim.nodes {
        node.set_port_mtu(PathMtu::Mtu4096);
    }
    let options = Options {
        mtu,
        timeout: 6 + input.below(6) as u8,
        retry_cnt: input.below(8) as u8,
        rnr_retry: input.below(8) as u8,
        rd_atomic: [1 + input.below(16) as u8, 1 + input.below(16) as u8],
        ..Default::default()
    };
    let shared = (seed >= 128).then_some(SRQ_DEPTH);
    let ([a, b], srq) = connect_sharing(&mut sim, options, shared);
    let oracle = Oracle::new(&mut sim, b.mr.pd(), &b.mr);
    let mut rkeys = vec![b.mr.rkey(), RKey(0), RKey(input.u32())];
    rkeys.extend(oracle.rkeys());
    let mut world = World {
        sim,
        a,
        b,
        srq,
        oracle,
        rkeys,
        wr_id: 0,
    };
    for _ in 0..MAX_ACTIONS {
        if input.is_empty() {
            break;
        }
        world.act(&mut input);
        world.drain();
        world.oracle.check();
    }
    for _ in 0..MAX_STEPS {
        if !world.sim.step() {
            break;
        }
        world.drain();
    }
    world.oracle.check();
    world.sim.nodes[1].counters().clone()
}

impl World {
    fn act(&mut self, input: &mut Input<'_>) {
        match input.below(10) {
            0 | 1 => self.post_send(input),
            2 => self.post_recv(input),
            3 => {
                for _ in 0..=input.below(MAX_STEPS as u32) {
                    if !self.sim.step() {
                        break;
                    }
                }
            }
            // A few of one node's packets, straight to the other: the rest stay unbuilt, so
            // that a READ can be taken back while it streams.
            4 => {
                let from = input.below(2) as usize;
                self.sim.hand_over(from, 1 - from, input.below(64) as usize);
            }
            5 => self.forge(input),
            6 => self.mutate_next(input),
            7 => self.modify(input),
            8 => self.window(input),
            _ => {
                let released = input.bool();
                if let Some(rkey) = self.oracle.revoke_or_register(&mut self.sim, released) {
                    self.rkeys.push(rkey);
                }
            }
        }
    }

    /// Completions and events are taken as an application would, so that queues stay bounded;
    /// node 1's tell the oracle what its windows grant, and what they no longer grant is
    /// poisoned.
    fn drain(&mut self) {
        while self.sim.nodes[0].poll_cq(self.a.cq).is_some() {}
        while let Some(wc) = self.sim.nodes[1].poll_cq(self.b.cq) {
            self.oracle.completed(&wc);
        }
        for node in 0..2 {
            while self.sim.nodes[node].poll_event().is_some() {}
        }
        self.oracle.settle();
    }

    fn next_id(&mut self) -> u64 {
        self.wr_id += 1;
        self.wr_id
    }

    /// An SGE list of node `side` within its region: up to three elements, lengths up to 8 KiB.
    /// Up to 5 SGEs: past `INLINE_SGES`, so that a list on the heap is covered too.
    fn sges(side: &Side, input: &mut Input<'_>) -> SgeList {
        (0..input.below(6))
            .map(|_| {
                let len = input.below(8192);
                Sge {
                    addr: IOVA + u64::from(input.below((MR_LEN - 8192) as u32)),
                    len,
                    lkey: side.mr.lkey(),
                }
            })
            .collect()
    }

    /// An address node 0 aims at: in node 1's region, in one the oracle watches, or anywhere.
    fn remote_addr(input: &mut Input<'_>) -> u64 {
        let near = |base: u64, input: &mut Input<'_>| base + u64::from(input.below(0x1_0000));
        let nth = |base: u64, input: &mut Input<'_>| base + u64::from(input.below(8)) * STRIDE;
        match input.below(6) {
            0 => near(IOVA, input),
            1 => near(PRIVATE_IOVA, input),
            2 => near(READ_ONLY_IOVA, input),
            3 => {
                let base = nth(REVOCABLE_IOVA, input);
                near(base, input)
            }
            4 => {
                let base = nth(WINDOWED_IOVA, input);
                near(base, input)
            }
            _ => input.u64(),
        }
    }

    fn post_send(&mut self, input: &mut Input<'_>) {
        let rkey = match input.below(8) {
            7 => RKey(input.u32()),
            6 if !self.oracle.windows.is_empty() => {
                let i = input.below(self.oracle.windows.len() as u32) as usize;
                self.oracle.windows[i].rkey
            }
            _ => input.pick(&self.rkeys),
        };
        let remote_addr = Self::remote_addr(input);
        let op = match input.below(9) {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm { imm: input.u32() },
            2 => SendOp::SendWithInv { rkey },
            3 => SendOp::Write { remote_addr, rkey },
            4 => SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: input.u32(),
            },
            5 | 6 => SendOp::Read { remote_addr, rkey },
            7 => SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: input.u64(),
            },
            _ => SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare: input.u64(),
                swap: input.u64(),
            },
        };
        let payload = if op.is_atomic() {
            let at = IOVA + u64::from(input.below((MR_LEN / 8) as u32 - 1)) * 8;
            Payload::Sges(
                [Sge {
                    addr: at,
                    len: 8,
                    lkey: self.a.mr.lkey(),
                }]
                .into(),
            )
        } else if !op.is_read_or_atomic() && input.bool() {
            Payload::Inline(vec![input.u8(); input.below(512) as usize].into())
        } else {
            Payload::Sges(Self::sges(&self.a, input))
        };
        let mut wr = SendWr::new(self.next_id(), op, payload);
        wr.signaled = input.bool();
        wr.fence = input.bool();
        wr.solicited = input.bool();
        let now = self.sim.now;
        let _ = self.sim.nodes[0].post_send(now, self.a.qpn, wr);
    }

    fn post_recv(&mut self, input: &mut Input<'_>) {
        let wr = RecvWr {
            wr_id: self.next_id(),
            sges: Self::sges(&self.b, input),
        };
        let _ = match self.srq {
            Some(srq) => self.sim.nodes[1].post_srq_recv(srq, wr),
            None => self.sim.nodes[1].post_recv(self.b.qpn, wr),
        };
    }

    /// A packet a hostile peer could send: any supported opcode, headers with chosen fields,
    /// to either side, from the connected peer's address or a stranger's; or raw bytes.
    fn forge(&mut self, input: &mut Input<'_>) {
        let to = input.below(2) as usize;
        let from = if input.below(8) == 0 { 7 } else { 1 - to };
        let dest_qp = match input.below(4) {
            0 => Qpn::new(input.u32() & 0xff_ffff),
            _ if to == 0 => self.a.qpn,
            _ => self.b.qpn,
        };
        if input.below(8) == 0 {
            let raw: Vec<u8> = (0..input.below(96)).map(|_| input.u8()).collect();
            self.deliver(from, to, 0, &raw);
            return;
        }
        let opcode = input.pick(Opcode::SUPPORTED);
        let psn =
            Psn::new((Options::default().psn[1 - to]).wrapping_add(input.below(4096)) & 0xff_ffff);
        let mut bth = BthRepr::new(opcode, dest_qp, psn);
        bth.ack_req = input.bool();
        bth.solicited = input.bool();
        if input.below(8) == 0 {
            bth.pkey = PKey(input.u16());
        }
        let rkey = match input.below(4) {
            0 => RKey(input.u32()),
            _ => input.pick(&self.rkeys),
        };
        let remote_addr = Self::remote_addr(input);
        let mut ext = ExtHeaders::default();
        let info = opcode.info().expect("a supported opcode");
        for header in info.headers {
            match header {
                ExtHeader::Reth => {
                    ext.reth = Some(RethRepr {
                        virtual_address: remote_addr,
                        rkey,
                        dma_len: match input.below(4) {
                            0 => input.u32(),
                            _ => input.below(0x1_0000),
                        },
                    })
                }
                ExtHeader::Aeth => {
                    ext.aeth = Some(AethRepr {
                        syndrome: AckSyndrome::from_byte(input.u8()),
                        msn: Msn::new(input.u32() & 0xff_ffff),
                    })
                }
                ExtHeader::Deth => {
                    ext.deth = Some(DethRepr {
                        qkey: QKey(input.u32()),
                        src_qp: Qpn::new(input.u32() & 0xff_ffff),
                    })
                }
                ExtHeader::ImmDt => ext.immdt = Some(ImmDtRepr { data: input.u32() }),
                ExtHeader::Ieth => ext.ieth = Some(IethRepr { rkey }),
                ExtHeader::AtomicEth => {
                    ext.atomic_eth = Some(AtomicEthRepr {
                        virtual_address: remote_addr,
                        rkey,
                        swap_add: input.u64(),
                        compare: input.u64(),
                    })
                }
                ExtHeader::AtomicAckEth => {
                    ext.atomic_ack_eth = Some(AtomicAckEthRepr {
                        original_data: input.u64(),
                    })
                }
                ExtHeader::CnpPad => {}
            }
        }
        let len = if info.payload {
            let any = input.below(4200);
            input.pick(&[0, 1, 255, 256, 1024, 4096, any])
        } else {
            0
        };
        let payload = vec![input.u8(); len as usize];
        let mut packet = forge(bth, ext, &payload);
        for _ in 0..input.below(3) {
            let at = input.below(packet.len() as u32) as usize;
            packet[at] ^= input.u8();
        }
        // Any DSCP and ECN: a CE mark makes the receiver answer with a CNP.
        let class = input.u8();
        self.deliver(from, to, class, &packet);
    }

    /// Delivers bytes as if their ICRC were good: corruption the ICRC would catch is left to
    /// the simulator's own tests; here the parser and the responder get to see it.
    fn deliver(&mut self, from: usize, to: usize, class: u8, packet: &[u8]) {
        let datagram = Datagram {
            src: addr(from),
            src_port: ROCEV2_UDP_PORT,
            dst: addr(to),
            ip_header: None,
            traffic_class: class,
            icrc: IcrcStatus::Ok,
            packet,
        };
        let now = self.sim.now;
        self.sim.nodes[to].handle_received(now, datagram);
    }

    /// The next packets a node sends have a byte changed on the way: a peer whose own packets
    /// misbehave, checked by the other side.
    fn mutate_next(&mut self, input: &mut Input<'_>) {
        let (who, at, xor, count) = (
            input.below(2) as usize,
            input.u8(),
            input.u8() | 1,
            input.below(4),
        );
        let mut left = count;
        self.sim.rewrite = Some(Box::new(move |from, packet| {
            if from == who && left > 0 && !packet.is_empty() {
                left -= 1;
                let at = usize::from(at) % packet.len();
                packet[at] ^= xor;
            }
        }));
    }

    /// Moves either QP to ERROR, RESET and back to RTS, or SQD; or resizes node 1's SRQ, or
    /// arms its limit event, when it has one.
    fn modify(&mut self, input: &mut Input<'_>) {
        let node = input.below(2) as usize;
        let qpn = if node == 0 { self.a.qpn } else { self.b.qpn };
        let now = self.sim.now;
        let to = |state| QpAttr {
            state: Some(state),
            ..Default::default()
        };
        match input.below(4) {
            0 => {
                let _ = self.sim.nodes[node].modify_qp(now, qpn, &to(QpState::Error));
            }
            1 => {
                let _ = self.sim.nodes[node].modify_qp(now, qpn, &to(QpState::Reset));
                let o = Options {
                    mtu: input.pick(&[PathMtu::Mtu512, PathMtu::Mtu2048, PathMtu::Mtu4096]),
                    ..Default::default()
                };
                // Only this side goes through the steps again; its peer did not reset, and
                // keeps its own expectations, as a real peer would.
                let ends = [(0, self.a.qpn), (1, self.b.qpn)];
                let _ = connect_end(&mut self.sim, ends, node, &o);
            }
            2 => {
                let _ = self.sim.nodes[node].modify_qp(now, qpn, &to(QpState::Sqd));
            }
            _ => {
                if let Some(srq) = self.srq {
                    let change = SrqModify {
                        max_wr: input
                            .bool()
                            .then(|| input.below(2 * SRQ_DEPTH as u32) as usize),
                        srq_limit: input.bool().then(|| input.below(SRQ_DEPTH as u32)),
                    };
                    let _ = self.sim.nodes[1].modify_srq(srq, &change);
                }
            }
        }
    }

    /// Node 1 allocates, binds or invalidates a window. A bind goes over node 1's open
    /// region, a guarded one (refused: they have no MW_BIND), or the region only this window
    /// may reach, which the oracle watches.
    fn window(&mut self, input: &mut Input<'_>) {
        let now = self.sim.now;
        let count = self.oracle.windows.len();
        match input.below(3) {
            0 if count < 8 => {
                let kind = input.pick(&[MwType::Type1, MwType::Type2]);
                let rkey = self.sim.nodes[1].alloc_mw(self.b.mr.pd(), kind);
                let rkey = rkey.expect("eight windows at most");
                self.oracle.add_window(&mut self.sim, rkey);
            }
            1 if count > 0 => {
                let i = input.below(count as u32) as usize;
                let window = self.oracle.windows[i].rkey;
                let own = self.oracle.own_region(i);
                let (own_lkey, own_iova) = (own.lkey(), own.iova());
                let [private, read_only] = self.oracle.guarded_lkeys();
                let (region, base, span) = match input.below(4) {
                    0 => (own_lkey, own_iova, WATCHED_LEN),
                    1 => (private, IOVA, MR_LEN),
                    2 => (read_only, IOVA, MR_LEN),
                    _ => (self.b.mr.lkey(), IOVA, MR_LEN),
                };
                let access = Access::REMOTE_WRITE | Access::REMOTE_READ;
                let bind = BindMw {
                    window,
                    new_rkey: inc_rkey(window),
                    region,
                    addr: base + u64::from(input.below(span as u32)),
                    len: u64::from(input.below(span.min(0x1_0000) as u32)),
                    access: if input.bool() { access } else { ALL },
                };
                let is_own = region == own_lkey;
                self.oracle.windows[i].rkey = bind.new_rkey;
                let wr_id = self.next_id();
                self.oracle.binding(wr_id, i, is_own);
                let wr = SendWr::new(wr_id, SendOp::BindMw(bind), Payload::Sges([].into()));
                if self.sim.nodes[1].post_send(now, self.b.qpn, wr).is_err() {
                    self.oracle.not_posted(wr_id);
                }
            }
            _ if count > 0 => {
                let i = input.below(count as u32) as usize;
                let rkey = self.oracle.windows[i].rkey;
                let wr_id = self.next_id();
                self.oracle.invalidating(wr_id, i);
                let op = SendOp::LocalInv { rkey };
                let wr = SendWr::new(wr_id, op, Payload::Sges([].into()));
                if self.sim.nodes[1].post_send(now, self.b.qpn, wr).is_err() {
                    self.oracle.not_posted(wr_id);
                }
            }
            _ => {}
        }
    }
}
