//! What a connected ID holds of its connection: the QP the CM moved (`rdma_create_qp`), or a
//! connection for a QP the program moves itself (an ID without a QP: `rdma_init_qp_attr`,
//! `rdma_establish`), which softroce's [`ManualConnection`] is.

use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use softroce::transport::{datagram_steps, ConnectOptions, QpAttr, QpState};
use softroce::verbs::{Connection, ConnectionEvent, ManualConnection, Result};
use softroce::wire::{QKey, Qpn};

use super::id::{options, Request, Stage};
use crate::abi::{rdma_cm_id, rdma_conn_param, RDMA_PS_UDP, RDMA_UDP_QKEY};

/// A connected ID's connection.
#[derive(Clone)]
pub(super) enum Link {
    /// The ID's QP, which the CM moved to RTS.
    Qp(Arc<Connection>),
    /// A QP the program moves itself.
    Manual(Arc<ManualConnection>),
}

impl Link {
    /// How the CM ended the connection, waiting up to `timeout`: `None` while it stands. A
    /// QP's failure is not an end here: librdmacm reports no event for it.
    pub(super) fn wait_event(&self, timeout: Duration) -> Result<Option<ConnectionEvent>> {
        match self {
            Link::Qp(conn) => conn.wait_cm_end(timeout),
            Link::Manual(conn) => conn.wait_event(timeout),
        }
    }

    /// Queues the DREQ.
    pub(super) fn disconnect(&self) -> Result<()> {
        match self {
            Link::Qp(conn) => conn.disconnect(),
            Link::Manual(conn) => conn.disconnect(),
        }
    }

    /// The program is done with the connection (`rdma_destroy_id`).
    pub(super) fn close(&self) {
        match self {
            Link::Qp(conn) => conn.close(),
            Link::Manual(conn) => conn.close(),
        }
    }

    /// Waits for the peer's RTU (or first packet) on the passive side.
    pub(super) fn established(&self) -> Result<()> {
        match self {
            Link::Qp(conn) => conn.established(),
            Link::Manual(conn) => conn.established(),
        }
    }

    /// What the peer sent: the REP's private data on the active side.
    pub(super) fn private_data(&self) -> &[u8] {
        match self {
            Link::Qp(conn) => conn.private_data(),
            Link::Manual(conn) => conn.private_data(),
        }
    }

    /// The peer's QP.
    pub(super) fn peer_qpn(&self) -> Option<Qpn> {
        match self {
            Link::Qp(conn) => conn.qp().query().ok().and_then(|now| now.dest_qpn),
            Link::Manual(conn) => conn.qp_attr(QpState::Rtr).and_then(|rtr| rtr.dest_qpn),
        }
    }
}

/// The `conn` parameters a connection's event carries: the depths and retry counts, and the
/// peer's QP.
pub(super) fn established_param(link: &Link, options: &ConnectOptions) -> rdma_conn_param {
    rdma_conn_param {
        private_data: ptr::null(),
        private_data_len: 0,
        responder_resources: options.max_rd_atomic,
        initiator_depth: options.max_rd_atomic,
        flow_control: 1,
        retry_count: options.retry_cnt,
        rnr_retry_count: options.rnr_retry,
        srq: 0,
        qp_num: link.peer_qpn().map_or(0, Qpn::value),
    }
}

/// INIT, RTR and RTS of a UD QP as librdmacm readies it: RDMA-CM's Q_Key, sending from PSN 0
/// (cma.c `cma_ib_init_qp_attr`, librdmacm `ucma_init_ud_qp`).
pub(super) fn ud_steps() -> [QpAttr; 3] {
    datagram_steps(QKey(RDMA_UDP_QKEY))
}

/// What `rdma_init_qp_attr` gives an ID at `stage` for a QP going to `state`: a UD ID's steps
/// at any time; a connected ID's INIT once it has an address, its RTR and RTS once a request
/// came (from the REQ, as cm.c's before the REP) or the REP did; `None` otherwise.
pub(super) fn qp_attr(stage: &Stage, id: &rdma_cm_id, state: QpState) -> Option<QpAttr> {
    let step = match state {
        QpState::Init => 0,
        QpState::Rtr => 1,
        QpState::Rts => 2,
        _ => return None,
    };
    if id.ps == RDMA_PS_UDP {
        return Some(ud_steps()[step].clone());
    }
    match stage {
        Stage::Connected(Link::Manual(conn)) => conn.qp_attr(state).cloned(),
        Stage::Requested(Request::Rc(request)) => {
            // The REQ's own depths and retry counts, as cm.c gives them before the REP
            // (`cm_req_handler` keeps them for `ib_cm_init_qp_attr`).
            let asked = request.details();
            let param = rdma_conn_param {
                private_data: ptr::null(),
                private_data_len: 0,
                responder_resources: asked.initiator_depth,
                initiator_depth: asked.responder_resources,
                flow_control: 1,
                retry_count: asked.retry_count,
                rnr_retry_count: asked.rnr_retry_count,
                srq: 0,
                qp_num: 0,
            };
            Some(request.qp_attrs(&options(Some(&param)))[step].clone())
        }
        Stage::Bound | Stage::AddrResolved | Stage::RouteResolved | Stage::Connecting
            if state == QpState::Init =>
        {
            Some(QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                access: Some(options(None).access),
                ..Default::default()
            })
        }
        _ => None,
    }
}
