//! Service ID resolution (IBTA 12.11; cm.c `ib_send_cm_sidr_req`, `cm_sidr_req_handler`,
//! `cm_format_sidr_rep`; cma.c `cma_resolve_ib_udp`): a UD client learns which QPN and Q_Key
//! serve a service ID. Nothing is connected; the server forgets a request once answered.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use super::{
    check_peer, ib_timeout, private_data, CmEndpoint, CmError, CmEvent, SidrId, MRA_SERVICE_TIMEOUT,
};
use crate::wire::cm::sidr_rep::SIDR_REP_INFO;
use crate::wire::cm::{
    CmMessage, CmSidrRepRepr, CmSidrReqRepr, CmaHeader, CmaHeaderRepr, ServiceId, SidrStatus,
    CMA_HEADER_LEN, MAD_LEN, SIDR_REP_PRIVATE_DATA, SIDR_REQ_PRIVATE_DATA,
};
use crate::wire::{PKey, QKey, Qpn};

/// A SIDR_REQ of ours, waiting for its SIDR_REP.
#[derive(Debug)]
struct Resolving {
    dst: IpAddr,
    mad: Box<[u8; MAD_LEN]>,
    retries_left: u8,
    deadline: Duration,
}

/// A peer's SIDR_REQ, waiting for the application's answer.
#[derive(Debug)]
struct Asked {
    tid: u64,
    service_id: ServiceId,
    deadline: Duration,
}

/// The SIDR requests in flight, both ways.
#[derive(Debug, Default)]
pub(super) struct SidrTable {
    resolving: HashMap<u32, Resolving>,
    asked: HashMap<SidrId, Asked>,
}

impl SidrTable {
    /// The earliest deadline of any request in flight, ours or a peer's.
    pub(super) fn deadline(&self) -> Option<Duration> {
        let ours = self.resolving.values().map(|r| r.deadline);
        ours.chain(self.asked.values().map(|a| a.deadline)).min()
    }

    /// Requests in flight, both ways.
    pub(super) fn len(&self) -> usize {
        self.resolving.len() + self.asked.len()
    }
}

impl CmEndpoint {
    /// Asks `dst` which UD QP serves `service_id`: [`CmEvent::SidrResolved`] or
    /// [`CmEvent::SidrTimedOut`] follows. `src_port` goes in RDMA-CM's header, with up to
    /// 180 bytes of private data after it (216 outside its IP port spaces).
    pub fn sidr_resolve(
        &mut self,
        now: Duration,
        dst: IpAddr,
        service_id: ServiceId,
        src_port: u16,
        data: &[u8],
    ) -> Result<SidrId, CmError> {
        self.now = self.now.max(now);
        let dst = check_peer(self.local, dst)?;
        if self.sidr.len() >= self.config.max_pending {
            return Err(CmError::NoResources);
        }
        let ip = service_id.ip_port().is_some();
        let at = if ip { CMA_HEADER_LEN } else { 0 };
        let mut private = private_data::<SIDR_REQ_PRIVATE_DATA>(data, at)?;
        if ip {
            let header = CmaHeaderRepr {
                src: self.local,
                src_port,
                dst,
            };
            header.emit(&mut CmaHeader::new_unchecked(&mut private[..]));
        }
        let place = self.id_place;
        let request_id = (0..64)
            .map(|_| super::draw_id(&mut self.rng, place))
            .find(|id| *id != 0 && !self.sidr.resolving.contains_key(id))
            .ok_or(CmError::NoResources)?;
        let req = CmSidrReqRepr {
            request_id,
            pkey: PKey::DEFAULT,
            service_id,
            private_data: private,
        };
        let tid = self.tid(request_id);
        let message = CmMessage::SidrReq(Box::new(req));
        let mad = self.outbox.send(&mut self.counters, dst, tid, &message);
        let resolving = Resolving {
            dst,
            mad,
            retries_left: self.config.max_retries,
            deadline: self.now + ib_timeout(self.config.response_timeout),
        };
        self.sidr.resolving.insert(request_id, resolving);
        Ok(SidrId {
            peer: dst,
            request_id,
        })
    }

    /// Answers a peer's SIDR_REQ: `Ok` with the QPN and Q_Key that serve it, or the status
    /// of a refusal ([`SidrStatus::REJECT`]); up to 136 bytes of private data.
    pub fn sidr_reply(
        &mut self,
        now: Duration,
        id: SidrId,
        result: Result<(Qpn, QKey), SidrStatus>,
        data: &[u8],
    ) -> Result<(), CmError> {
        self.now = self.now.max(now);
        let private = private_data::<SIDR_REP_PRIVATE_DATA>(data, 0)?;
        let asked = self.sidr.asked.remove(&id).ok_or(CmError::Unknown)?;
        let (status, qpn, qkey) = match result {
            Ok((qpn, qkey)) => (SidrStatus::SUCCESS, qpn, qkey),
            Err(status) => (status, Qpn::new(0), QKey(0)),
        };
        self.send_sidr_rep(
            id,
            asked.tid,
            asked.service_id,
            (status, qpn, qkey),
            private,
        );
        Ok(())
    }

