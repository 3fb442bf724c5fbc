//! One side's device resources for a perftest session (`struct pingpong_context`): the buffer,
//! the QPs and CQs, how data QPs are connected, `--check-data`'s pattern and check, and the
//! clock the tests time with.

use std::net::SocketAddr;
use std::time::Instant;

use super::super::perftest_cm::{connect_retrying, DataRequests};
use super::super::perftest_keys::Keys;
use super::super::pingpong::gid_of;
use super::super::{answer_late_resends, failed, Error, Limits, Reservation, Result, Watch};
use super::{
    buffer_len, cycled, stride, AtomicOp, Options, Phase, Plan, Test, Timing, Verb, ATOMIC_ADD,
};
use crate::memory::{Access, MemoryRegion};
use crate::transport::{Payload, RecvWr, SendOp, SendWr, WcStatus, WorkCompletion};
use crate::verbs::{
    CompletionQueue, ConnectOptions, Connection, Device, ProtectionDomain, QueuePair,
};

/// A data QP: as created, or connected by RDMA-CM (`-R`), which owns it.
pub(super) enum DataQp {
    Plain(QueuePair),
    Connected(Connection),
}

impl std::ops::Deref for DataQp {
    type Target = QueuePair;
    fn deref(&self) -> &QueuePair {
        match self {
            DataQp::Plain(qp) => qp,
            DataQp::Connected(conn) => conn,
        }
    }
}

/// One side's device resources (`struct pingpong_context`).
pub(super) struct Context {
    pub(super) device: Device,
    pub(super) pd: ProtectionDomain,
    pub(super) mr: MemoryRegion,
    pub(super) send_cq: CompletionQueue,
    pub(super) recv_cq: CompletionQueue,
    pub(super) qps: Vec<DataQp>,
    /// The queue depths each QP is created with.
    pub(super) depths: (usize, usize),
    /// Each QP's share of each half of the buffer.
    pub(super) slice: u64,
    /// The page messages cycle through, and the cache line they step by.
    pub(super) cycle: u64,
    pub(super) cache_line: u64,
    pub(super) gid: std::net::Ipv6Addr,
    pub(super) verb: Verb,
    pub(super) atomic: AtomicOp,
    pub(super) watch: Watch,
    /// The buffer's share of the daemon's memory budget, given back with the context.
    pub(super) _memory: Option<Reservation>,
}

impl Context {
    /// `ctx_init`: the buffer (random bytes, zeros for `write-lat`, which polls it), the CQs
    /// and the QPs.
    /// `layout`: the page messages cycle through, and the cache line they step by.
    pub(super) fn open(
        device: &Device,
        o: &Options,
        plan: &Plan,
        (cycle, cache_line): (u64, u64),
        limits: &Limits,
    ) -> Result<Context> {
        let verb = o.test.verb();
        let pd = device.alloc_pd().map_err(failed("Couldn't allocate PD"))?;
        let slice = stride(plan.max_size.max(cycle), cache_line);
        let len = buffer_len(o, plan.max_size, (cycle, cache_line));
        let memory = limits.reserve(len)?;
        let remote = match verb {
            Verb::Write => Access::REMOTE_WRITE,
            Verb::Read => Access::REMOTE_READ,
            Verb::Atomic => Access::REMOTE_ATOMIC,
            Verb::Send => Access::NONE,
        };
        let mr = pd
            .register(len as usize, Access::LOCAL_WRITE | remote)
            .map_err(failed("Couldn't allocate MR"))?;
        if o.check_data {
            DataCheck::of(verb).fill(&mr, slice, o.qps)?;
        } else if o.test != Test::WriteLat {
            fill_random(&mr)?;
        }
        let send_cq = device
            .create_cq((plan.tx_depth as usize * o.qps).max(1))
            .map_err(failed("Couldn't create CQ"))?;
        let recv_cq = device
            .create_cq((plan.rx_depth as usize * o.qps).max(1))
            .map_err(failed("Couldn't create CQ"))?;
        let mut ctx = Context {
            device: device.clone(),
            pd,
            mr,
            send_cq,
            recv_cq,
            qps: Vec::with_capacity(o.qps),
            depths: (plan.tx_depth as usize, plan.rx_depth as usize),
            slice,
            cycle,
            cache_line,
            gid: gid_of(device.address()),
            verb,
            atomic: o.atomic,
            watch: Watch::new(limits),
            _memory: memory,
        };
        for _ in 0..o.qps {
            let qp = ctx.new_qp()?;
            ctx.qps.push(DataQp::Plain(qp));
        }
        Ok(ctx)
    }

