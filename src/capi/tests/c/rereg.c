/* ibv_rereg_mr as a program and its peer see it: what rdma-core refuses before the kernel, and
 * what the kernel refuses; a new range, new rights, another PD and back; and the failures that
 * leave the region as it was (memory the kernel would not pin, windows bound over it). Prints
 * what it saw. */
#include <sys/mman.h>

/* The peer `b` WRITEs `len` bytes of `from` to `addr` through `rkey`: the completion's status. */
static enum ibv_wc_status peer_writes(struct side *b, struct ibv_mr *from, uint32_t len,
                                      void *addr, uint32_t rkey) {
    return post_one(b, IBV_WR_RDMA_WRITE, from->addr, len, from->lkey, (uintptr_t)addr, rkey);
}

int main(void) {
    static uint8_t first[4096], second[4096], out[64];
    struct side a, b;
    connect_pair(&a, &b);
    int writes = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *mr = ibv_reg_mr(a.pd, first, sizeof first, writes);
    struct ibv_mr *src = ibv_reg_mr(b.pd, out, sizeof out, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr && src, "regions");
    uint32_t first_rkey = mr->rkey;

    errno = 0;
    int ret = ibv_rereg_mr(mr, IBV_REREG_MR_FLAGS_SUPPORTED + 1, NULL, NULL, 0, 0);
    printf("unknown flag: %d\n", ret == IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
    errno = 0;
    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, second, sizeof second, writes);
    printf("access without its flag: %d\n", ret == IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
    errno = 0;
    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, second, 0, 0);
    printf("no length: %d\n", ret == IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
    errno = 0;
    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, b.pd, NULL, 0, 0);
    printf("another device's PD: %d\n", ret == IBV_REREG_MR_ERR_CMD && errno == EINVAL);
    errno = 0;
    ret = ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0);
    printf("no change asked: %d\n", ret == IBV_REREG_MR_ERR_CMD && errno == EINVAL &&
                                     mr->rkey == first_rkey);

    void *readonly = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(readonly != MAP_FAILED, "mmap");
    errno = 0;
    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, readonly, 4096, 0);
    printf("read-only range: %d\n", ret == IBV_REREG_MR_ERR_CMD && errno == EFAULT);
    memset(out, 0x11, sizeof out);
    enum ibv_wc_status st = peer_writes(&b, src, 64, first, mr->rkey);
    printf("old region still written: %d\n",
           st == IBV_WC_SUCCESS && first[0] == 0x11 && mr->addr == first);

    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, second, sizeof second, 0);
    memset(out, 0x22, sizeof out);
    st = peer_writes(&b, src, 64, second + 100, mr->rkey);
    printf("new range: %d\n", ret == 0 && mr->addr == second && mr->length == sizeof second &&
                              mr->rkey != first_rkey && st == IBV_WC_SUCCESS &&
                              second[100] == 0x22 && first[100] == 0);

    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
                       writes | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND);
    memset(out, 0, sizeof out);
    st = post_one(&b, IBV_WR_RDMA_READ, out, 64, src->lkey, (uintptr_t)second + 100, mr->rkey);
    printf("new rights: %d\n", ret == 0 && st == IBV_WC_SUCCESS && out[0] == 0x22);

    struct ibv_pd *other = ibv_alloc_pd(a.ctx);
    CHECK(other, "ibv_alloc_pd");
    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other, NULL, 0, 0);
    printf("another PD: %d\n", ret == 0 && mr->pd == other && ibv_dealloc_pd(other) == EBUSY);
    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, a.pd, NULL, 0, 0);
    printf("back: %d\n", ret == 0 && mr->pd == a.pd && ibv_dealloc_pd(other) == 0);

    struct ibv_mw *mw = ibv_alloc_mw(a.pd, IBV_MW_TYPE_1);
    CHECK(mw, "ibv_alloc_mw");
    struct ibv_mw_bind bind = {
        .wr_id = 7, .send_flags = IBV_SEND_SIGNALED,
        .bind_info = { .mr = mr, .addr = (uintptr_t)second, .length = 512,
                       .mw_access_flags = IBV_ACCESS_REMOTE_READ },
    };
    CHECK(ibv_bind_mw(a.qp, mw, &bind) == 0 && next_wc(a.cq).status == IBV_WC_SUCCESS, "bind");
    uint32_t rkey = mr->rkey;
    errno = 0;
    ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, first, sizeof first, 0);
    int err = errno;
    memset(out, 0x33, sizeof out);
    st = peer_writes(&b, src, 64, second + 200, mr->rkey);
    printf("under a window: %d\n", ret == IBV_REREG_MR_ERR_CMD && err == EBUSY &&
                                   mr->rkey == rkey && st == IBV_WC_SUCCESS && second[200] == 0x33);
    struct ibv_mw_bind unbind = { .wr_id = 8, .send_flags = IBV_SEND_SIGNALED };
    CHECK(ibv_bind_mw(a.qp, mw, &unbind) == 0 && next_wc(a.cq).status == IBV_WC_SUCCESS,
          "unbind");
    CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");

    /* Last: a refused access ends the RC connection. */
    st = peer_writes(&b, src, 64, first, first_rkey);
    printf("first rkey refused: %d\n", st == IBV_WC_REM_ACCESS_ERR);
    printf("deregistered: %d\n", ibv_dereg_mr(mr) == 0);
    printf("done\n");
    return 0;
}
