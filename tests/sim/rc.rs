//! An RC connection between nodes 0 and 1 of the simulator, and what tests do with it.

use std::time::Duration;

use super::{drain, forge, Sim};
use softroce::memory::{inc_rkey, Access, BindMw, MemoryRegion, MwType, PdId};
use softroce::transport::{
    connect_steps, ConnectOptions, CqId, PathMtu, Payload, QpEndpoint, QpInit, QpType, RecvWr,
    SendOp, SendWr, Sge, SgeList, SrqAttr, SrqId, VerbsError, WcOpcode, WcStatus,
};
use softroce::wire::{
    BthRepr, ExtHeaders, Opcode, Psn, QKey, Qpn, RKey, RethRepr, RnrTimer, RocePacket,
};

pub const IOVA: u64 = 0x10_0000;
pub const MR_LEN: usize = 1 << 20;
pub const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC)
    .union(Access::MW_BIND);

#[derive(Debug, Clone)]
pub struct Side {
    pub qpn: Qpn,
    pub cq: CqId,
    pub mr: MemoryRegion,
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub mtu: PathMtu,
    pub psn: [u32; 2],
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub qp_access: Access,
    pub mr_access: Access,
    /// Each side's READ and atomic depth, both ways (max_rd_atomic, max_dest_rd_atomic).
    pub rd_atomic: [u8; 2],
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mtu: PathMtu::Mtu1024,
            psn: [100, 5000],
            timeout: 10, // 4.2 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 µs
            qp_access: ALL,
            mr_access: ALL,
            rd_atomic: [16, 16],
        }
    }
}

/// Two endpoints with one connected RC QP each, taken through INIT, RTR and RTS.
pub fn connect(sim: &mut Sim, o: Options) -> [Side; 2] {
    connect_sharing(sim, o, None).0
}

/// [`connect`], node 1's QP taking its receives from an SRQ of its own of `srq_depth`
/// requests, if given: the SRQ's number is returned with the sides.
pub fn connect_sharing(
    sim: &mut Sim,
    o: Options,
    srq_depth: Option<usize>,
) -> ([Side; 2], Option<SrqId>) {
    let mut srq = None;
    let sides = [0, 1].map(|n| {
        let ep = &mut sim.nodes[n];
        let pd = ep.alloc_pd();
        let cq = ep.create_cq(1 << 20);
        let mr = ep.reg_mr(pd, IOVA, MR_LEN, o.mr_access).unwrap();
        let qpn = match srq_depth.filter(|_| n == 1) {
            Some(max_wr) => {
                let attr = SrqAttr {
                    max_wr,
                    srq_limit: 0,
                };
                let id = ep.create_srq(pd, attr).unwrap();
                srq = Some(id);
                ep.create_qp_with_srq(rc_init(pd, cq), id).unwrap()
            }
            None => qp_on(sim, n, pd, cq),
        };
        Side { qpn, cq, mr }
    });
    connect_qps(sim, [(0, sides[0].qpn), (1, sides[1].qpn)], &o);
    (sides, srq)
}

/// An RC QP of `pd` completing into `cq`, deep enough that no test fills it.
pub fn rc_init(pd: PdId, cq: CqId) -> QpInit {
    QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        max_send_wr: 1 << 16,
        max_recv_wr: 1 << 16,
    }
}

/// A new RC QP on `node`, in `pd`, completing into `cq`.
pub fn qp_on(sim: &mut Sim, node: usize, pd: PdId, cq: CqId) -> Qpn {
    sim.nodes[node].create_qp(rc_init(pd, cq)).unwrap()
}

/// Connects two RC QPs, each `(node, qpn)`, as `o` says: the first sends from `o.psn[0]`.
pub fn connect_qps(sim: &mut Sim, ends: [(usize, Qpn); 2], o: &Options) {
    for me in [0, 1] {
        connect_end(sim, ends, me, o).unwrap();
    }
}