    /// A data QP, in RESET.
    pub(super) fn new_qp(&self) -> Result<QueuePair> {
        self.pd
            .create_qp()
            .send_cq(&self.send_cq)
            .recv_cq(&self.recv_cq)
            .max_send_wr(self.depths.0)
            .max_recv_wr(self.depths.1)
            .build()
            .map_err(failed("Couldn't create QP"))
    }

    /// `-R`, client: every data QP connected by RDMA-CM to `peer`, each attempt that finds no
    /// listener tried again with a new QP (`rdma_cm_client_connection`).
    pub(super) fn connect_rdma_cm(
        &mut self,
        peer: SocketAddr,
        options: &ConnectOptions,
    ) -> Result<()> {
        let mut connected = Vec::with_capacity(self.qps.len());
        let mut first = std::mem::take(&mut self.qps).into_iter();
        for _ in 0..first.len() {
            let mut fresh = first.next();
            let conn = connect_retrying(peer, options, &mut || match fresh.take() {
                Some(DataQp::Plain(qp)) => Ok(qp),
                _ => self.new_qp(),
            })?;
            connected.push(DataQp::Connected(conn));
        }
        self.qps = connected;
        Ok(())
    }

    /// `-R`, server: as many connection requests from `data` as there are data QPs, each
    /// accepted with one of them (`rdma_cm_server_connection`).
    pub(super) fn accept_rdma_cm(
        &mut self,
        data: &mut dyn DataRequests,
        options: &ConnectOptions,
    ) -> Result<()> {
        let mut connected = Vec::with_capacity(self.qps.len());
        for qp in std::mem::take(&mut self.qps) {
            let DataQp::Plain(qp) = qp else {
                continue;
            };
            let request = data.next()?;
            let conn = request
                .accept(qp, options, &[])
                .map_err(failed("Failed to accept the RDMA CM data connection"))?;
            connected.push(DataQp::Connected(conn));
        }
        self.qps = connected;
        Ok(())
    }

    pub(super) fn send_offset(&self, qp: usize) -> u64 {
        qp as u64 * self.slice
    }

    pub(super) fn recv_offset(&self, qp: usize) -> u64 {
        (self.qps.len() + qp) as u64 * self.slice
    }

    pub(super) fn cycled(&self, size: u64, k: u64) -> u64 {
        cycled(size, k, self.cycle, self.cache_line)
    }

    /// Takes up to `max` completions from `cq` into `wcs`, failing on an error status.
    pub(super) fn poll(
        &self,
        cq: &CompletionQueue,
        wcs: &mut Vec<WorkCompletion>,
        max: usize,
    ) -> Result<usize> {
        wcs.clear();
        let n = cq
            .poll(wcs, max)
            .map_err(failed("Failed to poll completions"))?;
        if let Some(wc) = wcs.iter().find(|wc| wc.status != WcStatus::Success) {
            return Err(Error::Completion {
                wr_id: wc.wr_id,
                status: wc.status,
            });
        }
        if n == 0 {
            self.watch.nothing()?;
        } else {
            self.watch.heard();
        }
        Ok(n)
    }

