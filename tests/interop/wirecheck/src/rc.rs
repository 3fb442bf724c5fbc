//! A scripted RC queue pair: just enough of a requester and a responder to drive a guest QP
//! through a check, with every sequence number checked. It is not a transport: no windows, no
//! retransmission; a missing answer fails the check.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use softroce::wire::{
    AckSyndrome, AethRepr, AtomicEthRepr, BthRepr, ExtHeaders, Msn, NakCode, Opcode, PacketRepr,
    Position, Psn, Qpn, RKey, RethRepr,
};

use crate::link::{describe, Link, Received, Seal};
use crate::Result;

/// The path MTU of every connection in the lab: the guests' eth0 runs at 1500 bytes, so rxe's
/// active MTU is 1024, and the pingpong tools and perftest default to it.
pub const PATH_MTU: usize = 1024;

/// How long to wait for rxe's answer. rxe answers within milliseconds even under TCG; this only
/// bounds a failing check.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The opcodes of one kind of multi-packet request, by position in the message.
struct Segments {
    only: Opcode,
    first: Opcode,
    middle: Opcode,
    last: Opcode,
}

const SEND: Segments = Segments {
    only: Opcode::RcSendOnly,
    first: Opcode::RcSendFirst,
    middle: Opcode::RcSendMiddle,
    last: Opcode::RcSendLast,
};

const WRITE: Segments = Segments {
    only: Opcode::RcWriteOnly,
    first: Opcode::RcWriteFirst,
    middle: Opcode::RcWriteMiddle,
    last: Opcode::RcWriteLast,
};

const READ_RESPONSE: Segments = Segments {
    only: Opcode::RcReadResponseOnly,
    first: Opcode::RcReadResponseFirst,
    middle: Opcode::RcReadResponseMiddle,
    last: Opcode::RcReadResponseLast,
};

impl Segments {
    /// The opcode of packet `i` of a message of `n` packets.
    fn opcode(&self, i: usize, n: usize) -> Opcode {
        match (i, n) {
            (_, 1) => self.only,
            (0, _) => self.first,
            (i, n) if i == n - 1 => self.last,
            _ => self.middle,
        }
    }
}

pub struct RcQp {
    pub link: Link,
    local_qpn: Qpn,
    remote_qpn: Qpn,
    /// Requester: the PSN of our next request packet, and the requests the guest completed
    /// (what the MSN of its next ACK must say).
    next_psn: Psn,
    requests_done: Msn,
    /// Responder: the PSN we expect from the guest next, and the guest's messages we completed
    /// (the MSN of our ACKs).
    expected_psn: Psn,
    msn: Msn,
    partial: Vec<u8>,
    messages: VecDeque<Vec<u8>>,
    responses: VecDeque<Received>,
}

impl RcQp {
    /// `our_psn` is the first PSN we send, `their_psn` the first the guest sends.
    pub fn new(link: Link, local_qpn: Qpn, remote_qpn: Qpn, our_psn: Psn, their_psn: Psn) -> Self {
        RcQp {
            link,
            local_qpn,
            remote_qpn,
            next_psn: our_psn,
            requests_done: Msn::new(0),
            expected_psn: their_psn,
            msn: Msn::new(0),
            partial: Vec::new(),
            messages: VecDeque::new(),
            responses: VecDeque::new(),
        }
    }

    pub fn next_psn(&self) -> Psn {
        self.next_psn
    }

    /// The peer's QP.
    pub fn remote_qpn(&self) -> Qpn {
        self.remote_qpn
    }

    /// Sends one packet to the guest's QP at `psn`.
    pub fn packet(
        &mut self,
        opcode: Opcode,
        psn: Psn,
        ext: ExtHeaders,
        payload: &[u8],
        seal: Seal,
    ) -> Result<()> {
        // The last packet of every request message asks for an answer, and so does every READ
        // and atomic (ONLY packets); rxe sets AckReq the same way. An ACK asks for nothing.
        let ends_message = opcode
            .info()
            .is_some_and(|i| matches!(i.position, Position::Last | Position::Only));
        let bth = BthRepr {
            ack_req: ends_message && opcode != Opcode::RcAck,
            ..BthRepr::new(opcode, self.remote_qpn, psn)
        };
        let repr = PacketRepr::new(bth, ext, payload.len());
        self.link.send(&repr, payload, seal)
    }