/// Takes end `me` of `ends` through INIT, RTR and RTS towards the other.
pub fn connect_end(
    sim: &mut Sim,
    ends: [(usize, Qpn); 2],
    me: usize,
    o: &Options,
) -> Result<(), VerbsError> {
    let (node, qpn) = ends[me];
    let them = 1 - me;
    let remote = QpEndpoint {
        addr: sim.addr_of(ends[them].0),
        qpn: ends[them].1,
        psn: Psn::new(o.psn[them]),
        mtu: o.mtu,
        qkey: QKey(0),
    };
    let options = ConnectOptions {
        mtu: None,
        access: o.qp_access,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        min_rnr_timer: RnrTimer::new(o.min_rnr_timer),
        max_rd_atomic: o.rd_atomic[me],
    };
    let now = sim.now;
    for step in connect_steps(QpType::Rc, &remote, Psn::new(o.psn[me]), &options) {
        sim.nodes[node].modify_qp(now, qpn, &step)?;
    }
    Ok(())
}

pub fn sge(side: &Side, offset: u64, len: u32) -> Payload {
    Payload::Sges(
        [Sge {
            addr: IOVA + offset,
            len,
            lkey: side.mr.lkey(),
        }]
        .into(),
    )
}

pub fn post_recv(sim: &mut Sim, node: usize, side: &Side, wr_id: u64, offset: u64, len: u32) {
    let wr = RecvWr {
        wr_id,
        sges: [Sge {
            addr: IOVA + offset,
            len,
            lkey: side.mr.lkey(),
        }]
        .into(),
    };
    sim.nodes[node].post_recv(side.qpn, wr).unwrap();
}

pub fn post_send(sim: &mut Sim, node: usize, side: &Side, wr: SendWr) {
    let now = sim.now;
    sim.nodes[node].post_send(now, side.qpn, wr).unwrap();
}

pub fn read_mr(side: &Side, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    side.mr.read(offset, &mut out).unwrap();
    out
}

/// Allocates a type 2 window on `node` and binds it over `len` bytes at `offset` of `side`'s
/// region, through `side`'s QP, for remote read and write; returns its rkey.
pub fn bind_type2_window(sim: &mut Sim, node: usize, side: &Side, offset: u64, len: u64) -> RKey {
    let pd = side.mr.pd();
    let mw = sim.nodes[node].alloc_mw(pd, MwType::Type2).unwrap();
    let bind = BindMw {
        window: mw,
        new_rkey: inc_rkey(mw),
        region: side.mr.lkey(),
        addr: IOVA + offset,
        len,
        access: Access::REMOTE_WRITE | Access::REMOTE_READ,
    };
    let mut wr = SendWr::new(0xb1d, SendOp::BindMw(bind), Payload::Sges(SgeList::new()));
    wr.signaled = true;
    post_send(sim, node, side, wr);
    sim.run_idle(LIMIT);
    let bound = drain(sim, node, side.cq);
    assert_eq!(bound.len(), 1, "{bound:?}");
    assert_eq!(
        (bound[0].wr_id, bound[0].status, bound[0].opcode),
        (0xb1d, WcStatus::Success, WcOpcode::BindMw)
    );
    bind.new_rkey
}

/// A READ request to `to`'s QP at `psn`, as its peer would send it: what a test forges to
/// repeat a READ.
pub fn read_request(to: &Side, psn: u32, reth: RethRepr) -> Vec<u8> {
    let bth = BthRepr::new(Opcode::RcReadRequest, to.qpn, Psn::new(psn));
    let ext = ExtHeaders {
        reth: Some(reth),
        ..Default::default()
    };
    forge(bth, ext, &[])
}

/// Loses the first packet with `opcode` on the wire, once.
pub fn lose_first(sim: &mut Sim, opcode: Opcode) {
    let mut lost = false;
    sim.filter = Some(Box::new(move |_, bytes| {
        let hit = RocePacket::new_checked(bytes).is_ok_and(|p| p.bth().opcode() == opcode);
        if hit && !lost {
            lost = true;
            return false;
        }
        true
    }));
}

pub const LIMIT: Duration = Duration::from_secs(600);