    /// `ib_write_lat` has no closing round: each side leaves when its own loop ends, so the
    /// QP stays to acknowledge a resent last WRITE ([`answer_late_resends`]).
    pub(super) fn answer_late_resends(&self) -> Result<()> {
        answer_late_resends(&self.device, self.qps[0].qpn(), &self.send_cq)
    }

    /// Waits for one completion on `cq`; false if `stop` says the run is over first.
    pub(super) fn wait_one(&self, cq: &CompletionQueue, stop: impl Fn() -> bool) -> Result<bool> {
        let mut wcs = Vec::with_capacity(1);
        while self.poll(cq, &mut wcs, 1)? == 0 {
            if stop() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// QP `qp`'s keys (`set_up_connection`).
    pub(super) fn keys(&self, qp: usize, out_reads: u16) -> Keys {
        Keys {
            lid: 0,
            out_reads,
            qpn: self.qps[qp].qpn(),
            psn: self.qps[qp].endpoint().psn,
            rkey: self.mr.rkey(),
            vaddr: self.mr.iova() + self.recv_offset(qp),
            gid: self.gid,
            srqn: 0,
        }
    }

    /// The test's verb from QP `qp`'s send slice at `offset`, to the peer's buffer at the same
    /// offset.
    pub(super) fn post_send(
        &self,
        qp: usize,
        offset: u64,
        size: u64,
        peer: &Keys,
        signaled: bool,
    ) -> Result<()> {
        let (remote_addr, rkey) = (peer.vaddr + offset, peer.rkey);
        let op = match (self.verb, self.atomic) {
            (Verb::Send, _) => SendOp::Send,
            (Verb::Write, _) => SendOp::Write { remote_addr, rkey },
            (Verb::Read, _) => SendOp::Read { remote_addr, rkey },
            (Verb::Atomic, AtomicOp::FetchAdd) => SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: ATOMIC_ADD,
            },
            (Verb::Atomic, AtomicOp::CompareSwap) => SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare: 0,
                swap: 0,
            },
        };
        let at = self.send_offset(qp) + offset;
        let sge = self
            .mr
            .sge(at as usize, size as usize)
            .map_err(failed("Couldn't post send"))?;
        let mut wr = SendWr::new(qp as u64, op, Payload::Sges(sge.into()));
        wr.signaled = signaled;
        self.qps[qp]
            .post_send(wr)
            .map_err(failed("Couldn't post send"))
    }

    /// A receive of `size` bytes into QP `qp`'s receive slice at `offset`.
    pub(super) fn post_recv(&self, qp: usize, offset: u64, size: u64) -> Result<()> {
        let at = self.recv_offset(qp) + offset;
        let sge = self
            .mr
            .sge(at as usize, size as usize)
            .map_err(failed("Couldn't post recv"))?;
        let wr = RecvWr::new(qp as u64, sge);
        self.qps[qp]
            .post_recv(wr)
            .map_err(failed("Couldn't post recv"))
    }
}

/// `--check-data`: the bytes that cross are known at both ends, so the side they land on can
/// check them. The half a test's data comes from holds, at offset `j` of each QP's slice,
/// [`DataCheck::byte`]`(j)` (never zero); the half it lands in starts zeroed. Messages cross at
/// the same offset of the same QP's slice on both sides, so once the test is over, every byte
/// of the receiving half must be zero (no message covered it) or its offset's pattern byte,
/// and the first message's bytes at offset 0 must have landed. A byte misplaced, torn,
/// corrupted or lost fails the check with its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DataCheck {
    /// WRITE and SEND: the data leaves the client's send half for the server's receive half.
    ClientToServer,
    /// READ: the client reads the server's receive half into its send half.
    ServerToClient,
}

impl DataCheck {
    pub(super) fn of(verb: Verb) -> DataCheck {
        match verb {
            Verb::Read => DataCheck::ServerToClient,
            _ => DataCheck::ClientToServer,
        }
    }