    /// Sends a message as ONLY, or FIRST, MIDDLE..., LAST packets of at most the path MTU; the
    /// RETH, if any, goes in the first. Returns the PSN of the last packet.
    fn segmented(&mut self, ops: &Segments, reth: Option<RethRepr>, data: &[u8]) -> Result<Psn> {
        let chunks: Vec<&[u8]> = if data.is_empty() {
            vec![data]
        } else {
            data.chunks(PATH_MTU).collect()
        };
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let opcode = ops.opcode(i, n);
            let ext = ExtHeaders {
                reth: if i == 0 { reth } else { None },
                ..Default::default()
            };
            let psn = self.next_psn;
            self.packet(opcode, psn, ext, chunk, Seal::Good)?;
            self.next_psn = psn + 1;
        }
        Ok(self.next_psn - 1)
    }

    /// An RC SEND of `data`. Returns the PSN the guest's ACK must carry.
    pub fn send_message(&mut self, data: &[u8]) -> Result<Psn> {
        self.segmented(&SEND, None, data)
    }

    /// An RDMA WRITE of `data` to `va`. Returns the PSN the guest's ACK must carry.
    pub fn write(&mut self, va: u64, rkey: RKey, data: &[u8]) -> Result<Psn> {
        let reth = RethRepr {
            virtual_address: va,
            rkey,
            dma_len: data.len() as u32,
        };
        self.segmented(&WRITE, Some(reth), data)
    }

    /// An RDMA READ of `len` bytes at `va`: checks every response packet (opcode sequence,
    /// PSNs, AETH) and returns the bytes.
    pub fn read(&mut self, va: u64, rkey: RKey, len: usize) -> Result<Vec<u8>> {
        let first = self.next_psn;
        let ext = ExtHeaders {
            reth: Some(RethRepr {
                virtual_address: va,
                rkey,
                dma_len: len as u32,
            }),
            ..Default::default()
        };
        self.packet(Opcode::RcReadRequest, first, ext, &[], Seal::Good)?;
        // A READ takes one PSN per response packet (IBTA 9.7.2): the next request comes after.
        let n = len.div_ceil(PATH_MTU).max(1);
        self.next_psn = first + n as u32;
        // rxe counts the READ as done when it starts answering: FIRST, LAST and ONLY all carry
        // the MSN that includes it.
        let msn = self.requests_done.next();
        let mut data = Vec::with_capacity(len);
        for i in 0..n {
            let want = READ_RESPONSE.opcode(i, n);
            let rx = self.next_response(want.name())?;
            let bth = rx.repr.bth;
            if bth.opcode != want || bth.psn != first + i as u32 {
                bail!(
                    "READ response {i} of {n}: expected {want} psn={}, got {}",
                    first + i as u32,
                    describe(&rx.repr)
                );
            }
            if let Some(aeth) = rx.repr.ext.aeth {
                Self::check_ack_aeth(&rx, aeth, msn)?;
            }
            data.extend_from_slice(&rx.payload);
        }
        if data.len() != len {
            bail!("READ of {len} bytes returned {} bytes", data.len());
        }
        self.requests_done = msn;
        Ok(data)
    }

    /// A FETCH_ADD of `add` at `va`: returns the original value the ATOMIC_ACKNOWLEDGE carries.
    pub fn fetch_add(&mut self, va: u64, rkey: RKey, add: u64) -> Result<u64> {
        let psn = self.next_psn;
        let ext = ExtHeaders {
            atomic_eth: Some(AtomicEthRepr {
                virtual_address: va,
                rkey,
                swap_add: add,
                compare: 0,
            }),
            ..Default::default()
        };
        self.packet(Opcode::RcFetchAdd, psn, ext, &[], Seal::Good)?;
        self.next_psn = psn + 1;
        let rx = self.next_response("ATOMIC_ACKNOWLEDGE")?;
        let (Some(aeth), Some(orig)) = (rx.repr.ext.aeth, rx.repr.ext.atomic_ack_eth) else {
            bail!(
                "expected RC_ATOMIC_ACKNOWLEDGE psn={psn}, got {}",
                describe(&rx.repr)
            )
        };
        if rx.repr.bth.psn != psn {
            bail!(
                "ATOMIC_ACKNOWLEDGE for psn={psn} carries psn={}",
                rx.repr.bth.psn
            );
        }
        self.complete(&rx, aeth)?;
        Ok(orig.original_data)
    }

    /// Checks that an AETH is a positive ACK carrying `msn`.
    fn check_ack_aeth(rx: &Received, aeth: AethRepr, msn: Msn) -> Result<()> {
        if !matches!(aeth.syndrome, AckSyndrome::Ack(_)) || aeth.msn != msn {
            bail!("expected ACK msn={msn}, got {}", describe(&rx.repr));
        }
        Ok(())
    }

    /// Checks the AETH of the answer that completes one of our requests: a positive ACK whose
    /// MSN counts that request too.
    fn complete(&mut self, rx: &Received, aeth: AethRepr) -> Result<()> {
        let msn = self.requests_done.next();
        Self::check_ack_aeth(rx, aeth, msn)?;
        self.requests_done = msn;
        Ok(())
    }

    /// Waits for the ACK of the request message ending at `psn`.
    pub fn expect_ack(&mut self, psn: Psn) -> Result<()> {
        let (rx, aeth) = self.next_ack(psn)?;
        self.complete(&rx, aeth)
    }

    /// Waits for a NAK with `code` and `psn` (the PSN rxe expected, or the refused request's),
    /// with the MSN of the requests completed so far.
    pub fn expect_nak(&mut self, code: NakCode, psn: Psn) -> Result<()> {
        let (rx, aeth) = self.next_ack(psn)?;
        if aeth.syndrome != AckSyndrome::Nak(code) || aeth.msn != self.requests_done {
            bail!(
                "expected {} msn={}, got {}",
                AckSyndrome::Nak(code),
                self.requests_done,
                describe(&rx.repr)
            );
        }
        Ok(())
    }

    /// The next RC_ACKNOWLEDGE, which must carry `psn`.
    fn next_ack(&mut self, psn: Psn) -> Result<(Received, AethRepr)> {
        let rx = self.next_response("RC_ACKNOWLEDGE")?;
        match rx.repr.ext.aeth {
            Some(aeth) if rx.repr.bth.opcode == Opcode::RcAck && rx.repr.bth.psn == psn => {
                Ok((rx, aeth))
            }
            _ => bail!(
                "expected RC_ACKNOWLEDGE psn={psn}, got {}",
                describe(&rx.repr)
            ),
        }
    }

    /// Waits until nothing but silence has come for `quiet`: for a packet rxe must drop.
    pub fn expect_silence(&mut self, quiet: Duration) -> Result<()> {
        let deadline = Instant::now() + quiet;
        while self.poll(deadline)? {
            if let Some(rx) = self.responses.pop_front() {
                bail!("expected no answer, got {}", describe(&rx.repr));
            }
        }
        Ok(())
    }

    /// The next response to one of our requests (ACK, NAK, READ response, atomic ACK).
    fn next_response(&mut self, what: &str) -> Result<Received> {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            if let Some(rx) = self.responses.pop_front() {
                return Ok(rx);
            }
            if !self.poll(deadline)? {
                bail!("no {what} from the guest within {ANSWER_TIMEOUT:?}");
            }
        }
    }

    /// The next whole SEND message from the guest (already acknowledged).
    pub fn next_message(&mut self) -> Result<Vec<u8>> {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            if let Some(msg) = self.messages.pop_front() {
                return Ok(msg);
            }
            if !self.poll(deadline)? {
                bail!("no SEND message from the guest within {ANSWER_TIMEOUT:?}");
            }
        }
    }

    /// Receives one packet: answers the guest's requests at once, queues responses to ours.
    /// Returns false when `deadline` passed first.
    fn poll(&mut self, deadline: Instant) -> Result<bool> {
        let Some(rx) = self.link.recv(deadline)? else {
            return Ok(false);
        };
        let bth = rx.repr.bth;
        if bth.dest_qp != self.local_qpn {
            bail!(
                "a packet for QP {}, but we are QP {}",
                bth.dest_qp,
                self.local_qpn
            );
        }
        match bth.opcode {
            Opcode::RcSendFirst
            | Opcode::RcSendMiddle
            | Opcode::RcSendLast
            | Opcode::RcSendOnly => self.respond(rx)?,
            Opcode::RcAck
            | Opcode::RcAtomicAck
            | Opcode::RcReadResponseFirst
            | Opcode::RcReadResponseMiddle
            | Opcode::RcReadResponseLast
            | Opcode::RcReadResponseOnly => self.responses.push_back(rx),
            _ => bail!("unexpected {}", describe(&rx.repr)),
        }
        Ok(true)
    }

    /// The responder side for the guest's SENDs: in-order packets are assembled into messages
    /// and acknowledged when they ask for it, with the PSN they carry and the count of messages
    /// completed. A duplicate (the guest retransmitted before our ACK arrived) gets the ACK of
    /// the last PSN received in order again, as rxe does.
    fn respond(&mut self, rx: Received) -> Result<()> {
        let bth = rx.repr.bth;
        let ahead = bth.psn - self.expected_psn;
        if ahead < 0 {
            return self.ack(self.expected_psn - 1);
        }
        if ahead > 0 {
            bail!(
                "the guest skipped from PSN {} to {} on a lossless link",
                self.expected_psn,
                bth.psn
            );
        }
        let position = bth.opcode.info().map(|i| i.position);
        let starts = matches!(position, Some(Position::First | Position::Only));
        if starts != self.partial.is_empty() {
            bail!("out-of-sequence opcode: {}", describe(&rx.repr));
        }
        self.partial.extend_from_slice(&rx.payload);
        self.expected_psn = bth.psn + 1;
        if matches!(position, Some(Position::Last | Position::Only)) {
            self.messages.push_back(std::mem::take(&mut self.partial));
            self.msn = self.msn.next();
        }
        if bth.ack_req {
            self.ack(bth.psn)?;
        }
        Ok(())
    }

    /// An RC_ACKNOWLEDGE of `psn` with syndrome 0x1F (ACK, no credit count, as rxe sends).
    fn ack(&mut self, psn: Psn) -> Result<()> {
        let ext = ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: AckSyndrome::ACK_NO_CREDITS,
                msn: self.msn,
            }),
            ..Default::default()
        };
        self.packet(Opcode::RcAck, psn, ext, &[], Seal::Good)
    }
}