    fn send_sidr_rep(
        &mut self,
        id: SidrId,
        tid: u64,
        service_id: ServiceId,
        (status, qpn, qkey): (SidrStatus, Qpn, QKey),
        private_data: [u8; SIDR_REP_PRIVATE_DATA],
    ) {
        let rep = CmSidrRepRepr {
            request_id: id.request_id,
            status,
            info_length: 0,
            qpn,
            service_id,
            qkey,
            info: [0; SIDR_REP_INFO],
            private_data,
        };
        let message = CmMessage::SidrRep(Box::new(rep));
        self.outbox.send(&mut self.counters, id.peer, tid, &message);
    }

    /// A peer's SIDR_REQ.
    pub(super) fn on_sidr_req(&mut self, src: IpAddr, tid: u64, req: &CmSidrReqRepr) {
        let id = SidrId {
            peer: src,
            request_id: req.request_id,
        };
        if self.sidr.asked.contains_key(&id) {
            // The application has not answered yet; the answer will do for both.
            self.counters.duplicates += 1;
            return;
        }
        let refuse = |status| (status, Qpn::new(0), QKey(0));
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            self.counters.rejected_no_listener += 1;
            let status = refuse(SidrStatus::UNSUPPORTED);
            self.send_sidr_rep(id, tid, req.service_id, status, [0; SIDR_REP_PRIVATE_DATA]);
            return;
        };
        let header = match req.service_id.ip_port() {
            Some(_) => CmaHeader::new_checked(&req.private_data[..])
                .and_then(|h| CmaHeaderRepr::parse(&h))
                .ok()
                .filter(|h| h.src.to_canonical() == src && h.dst.to_canonical() == self.local)
                .map(|h| (h.src_port, CMA_HEADER_LEN)),
            None => Some((0, 0)),
        };
        let Some((peer_port, data_at)) = header else {
            // cma.c: a header that does not hold together is refused with status REJECT.
            self.counters.rejected_invalid += 1;
            let status = refuse(SidrStatus::REJECT);
            self.send_sidr_rep(id, tid, req.service_id, status, [0; SIDR_REP_PRIVATE_DATA]);
            return;
        };
        if self.sidr.len() >= self.config.max_pending {
            self.counters.rejected_no_resources += 1;
            let status = refuse(SidrStatus::REJECT);
            self.send_sidr_rep(id, tid, req.service_id, status, [0; SIDR_REP_PRIVATE_DATA]);
            return;
        }
        let asked = Asked {
            tid,
            service_id: req.service_id,
            deadline: self.now + ib_timeout(MRA_SERVICE_TIMEOUT),
        };
        self.sidr.asked.insert(id, asked);
        self.events.push_back(CmEvent::SidrRequest {
            id,
            listener,
            service_id: req.service_id,
            peer_port,
            private_data: req.private_data[data_at..].to_vec(),
        });
    }

    /// A SIDR_REP: the answer to one of ours.
    pub(super) fn on_sidr_rep(&mut self, src: IpAddr, rep: &CmSidrRepRepr) {
        let ours = self.sidr.resolving.get(&rep.request_id);
        if ours.is_none_or(|r| r.dst != src) {
            self.counters.dropped_unexpected += 1;
            return;
        }
        self.sidr.resolving.remove(&rep.request_id);
        let result = if rep.status == SidrStatus::SUCCESS {
            Ok((rep.qpn, rep.qkey))
        } else {
            Err(rep.status)
        };
        self.events.push_back(CmEvent::SidrResolved {
            id: SidrId {
                peer: src,
                request_id: rep.request_id,
            },
            result,
            private_data: rep.private_data.to_vec(),
        });
    }

    /// Sends our unanswered SIDR_REQs again, gives up on those out of retries, and forgets
    /// the peers' requests the application never answered.
    pub(super) fn sidr_timers(&mut self) {
        let now = self.now;
        let period = ib_timeout(self.config.response_timeout);
        let mut timed_out = Vec::new();
        for (&request_id, r) in &mut self.sidr.resolving {
            if r.deadline > now {
                continue;
            }
            if r.retries_left == 0 {
                timed_out.push(request_id);
                continue;
            }
            r.retries_left -= 1;
            r.deadline = now + period;
            self.counters.retransmissions += 1;
            self.outbox.resend(&mut self.counters, r.dst, r.mad.clone());
        }
        for request_id in timed_out {
            if let Some(r) = self.sidr.resolving.remove(&request_id) {
                let id = SidrId {
                    peer: r.dst,
                    request_id,
                };
                self.events.push_back(CmEvent::SidrTimedOut { id });
            }
        }
        self.sidr.asked.retain(|_, a| a.deadline > now);
    }

    /// Our SIDR requests to `peer` (only the one of `named`, if given), which cannot be
    /// reached, end now; returns how many.
    pub(super) fn sidr_unreachable(&mut self, peer: IpAddr, named: Option<u32>) -> usize {
        let lost: Vec<u32> = self
            .sidr
            .resolving
            .iter()
            .filter(|(&id, r)| r.dst == peer && named.is_none_or(|n| n == id))
            .map(|(&id, _)| id)
            .collect();
        let count = lost.len();
        for request_id in lost {
            self.sidr.resolving.remove(&request_id);
            let id = SidrId { peer, request_id };
            self.events.push_back(CmEvent::SidrTimedOut { id });
        }
        count
    }
}
