/* A type 1 window unbound (defect 6 of issue 49): ibv_bind_mw with bind_info.mr NULL and
 * length 0, as verbs.h and rxe take it, completes as a bind; the window grants nothing after,
 * and its region, no longer under a window, deregisters. Prints what it saw. */

int main(void) {
    static uint8_t region[4096], into[64];
    struct side a, b;
    connect_pair(&a, &b);
    for (int i = 0; i < (int)sizeof region; i++)
        region[i] = (uint8_t)(i * 7 + 3);
    struct ibv_mr *mr = ibv_reg_mr(a.pd, region, sizeof region,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    struct ibv_mr *landing = ibv_reg_mr(b.pd, into, sizeof into, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mw *mw = ibv_alloc_mw(a.pd, IBV_MW_TYPE_1);
    CHECK(mr && landing && mw, "regions and window");

    struct ibv_mw_bind bind = {
        .wr_id = 7, .send_flags = IBV_SEND_SIGNALED,
        .bind_info = { .mr = mr, .addr = (uintptr_t)region + 1024, .length = 512,
                       .mw_access_flags = IBV_ACCESS_REMOTE_READ },
    };
    CHECK(ibv_bind_mw(a.qp, mw, &bind) == 0, "ibv_bind_mw");
    struct ibv_wc wc = next_wc(a.cq);
    printf("bound: %d\n", wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW);
    uint32_t bound_rkey = mw->rkey;
    enum ibv_wc_status read = post_one(&b, IBV_WR_RDMA_READ, into, 64, landing->lkey,
                                       (uintptr_t)region + 1024, bound_rkey);
    printf("read through the window: %d\n", read == IBV_WC_SUCCESS && into[0] == region[1024]);
    printf("region busy while bound: %d\n", ibv_dereg_mr(mr) == EBUSY);

    struct ibv_mw_bind unbind = { .wr_id = 8, .send_flags = IBV_SEND_SIGNALED,
                                  .bind_info = { .mr = NULL, .addr = 0, .length = 0 } };
    int ret = ibv_bind_mw(a.qp, mw, &unbind);
    printf("unbind posted: %d\n", ret);
    if (ret == 0) {
        wc = next_wc(a.cq);
        printf("unbound: %d\n", wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW &&
                                wc.wr_id == 8);
    }
    printf("region deregistered: %d\n", ibv_dereg_mr(mr) == 0);
    read = post_one(&b, IBV_WR_RDMA_READ, into, 64, landing->lkey, (uintptr_t)region + 1024,
                    bound_rkey);
    printf("old rkey refused: %d\n", read == IBV_WC_REM_ACCESS_ERR);
    printf("done\n");
    return 0;
}
