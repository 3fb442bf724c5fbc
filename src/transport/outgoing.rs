//! Packets queued for the io layer, built only when it asks for them.
//!
//! A queued packet is its headers as a [`PacketRepr`] and its payload as where to read it: the
//! parts of regions that the local access check granted when the packet was queued. The io
//! layer hands [`Endpoint::poll_transmit_into`](super::Endpoint::poll_transmit_into) the
//! buffer it sends from (the UDP backend's segmentation train), and the packet is written
//! there once: the headers emitted, the payload copied out of the region. No buffer of its
//! own, no zeroing of the payload, and no copy from one buffer to another.

use std::net::IpAddr;

use super::wr::Sge;
use crate::memory::{Access, DeviceMemory, HeldSpan, MemoryError, MemoryTable, PdId, Span};
use crate::wire::{PacketRepr, Qpn, RKey};

/// The longest packet the core builds: a payload of the largest path MTU (4096) and the
/// longest headers that come with one (BTH, RETH and ImmDt: 32 bytes), its pad and the ICRC,
/// rounded up. A buffer handed to
/// [`Endpoint::poll_transmit_into`](super::Endpoint::poll_transmit_into) must hold it.
pub const MAX_PACKET_LEN: usize = 4096 + 64;

/// Buffers of copied payloads kept for reuse, at most: as many as a window of 128 packets on
/// each of 8 QPs, so that a steady stream of inline sends allocates nothing.
const BYTES_POOL: usize = 1024;

/// A packet waiting for the io layer.
#[derive(Debug)]
pub(crate) struct Queued {
    pub dst: IpAddr,
    /// Its headers; the AckReq bit and a coalesced ACK's fields may still change in place.
    pub repr: PacketRepr,
    pub payload: Source,
    /// A UC or UD request's packet, whose payload is still the application's memory.
    pub unreliable: Option<UnreliableSend>,
}

/// A packet of a UC or UD send request: its last packet's build completes the request, as rxe
/// completes one once its last packet is sent (rxe_req.c), so its payload is read once, into
/// the packet, and not copied when it is queued. Until then the request holds the buffer: a
/// request that completes before its packets are built (one ahead of a request that fails)
/// has them read first ([`Ctx::settle_unbuilt`](super::Ctx::settle_unbuilt)), and one flushed
/// takes them off the queue ([`Ctx::drop_unbuilt`](super::Ctx::drop_unbuilt)): a flushed
/// request puts nothing on the wire, and a stale packet never completes a later request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnreliableSend {
    pub qpn: Qpn,
    /// The message's last packet.
    pub completes: bool,
}

/// Where a queued packet's payload comes from.
#[derive(Debug)]
pub(crate) enum Source {
    /// No payload.
    Empty,
    /// One part of a region, checked when the packet was queued.
    One(HeldSpan),
    /// Two parts, in order: a packet across the boundary of two SGEs.
    Two(HeldSpan, HeldSpan),
    /// Bytes copied when the packet was queued: inline sends and payloads over more than two
    /// SGEs.
    Bytes(Vec<u8>),
    /// A READ response's part of the memory a peer's rkey named, checked again when the
    /// packet is built.
    Remote(RemoteRead),
}

/// What a READ response carries: `len` bytes at `addr` through `rkey`, for the responder QP
/// `qpn` of `pd`. Nothing is held between the request and the packet, neither the memory nor a
/// right to it: the key is looked up again as each packet is built (rxe_resp.c
/// `rxe_recheck_mr`), so a region deregistered or a window invalidated since then sends
/// nothing more.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RemoteRead {
    pub rkey: RKey,
    pub pd: PdId,
    pub qpn: Qpn,
    pub addr: u64,
    pub len: usize,
}

/// A READ response withheld at build time: its key no longer grants its memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Revoked {
    /// The responder QP whose response it was.
    pub qpn: Qpn,
    /// What the check found.
    pub error: MemoryError,
}

impl Source {
    /// The payload at offset `at` of a message gathered from `sges`, `len` bytes: each part
    /// checked against `memory` for `pd` now, as the packet is queued (so a region released
    /// before then fails the request, as it did when packets were built at once). With
    /// whether every byte read now could be: what could not (memory a program took away) is
    /// zeros, as when the packet is built ([`write`](Self::write)).
    pub fn gather(
        memory: &MemoryTable,
        pd: PdId,
        sges: &[Sge],
        mut at: usize,
        len: usize,
        pool: &mut Vec<Vec<u8>>,
    ) -> Result<(Source, bool), MemoryError> {
        let mut found = Source::Empty;
        let mut whole = true;
        let mut left = len;
        for sge in sges {
            if left == 0 {
                break;
            }
            let sge_len = sge.len as usize;
            if at >= sge_len {
                at -= sge_len;
                continue;
            }
            let n = (sge_len - at).min(left);
            let span = memory.check_local(sge.lkey, pd, sge.addr + at as u64, n, Access::NONE)?;
            found = match found {
                Source::Empty => Source::One(span.held()),
                Source::One(first) => Source::Two(first, span.held()),
                Source::Two(first, second) => {
                    let (read, all) = Source::read(pool, len, [first.span(), second.span(), span]);
                    whole &= all.is_ok();
                    read
                }
                Source::Bytes(mut bytes) => {
                    whole &= append(&mut bytes, span).is_ok();
                    Source::Bytes(bytes)
                }
                Source::Remote(_) => unreachable!("a gather starts empty and reads local memory"),
            };
            left -= n;
            at = 0;
        }
        Ok((found, whole))
    }