    /// The byte at offset `j` of a slice: a multiplicative hash, odd so never zero, so that a
    /// byte landing at the wrong offset shows.
    pub(super) fn byte(j: u64) -> u8 {
        (j.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 | 1
    }

    /// Whether the data comes from this side's send half (else its receive half).
    pub(super) fn source_is_send_half(self) -> bool {
        self == DataCheck::ClientToServer
    }

    /// The side the data lands on.
    pub(super) fn receiver_is_client(self) -> bool {
        self == DataCheck::ServerToClient
    }

    /// The pattern into the half the data comes from, zeros into the other.
    pub(super) fn fill(self, mr: &MemoryRegion, slice: u64, qps: usize) -> Result<()> {
        let pattern: Vec<u8> = (0..slice).map(Self::byte).collect();
        let zeros = vec![0; slice as usize];
        for half in 0..2 {
            let source = (half == 0) == self.source_is_send_half();
            for qp in 0..qps {
                let at = (half * qps + qp) as u64 * slice;
                let bytes = if source { &pattern } else { &zeros };
                mr.write(at as usize, bytes)
                    .map_err(failed("Couldn't fill the buffer"))?;
            }
        }
        Ok(())
    }

    /// Where the data lands in `mr`: each QP's slice of the half that is not the source.
    pub(super) fn landing(self, qps: usize, slice: u64) -> impl Iterator<Item = u64> {
        let half = u64::from(self.source_is_send_half());
        (0..qps as u64).map(move |qp| (half * qps as u64 + qp) * slice)
    }

    /// Checks the half of `mr` the data landed in, each QP's slice `slice` bytes long; `first`
    /// bytes at offset 0 must have landed. Returns how many bytes hold the pattern.
    pub(super) fn verify(
        self,
        mr: &MemoryRegion,
        qps: usize,
        slice: u64,
        first: u64,
    ) -> Result<u64> {
        let mut landed = 0;
        let mut bytes = vec![0; slice as usize];
        for (qp, at) in self.landing(qps, slice).enumerate() {
            mr.read(at as usize, &mut bytes)
                .map_err(failed("Couldn't read the buffer"))?;
            for (j, &got) in bytes.iter().enumerate() {
                let want = Self::byte(j as u64);
                if got == want {
                    landed += 1;
                } else if got != 0 || (j as u64) < first {
                    return Err(Error::DataCheck(format!(
                        "byte {j} of QP {qp}'s buffer is {got:#04x}, not {want:#04x}{}",
                        if got == 0 {
                            " (nothing landed there)"
                        } else {
                            ""
                        }
                    )));
                }
            }
        }
        Ok(landed)
    }
}

/// Fills a region with pseudo-random bytes, as perftest fills its buffer with `rand()`.
pub(super) fn fill_random(mr: &MemoryRegion) -> Result<()> {
    let mut state = u64::from(crate::verbs::random_psn().value()) | 1 << 32;
    let mut chunk = vec![0; 1 << 16];
    for start in (0..mr.len()).step_by(chunk.len()) {
        for word in chunk.chunks_mut(8) {
            // xorshift64: any bytes do, as long as they are not all zero.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let len = chunk.len().min(mr.len() - start);
        mr.write(start, &chunk[..len])
            .map_err(failed("Couldn't fill the buffer"))?;
    }
    Ok(())
}

/// The clock of one run: nanoseconds since its start, and, with `-D`, its phase.
pub(super) struct Clock {
    pub(super) start: Instant,
    pub(super) timing: Option<Timing>,
}

impl Clock {
    pub(super) fn start(timing: Option<Timing>) -> Clock {
        Clock {
            start: Instant::now(),
            timing,
        }
    }

    pub(super) fn ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// `None` when the run counts messages rather than time.
    pub(super) fn phase(&self) -> Option<Phase> {
        self.timing.map(|t| t.phase(self.start.elapsed()))
    }

    pub(super) fn over(&self) -> bool {
        self.phase() == Some(Phase::End)
    }

    pub(super) fn sampling(&self) -> bool {
        self.phase() == Some(Phase::Sample)
    }
}
