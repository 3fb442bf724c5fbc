"""pyverbs (rdma-core's Python binding) over softroce: two devices of one process (softroce run
--addr twice), an RC QP on each connected to the other by GID, and an RDMA WRITE of 4 KiB from
one to the other, every byte checked. Prints what it did; exits non-zero if anything differs."""
import sys

from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR
import pyverbs.enums as e

SIZE = 4096
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


class Side:
    def __init__(self, name):
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, SIZE, ACCESS)
        self.cq = CQ(self.ctx, 16)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
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


names = [d.name.decode() for d in get_device_list()]
print("devices:", " ".join(names))
a, b = Side(names[0]), Side(names[1])
a.connect(b)
b.connect(a)
data = bytes((i * 7 + 3) % 256 for i in range(SIZE))
a.mr.write(data, SIZE)
wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
            sg=[SGE(a.mr.buf, SIZE, a.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
a.qp.post_send(wr)
while True:
    n, wcs = a.cq.poll()
    if n:
        break
print("write completion:", wcs[0].status == e.IBV_WC_SUCCESS)
landed = b.mr.read(SIZE, 0)
print("data checked:", landed == data)
sys.exit(0 if wcs[0].status == e.IBV_WC_SUCCESS and landed == data else 1)
