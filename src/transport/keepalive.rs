//! Keepalive: an idle RC QP notices a peer gone silent.
//!
//! A requester learns that its peer is gone only from a request of its own that goes
//! unanswered; a QP that only waits (for a peer's SEND, say) waits for ever when the peer's
//! host dies, on kernel rxe as on a NIC. A QP with keepalive ([`Endpoint::set_keepalive`])
//! probes a peer it has heard nothing from for its interval, while it has nothing outstanding:
//! a probe is a zero-length RDMA WRITE at the PSN before its oldest unacknowledged one, a
//! duplicate, which a responder acknowledges without executing (IBTA 9.7.5.1.3; rxe_resp.c
//! `duplicate_request`, and softroce's), whatever its rkey and access rights. Any packet from
//! the peer ends the probing, a NAK too (a responder may refuse a duplicate WRITE at a PSN an
//! earlier READ took: the requester, with nothing outstanding, takes any response as a sign
//! of life and nothing more). After `retry_cnt` + 1 probes unanswered, the QP fails as a
//! request whose retries ran out would: [`AsyncEvent::QpFatal`](super::AsyncEvent), ERROR.
//! Probes go a quarter interval apart, at most 1 s and at least the ACK timeout. A request
//! posted meanwhile ends the probing: its own retries decide.
//!
//! A peer must run its engine to answer: one whose process is stopped (a debugger, SIGSTOP)
//! or whose application drives its engine inline and has stopped calling looks dead.
//!
//! It costs nothing while traffic flows: the receive path already counts the peer's packets
//! ([`Qp::received`]), and the endpoint looks at those counts once a sweep (a quarter of the
//! shortest interval), not per packet; a QP has a timer of its own only while it probes.
//!
//! [`Endpoint::set_keepalive`]: super::Endpoint::set_keepalive

use std::time::Duration;

use super::requester::ack_timeout;
use super::{Ctx, Qp, QpState};
use crate::wire::{BthRepr, ExtHeaders, Opcode, RKey, RethRepr};

/// The longest gap between probes (a quarter of the interval, up to this): an ACK timeout of
/// a few milliseconds suits a request in flight, but a probe of an idle connection must not
/// call a peer dead for one scheduling hiccup of its host.
const MAX_PROBE_GAP: Duration = Duration::from_secs(1);

/// The shortest interval: its sweep, a quarter of it, runs the engine that often.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// A QP's keepalive: its interval, and what the sweeps have seen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keepalive {
    /// Silence after which the peer is probed.
    interval: Duration,
    /// When the peer was last known to be alive: the sweep that first saw
    /// [`Qp::received`] at `seen`, or the set-up.
    heard_at: Duration,
    /// [`Qp::received`] as of `heard_at`.
    seen: u64,
    /// Probes sent since `heard_at` without an answer.
    probes: u8,
    /// When the next probe goes, or the QP fails: only while probing.
    probe_at: Option<Duration>,
}

impl Keepalive {
    /// Keepalive every `interval`, from `now`, on a QP that has counted `received` packets.
    pub fn new(interval: Duration, now: Duration, received: u64) -> Keepalive {
        Keepalive {
            interval,
            heard_at: now,
            seen: received,
            probes: 0,
            probe_at: None,
        }
    }

    /// Its interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The probe timer, while probing.
    pub fn deadline(&self) -> Option<Duration> {
        self.probe_at
    }

    /// Whether the peer was heard from since `heard_at`; if so, starts over from `now`.
    fn heard(&mut self, received: u64, now: Duration) -> bool {
        if received == self.seen {
            return false;
        }
        *self = Keepalive::new(self.interval, now, received);
        true
    }
}

impl Qp {
    /// A sweep's look at the QP: probes a peer silent for the interval, if the QP is idle.
    pub(crate) fn keepalive_sweep(&mut self, ctx: &mut Ctx<'_>) {
        let Some(mut keepalive) = self.keepalive else {
            return;
        };
        if self.state != QpState::Rts {
            // Out of RTS (not yet connected, reset, in error): it starts over when it is back.
            self.keepalive = Some(Keepalive::new(keepalive.interval, ctx.now, self.received));
            return;
        }
        let idle = !self.req.has_outstanding();
        let silent = !keepalive.heard(self.received, ctx.now)
            && ctx.now.saturating_sub(keepalive.heard_at) >= keepalive.interval;
        if idle && silent && keepalive.probe_at.is_none() {
            self.probe(&mut keepalive, ctx);
        }
        self.keepalive = Some(keepalive);
    }

    /// The probe timer: the peer answered, or another probe goes, or the QP fails.
    pub(crate) fn keepalive_timer(&mut self, ctx: &mut Ctx<'_>) {
        let Some(mut keepalive) = self.keepalive else {
            return;
        };
        if keepalive.probe_at.is_none_or(|at| at > ctx.now) {
            return;
        }
        keepalive.probe_at = None;
        let posted = self.req.has_outstanding();
        if keepalive.heard(self.received, ctx.now) || self.state != QpState::Rts || posted {
            // Answered; or the QP left RTS, or has requests of its own now, whose retries
            // say the rest: probing starts over at the next idle silence.
            keepalive.probes = 0;
            self.keepalive = Some(keepalive);
            return;
        }
        if keepalive.probes > self.settings.retry_cnt {
            ctx.counters.keepalive_failures += 1;
            self.keepalive = Some(keepalive);
            self.fail(ctx);
            return;
        }
        self.probe(&mut keepalive, ctx);
        self.keepalive = Some(keepalive);
    }

    /// Sends a probe and sets the timer for its answer.
    fn probe(&mut self, keepalive: &mut Keepalive, ctx: &mut Ctx<'_>) {
        let Some(dst) = self.peer() else {
            return;
        };
        let mut bth = BthRepr::new(
            Opcode::RcWriteOnly,
            self.settings.dest_qpn,
            self.req.oldest_unacked() - 1,
        );
        bth.pkey = self.settings.pkey;
        bth.ack_req = true;
        let ext = ExtHeaders {
            reth: Some(RethRepr {
                virtual_address: 0,
                rkey: RKey(0),
                dma_len: 0,
            }),
            ..ExtHeaders::default()
        };
        ctx.send(dst, bth, ext, 0, super::outgoing::Source::Empty);
        ctx.counters.keepalive_probes += 1;
        keepalive.probes += 1;
        let gap = (keepalive.interval / 4).min(MAX_PROBE_GAP);
        let wait = ack_timeout(self.settings.timeout).map_or(gap, |t| t.max(gap));
        keepalive.probe_at = Some(ctx.now + wait);
    }
}
