/* Objects still in use are not destroyed (defect 7 of issue 49): a CQ a QP uses, an SRQ a QP
 * uses, and a PD with a QP, a region, an address handle, a window or an SRQ on it each answer
 * EBUSY, as rdma-core's do (the kernel's usecnt checks), and stay usable; once what uses them
 * is gone, each is destroyed. Prints what it saw; the test reads it. */

int main(void) {
    static char buf[64];
    struct ibv_context *ctx = open_device(0);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    struct ibv_srq_init_attr srq_init = { .attr = { .max_wr = 4, .max_sge = 1 } };
    struct ibv_srq *srq = pd ? ibv_create_srq(pd, &srq_init) : NULL;
    CHECK(pd && cq && srq, "pd, cq and srq");
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr");
    struct ibv_qp_init_attr init = { .send_cq = cq, .recv_cq = cq, .srq = srq,
        .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 1, .max_send_sge = 1 } };
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    CHECK(qp, "ibv_create_qp");

    printf("cq in use: %d\n", ibv_destroy_cq(cq) == EBUSY);
    printf("srq in use: %d\n", ibv_destroy_srq(srq) == EBUSY);
    printf("pd in use: %d\n", ibv_dealloc_pd(pd) == EBUSY);
    struct ibv_wc wc;
    printf("cq still polls: %d\n", ibv_poll_cq(cq, 1, &wc) == 0);
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr got;
    printf("qp still queries: %d\n", ibv_query_qp(qp, &attr, IBV_QP_STATE, &got) == 0 &&
                                     got.send_cq == cq && got.srq == srq);
    /* Destroyed with its event held, it stays allocated until the acknowledgement: a second
     * destroy changes nothing (its uses were let go of at the first). */
    struct ibv_qp_attr to_error = { .qp_state = IBV_QPS_ERR };
    CHECK(ibv_modify_qp(qp, &to_error, IBV_QP_STATE) == 0, "to ERROR");
    struct ibv_async_event event;
    CHECK(ibv_get_async_event(ctx, &event) == 0 && event.element.qp == qp, "its event");
    CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
    printf("destroyed again: %s\n", ibv_destroy_qp(qp) == EINVAL ? "EINVAL" : "other");
    ibv_ack_async_event(&event);

    printf("pd with a region: %d\n", ibv_dealloc_pd(pd) == EBUSY);
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1 };
    CHECK(ibv_query_gid(ctx, 1, 0, &ah_attr.grh.dgid) == 0, "ibv_query_gid");
    struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
    struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(ah && mw, "ah and mw");
    CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
    printf("pd with an address handle and a window: %d\n", ibv_dealloc_pd(pd) == EBUSY);
    CHECK(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
    printf("pd with a window: %d\n", ibv_dealloc_pd(pd) == EBUSY);
    CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
    CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    printf("all destroyed\n");
    return 0;
}