    /// Whether it is a READ response of QP `qpn`.
    pub fn is_read_response_of(&self, qpn: Qpn) -> bool {
        matches!(self, Source::Remote(read) if read.qpn == qpn)
    }

    /// The same payload, read out of its region now: for a packet whose request completes
    /// before the packet is built, after which the application may write the buffer again.
    /// With whether every byte could be read: what could not (memory a program took away) is
    /// zeros.
    pub fn read_now(self, pool: &mut Vec<Vec<u8>>) -> (Source, bool) {
        match self {
            Source::One(span) => {
                let span = span.span();
                let (read, whole) = Source::read(pool, span.len(), [span]);
                (read, whole.is_ok())
            }
            Source::Two(first, second) => {
                let (first, second) = (first.span(), second.span());
                let (read, whole) = Source::read(pool, first.len() + second.len(), [first, second]);
                (read, whole.is_ok())
            }
            already => (already, true),
        }
    }

    /// The bytes of `parts`, `len` in all, in a buffer from `pool`, and the first failure to
    /// read one of them, whose bytes are then zeros.
    fn read<const N: usize>(
        pool: &mut Vec<Vec<u8>>,
        len: usize,
        parts: [Span<'_>; N],
    ) -> (Source, Result<(), MemoryError>) {
        let mut bytes = Self::buffer(pool, len);
        let mut whole = Ok(());
        for part in parts {
            let read = append(&mut bytes, part);
            whole = whole.and(read);
        }
        (Source::Bytes(bytes), whole)
    }

    /// `bytes`, copied now.
    pub fn copied(bytes: &[u8], pool: &mut Vec<Vec<u8>>) -> Source {
        if bytes.is_empty() {
            return Source::Empty;
        }
        let mut buffer = Self::buffer(pool, bytes.len());
        buffer.extend_from_slice(bytes);
        Source::Bytes(buffer)
    }

    fn buffer(pool: &mut Vec<Vec<u8>>, len: usize) -> Vec<u8> {
        let mut buffer = pool.pop().unwrap_or_default();
        buffer.clear();
        buffer.reserve(len);
        buffer
    }

    /// Copies the payload into `out`, exactly its length; a copied payload's buffer goes back
    /// to `pool`. A READ response's memory is checked against `memory` first, and read under
    /// the same guard, so a deregistration or invalidation that has returned keeps every byte
    /// of it out; the packet is then [`Revoked`], and `out` holds nothing of that memory, as
    /// when the program took that memory away ([`MemoryError::Unmapped`]). A send's payload
    /// in such memory is sent as zeros from the first byte that could not be read (a NIC
    /// would send what the pinned pages held): `Ok(false)` says so.
    pub fn write(
        self,
        out: &mut [u8],
        pool: &mut Vec<Vec<u8>>,
        memory: &DeviceMemory,
    ) -> Result<bool, Revoked> {
        let mut whole = true;
        let mut local = |span: Span<'_>, out| {
            let (rest, read) = read_into(span, out);
            whole &= read.is_ok();
            rest
        };
        let rest = match self {
            Source::Empty => out,
            Source::Remote(read) => {
                let table = memory.read();
                let revoked = |error| Revoked {
                    qpn: read.qpn,
                    error,
                };
                let span = table
                    .check_remote(
                        read.rkey,
                        (read.pd, read.qpn),
                        read.addr,
                        read.len,
                        Access::REMOTE_READ,
                    )
                    .map_err(revoked)?;
                let (rest, read) = read_into(span, out);
                read.map_err(revoked)?;
                rest
            }
            Source::One(span) => local(span.span(), out),
            Source::Two(first, second) => {
                let rest = local(first.span(), out);
                local(second.span(), rest)
            }
            Source::Bytes(bytes) => {
                let (part, rest) = out.split_at_mut(bytes.len());
                part.copy_from_slice(&bytes);
                if pool.len() < BYTES_POOL {
                    pool.push(bytes);
                }
                rest
            }
        };
        // The parts add up to the payload length by construction. Were they ever short, the
        // rest of the buffer would still hold an earlier packet's bytes: zero it rather than
        // send them.
        debug_assert!(rest.is_empty(), "a payload shorter than its packet");
        rest.fill(0);
        Ok(whole)
    }
}

/// Reads all of `span` onto the end of `bytes`; what cannot be read is zeros.
fn append(bytes: &mut Vec<u8>, span: Span<'_>) -> Result<(), MemoryError> {
    let start = bytes.len();
    bytes.resize(start + span.len(), 0);
    span.read(0, &mut bytes[start..]).inspect_err(|_| {
        // The guarded copy stops at the first byte it cannot read, after those before it.
        bytes[start..].fill(0);
    })
}

/// Reads all of `span` into the start of `out`, zeros for what cannot be read; returns the
/// rest of `out`, and whether the read went through.
fn read_into<'a>(span: Span<'_>, out: &'a mut [u8]) -> (&'a mut [u8], Result<(), MemoryError>) {
    let (part, rest) = out.split_at_mut(span.len());
    let read = span.read(0, part).inspect_err(|_| part.fill(0));
    (rest, read)
}
