"""pyverbs (rdma-core's Python binding) over softroce: two devices of one process (softroce run
--addr twice), an RC QP on each connected to the other by GID, and RDMA WRITEs of 4 KiB from one
to the other, every byte checked: one posted with ibv_post_send on a plain QP, one with the
ibv_wr_* calls of an extended QP (QPEx) and polled on an extended CQ (CQEX), as rdma-core's own
tests use them. Prints what it did; exits non-zero if anything differs."""
import sys

from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ, CQEX, CqInitAttrEx, PollCqAttr
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from pyverbs.wr import SGE, SendWR
import pyverbs.enums as e

SIZE = 4096
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


class Side:
    def __init__(self, name, extended):
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, SIZE, ACCESS)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        if extended:
            self.cq = CQEX(self.ctx, CqInitAttrEx(cqe=16))
            init = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap,
                                pd=self.pd, send_ops_flags=e.IBV_QP_EX_WITH_RDMA_WRITE,
                                comp_mask=e.IBV_QP_INIT_ATTR_PD
                                | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
            self.qp = QPEx(self.ctx, init)
        else:
            self.cq = CQ(self.ctx, 16)
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
            self.qp = QP(self.pd, init)
        self.gid = self.ctx.query_gid(1, 0)

    def connect(self, peer):
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
        attr.qp_access_flags = ACCESS
        self.qp.to_init(attr)
        route = GlobalRoute(dgid=peer.gid, sgid_index=0)
        attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
        attr.dest_qp_num = peer.qp.qp_num
        attr.rq_psn = 0
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=1)
        self.qp.to_rtr(attr)
        attr = QPAttr(qp_state=e.IBV_QPS_RTS)
        attr.sq_psn = 0
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.max_rd_atomic = 1
        self.qp.to_rts(attr)


def plain_write(a, b, data):
    """A WRITE posted with ibv_post_send, polled with ibv_poll_cq: whether it succeeded."""
    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                sg=[SGE(a.mr.buf, SIZE, a.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
    a.qp.post_send(wr)
    while True:
        n, wcs = a.cq.poll()
        if n:
            return wcs[0].status == e.IBV_WC_SUCCESS


def extended_write(a, b, data):
    """A WRITE built with the ibv_wr_* calls, polled with ibv_start_poll."""
    a.qp.wr_start()
    a.qp.wr_id = 7
    a.qp.wr_flags = e.IBV_SEND_SIGNALED
    a.qp.wr_rdma_write(b.mr.rkey, b.mr.buf)
    a.qp.wr_set_sge(SGE(a.mr.buf, SIZE, a.mr.lkey))
    a.qp.wr_complete()
    # pyverbs' start_poll returns ENOENT while the CQ is empty, and raises on other errors.
    while a.cq.start_poll(PollCqAttr()) != 0:
        pass
    ok = (a.cq.status == e.IBV_WC_SUCCESS and a.cq.wr_id == 7
          and a.cq.read_opcode() == e.IBV_WC_RDMA_WRITE)
    a.cq.end_poll()
    return ok


names = [d.name.decode() for d in get_device_list()]
print("devices:", " ".join(names))
failed = False
for extended, write in [(False, plain_write), (True, extended_write)]:
    a, b = Side(names[0], extended), Side(names[1], extended)
    a.connect(b)
    b.connect(a)
    data = bytes((i * 7 + 3 + extended) % 256 for i in range(SIZE))
    a.mr.write(data, SIZE)
    done = write(a, b, data)
    landed = b.mr.read(SIZE, 0) == data
    kind = "extended" if extended else "plain"
    print(f"{kind} write completion: {done}")
    print(f"{kind} data checked: {landed}")
    failed = failed or not (done and landed)
sys.exit(1 if failed else 0)
