/* The calls rdma-core added after the first verbs, as a program meets them.
 * Usage: newer_verbs rates   - prints the rate tables and sysfs path: the test runs it over
 *                              Debian's libibverbs and over softroce's, and compares.
 *        newer_verbs device  - the GID table, and what a softroce device does not have.
 *        newer_verbs srq IP  - an ID's SRQ (rdma_create_srq), and ECE on an ID.
 *        newer_verbs reject IP PORT - listens, and rejects the first request with
 *                              rdma_reject_ece.
 *        newer_verbs ud      - a datagram's receive completion, as UCX reads it.
 *        newer_verbs marshall - the kernel ABI's copy helpers on patterned structures: every
 *                              byte of each result, for the test to compare between libraries.
 *        newer_verbs rsockets - rsockets' calls, with no rsocket to be made. */
#include <net/if.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <infiniband/sa.h>
#include <sys/select.h>
#include <unistd.h>

/* Declared by rdma-core's driver.h only, which programs do not include; Open MPI declares it
 * so too. */
const char *ibv_get_sysfs_path(void);
/* Declared by rdma-core's marshall.h, which Debian does not ship. */
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);

static void rates(void) {
    for (int rate = -1; rate <= 24; rate++)
        printf("rate %d: mult %d, mbps %d\n", rate, ibv_rate_to_mult(rate),
               ibv_rate_to_mbps(rate));
    for (int mult = -1; mult <= 500; mult++)
        printf("mult %d: rate %d\n", mult, mult_to_ibv_rate(mult));
    static const int mbps[] = { -1, 0, 2500, 5000, 10000, 14062, 14063, 20000, 25781, 28125,
                                30000, 40000, 53125, 56250, 60000, 80000, 103125, 112500,
                                120000, 168750, 200000, 206250, 309375, 425000, 637500,
                                850000, 1275000 };
    for (unsigned i = 0; i < sizeof mbps / sizeof mbps[0]; i++)
        printf("mbps %d: rate %d\n", mbps[i], mbps_to_ibv_rate(mbps[i]));
    printf("sysfs: %s\n", ibv_get_sysfs_path());
}

static void device(void) {
    struct side a, b;
    connect_pair(&a, &b);
    struct ibv_gid_entry table[4];
    memset(table, 0xff, sizeof table);
    ssize_t n = ibv_query_gid_table(a.ctx, table, 4, 0);
    union ibv_gid gid;
    CHECK(ibv_query_gid(a.ctx, 1, 0, &gid) == 0, "ibv_query_gid");
    printf("gid table: %zd, entry: %d\n", n,
           n == 1 && !memcmp(&table[0].gid, &gid, sizeof gid) && table[0].gid_index == 0 &&
               table[0].port_num == 1 && table[0].gid_type == IBV_GID_TYPE_ROCE_V2 &&
               table[0].ndev_ifindex == if_nametoindex("lo"));
    struct ibv_gid_entry one;
    printf("gid entry: %d\n", ibv_query_gid_ex(a.ctx, 1, 0, &one, 0) == 0 &&
                                  !memcmp(&one, &table[0], sizeof one));
    printf("table too small: %d, flags: %d\n", ibv_query_gid_table(a.ctx, table, 0, 0) == -EINVAL,
           ibv_query_gid_table(a.ctx, table, 4, 1) == -EINVAL);

    static char buffer[4096];
    errno = 0;
    printf("dmabuf: %d\n", !ibv_reg_dmabuf_mr(a.pd, 0, 4096, 0, 3, IBV_ACCESS_LOCAL_WRITE) &&
                               errno == EOPNOTSUPP);
    errno = 0;
    int imports = !ibv_import_device(a.ctx->cmd_fd) && errno == EOPNOTSUPP;
    errno = 0;
    imports &= !ibv_import_pd(a.ctx, 1) && errno == EOPNOTSUPP;
    errno = 0;
    imports &= !ibv_import_mr(a.pd, 1) && errno == EOPNOTSUPP;
    errno = 0;
    imports &= !ibv_import_dm(a.ctx, 1) && errno == EOPNOTSUPP;
    printf("imports: %d\n", imports);
    /* Nothing was imported: unimporting the program's own PD leaves it as it was. */
    ibv_unimport_pd(a.pd);
    struct ibv_mr *mr = ibv_reg_mr(a.pd, buffer, sizeof buffer, ALL_ACCESS);
    printf("pd after unimport: %d\n", mr != NULL);
    struct ibv_ece ece = { 0 };
    printf("ece: %d %d\n", ibv_query_ece(a.qp, &ece) == EOPNOTSUPP,
           ibv_set_ece(a.qp, &ece) == EOPNOTSUPP);
    printf("data in order: %d\n", ibv_query_qp_data_in_order(a.qp, IBV_WR_RDMA_WRITE, 0));
    /* The connection works all the same. */
    struct ibv_mr *target = ibv_reg_mr(b.pd, buffer + 2048, 1024, ALL_ACCESS);
    CHECK(target, "ibv_reg_mr");
    memset(buffer, 7, 64);
    enum ibv_wc_status st = post_one(&a, IBV_WR_RDMA_WRITE, buffer, 64, mr->lkey,
                                     (uintptr_t)buffer + 2048, target->rkey);
    printf("write: %d\n", st == IBV_WC_SUCCESS && buffer[2048 + 63] == 7);
}

static void srq(const char *ip) {
    struct rdma_cm_id *id;
    struct addrinfo *addr;
    CHECK(getaddrinfo(ip, "7300", NULL, &addr) == 0, "getaddrinfo");
    CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_bind_addr(id, addr->ai_addr) == 0, "rdma_bind_addr");

    struct ibv_ece ece = { .vendor_id = 0 };
    errno = 0;
    int no_vendor = rdma_set_local_ece(id, &ece) == -1 && errno == EINVAL;
    ece.vendor_id = 0x02c9;
    ece.options = 1;
    int offered = rdma_set_local_ece(id, &ece) == 0;
    memset(&ece, 0xff, sizeof ece);
    int none = rdma_get_remote_ece(id, &ece) == 0 && ece.vendor_id == 0 && ece.options == 0 &&
               ece.comp_mask == 0;
    printf("ece: no vendor refused %d, offered %d, remote none %d\n", no_vendor, offered, none);

    struct ibv_srq_init_attr_ex ex = { .attr = { .max_wr = 8, .max_sge = 1 },
                                       .comp_mask = IBV_SRQ_INIT_ATTR_PD };
    errno = 0;
    printf("srq_ex without a type: %d\n", rdma_create_srq_ex(id, &ex) == -1 && errno == EINVAL);
    ex.comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
    ex.srq_type = IBV_SRQT_XRC;
    errno = 0;
    printf("xrc srq: %d\n", rdma_create_srq_ex(id, &ex) == -1 && errno == EOPNOTSUPP);

    struct ibv_srq_init_attr attr = { .attr = { .max_wr = 8, .max_sge = 1 } };
    CHECK(rdma_create_srq(id, NULL, &attr) == 0, "rdma_create_srq");
    printf("srq: %d, on the id's pd: %d\n", id->srq != NULL,
           id->pd != NULL && id->srq->pd == id->pd);
    errno = 0;
    printf("a second srq: %d\n", rdma_create_srq(id, NULL, &attr) == -1 && errno == EINVAL);
    static char buffer[64];
    struct ibv_mr *mr = ibv_reg_mr(id->pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_sge sge = { .addr = (uintptr_t)buffer, .length = sizeof buffer, .lkey = mr->lkey };
    struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
    printf("srq takes receives: %d\n", ibv_post_srq_recv(id->srq, &wr, &bad) == 0);

    struct ibv_qp_init_attr qp_attr = { .cap = { .max_send_wr = 4, .max_send_sge = 1 },
                                        .qp_type = IBV_QPT_RC };
    CHECK(rdma_create_qp(id, NULL, &qp_attr) == 0, "rdma_create_qp");
    printf("qp on the srq: %d\n", id->qp->srq == id->srq);
    errno = 0;
    printf("ece with a qp: %d\n", rdma_set_local_ece(id, &ece) == -1 && errno == EINVAL);
    rdma_destroy_qp(id);
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    rdma_destroy_srq(id);
    printf("srq gone: %d\n", id->srq == NULL);

    /* A PD given is the SRQ's, and not the ID's. */
    struct ibv_pd *given = ibv_alloc_pd(id->verbs);
    CHECK(given && rdma_create_srq(id, given, &attr) == 0, "rdma_create_srq on a PD");
    int on_given = id->srq->pd == given && id->pd != given;
    rdma_destroy_srq(id);
    printf("srq on a given pd: %d, pd freed after: %d\n", on_given, ibv_dealloc_pd(given) == 0);

    /* The PD of a destroyed QP, freed by the program, is not the one an SRQ made without a PD
     * takes (librdmacm would hand the freed PD on). */
    struct ibv_pd *mine = ibv_alloc_pd(id->verbs);
    struct ibv_qp_init_attr qp_attr2 = { .cap = { .max_send_wr = 4, .max_recv_wr = 4,
                                                  .max_send_sge = 1, .max_recv_sge = 1 },
                                         .qp_type = IBV_QPT_RC };
    CHECK(mine && rdma_create_qp(id, mine, &qp_attr2) == 0, "rdma_create_qp on a PD");
    int took = id->pd == mine;
    rdma_destroy_qp(id);
    int freed = ibv_dealloc_pd(mine) == 0;
    struct ibv_srq_init_attr_ex ex2 = { .attr = { .max_wr = 8, .max_sge = 1 },
                                        .comp_mask = IBV_SRQ_INIT_ATTR_TYPE,
                                        .srq_type = IBV_SRQT_BASIC };
    CHECK(rdma_create_srq_ex(id, &ex2) == 0, "rdma_create_srq_ex");
    printf("a freed pd: taken %d, freed %d, not the id's %d, srq_ex on the id's %d\n", took,
           freed, id->pd != mine && id->pd != NULL,
           ex2.pd == id->pd && id->srq->pd == id->pd &&
               (ex2.comp_mask & IBV_SRQ_INIT_ATTR_PD) != 0);
    rdma_destroy_srq(id);
    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    errno = 0;
    printf("multicast: %d\n", rdma_join_multicast_ex(NULL, NULL, NULL) == -1 && errno == EOPNOTSUPP);
}

static void reject(const char *ip, const char *port) {
    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *listener;
    struct addrinfo *addr;
    CHECK(channel && getaddrinfo(ip, port, NULL, &addr) == 0, "getaddrinfo");
    CHECK(rdma_create_id(channel, &listener, NULL, RDMA_PS_TCP) == 0 &&
              rdma_bind_addr(listener, addr->ai_addr) == 0 && rdma_listen(listener, 1) == 0,
          "listen");
    printf("listening\n");
    struct rdma_cm_event *event;
    CHECK(rdma_get_cm_event(channel, &event) == 0, "rdma_get_cm_event");
    CHECK(event->event == RDMA_CM_EVENT_CONNECT_REQUEST, "a request");
    struct ibv_ece ece;
    memset(&ece, 0xff, sizeof ece);
    int none = rdma_get_remote_ece(event->id, &ece) == 0 && ece.vendor_id == 0;
    printf("request's ece none: %d, rejected: %d\n", none,
           rdma_reject_ece(event->id, "no", 2) == 0);
    struct rdma_cm_id *id = event->id;
    rdma_ack_cm_event(event);
    CHECK(rdma_destroy_id(id) == 0 && rdma_destroy_id(listener) == 0, "rdma_destroy_id");
}

/* A UD QP on the device at `index`, in RTS, with a CQ of its own. */
static struct ibv_qp *ud_qp(int index, struct ibv_context **ctx, struct ibv_pd **pd,
                            struct ibv_cq **cq) {
    *ctx = open_device(index);
    *pd = ibv_alloc_pd(*ctx);
    *cq = ibv_create_cq(*ctx, 8, NULL, NULL, 0);
    CHECK(*pd && *cq, "pd and cq");
    struct ibv_qp_init_attr init = { .send_cq = *cq, .recv_cq = *cq, .qp_type = IBV_QPT_UD,
        .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qp = ibv_create_qp(*pd, &init);
    CHECK(qp, "ibv_create_qp");
    struct qp_step steps[3];
    ud_steps(steps);
    take_steps(qp, steps);
    return qp;
}

static void ud(void) {
    struct ibv_context *ctx[2];
    struct ibv_pd *pd[2];
    struct ibv_cq *cq[2];
    struct ibv_qp *qp[2] = { ud_qp(0, &ctx[0], &pd[0], &cq[0]), ud_qp(1, &ctx[1], &pd[1], &cq[1]) };
    static char buffer[2][4096];
    struct ibv_mr *mr[2] = { ibv_reg_mr(pd[0], buffer[0], 4096, IBV_ACCESS_LOCAL_WRITE),
                             ibv_reg_mr(pd[1], buffer[1], 4096, IBV_ACCESS_LOCAL_WRITE) };
    CHECK(mr[0] && mr[1], "ibv_reg_mr");
    struct ibv_sge recv_sge = { .addr = (uintptr_t)buffer[1], .length = 4096, .lkey = mr[1]->lkey };
    struct ibv_recv_wr recv = { .wr_id = 2, .sg_list = &recv_sge, .num_sge = 1 }, *bad_recv;
    CHECK(ibv_post_recv(qp[1], &recv, &bad_recv) == 0, "ibv_post_recv");
    struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1 };
    CHECK(ibv_query_gid(ctx[1], 1, 0, &ah_attr.grh.dgid) == 0, "ibv_query_gid");
    struct ibv_ah *ah = ibv_create_ah(pd[0], &ah_attr);
    CHECK(ah, "ibv_create_ah");
    strcpy(buffer[0], "datagram");
    struct ibv_sge sge = { .addr = (uintptr_t)buffer[0], .length = 9, .lkey = mr[0]->lkey };
    struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED }, *bad;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qp[1]->qp_num;
    wr.wr.ud.remote_qkey = 0x11111111;
    CHECK(ibv_post_send(qp[0], &wr, &bad) == 0, "ibv_post_send");
    CHECK(next_wc(cq[0]).status == IBV_WC_SUCCESS, "the send");
    struct ibv_wc wc = next_wc(cq[1]);
    CHECK(wc.status == IBV_WC_SUCCESS, "the receive");
    /* The area holds an IPv4 header after 20 bytes: its version nibble, and its destination
     * where UCX looks when sl's L3 type says IPv4 (the area's last 4 bytes). */
    union ibv_gid own;
    CHECK(ibv_query_gid(ctx[1], 1, 0, &own) == 0, "ibv_query_gid");
    printf("sl: %d, grh: %d, ipv4 header: %d, destination: %d, data: %d\n", wc.sl,
           (wc.wc_flags & IBV_WC_GRH) != 0, ((uint8_t)buffer[1][20] >> 4) == 4,
           !memcmp(buffer[1] + 36, own.raw + 12, 4), !strcmp(buffer[1] + 40, "datagram"));
    struct ibv_ah *back = ibv_create_ah_from_wc(pd[1], &wc, (struct ibv_grh *)buffer[1], 1);
    printf("reply address: %d\n", back != NULL);
}

/* Fills `len` bytes with a pattern that differs from byte to byte and from `seed` to `seed`. */
static void pattern(void *p, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++)
        ((uint8_t *)p)[i] = (uint8_t)(seed * 131 + i * 29 + 7);
}

/* Prints `len` bytes of `p` in hex after `what`. */
static void dump(const char *what, const void *p, size_t len) {
    printf("%s:", what);
    for (size_t i = 0; i < len; i++)
        printf("%02x", ((const uint8_t *)p)[i]);
    printf("\n");
}

/* Each helper over two seeds, its destination prefilled with a byte the source never has in
 * the same place: what it leaves untouched shows too. */
static void marshall(void) {
    for (unsigned seed = 1; seed <= 2; seed++) {
        struct ib_uverbs_qp_attr kqp;
        struct ibv_qp_attr qp;
        pattern(&kqp, sizeof kqp, seed);
        memset(&qp, 0xa5, sizeof qp);
        ibv_copy_qp_attr_from_kern(&qp, &kqp);
        dump("qp_attr_from_kern", &qp, sizeof qp);

        struct ib_uverbs_ah_attr kah;
        struct ibv_ah_attr ah;
        pattern(&kah, sizeof kah, seed + 10);
        memset(&ah, 0xa5, sizeof ah);
        ibv_copy_ah_attr_from_kern(&ah, &kah);
        dump("ah_attr_from_kern", &ah, sizeof ah);

        struct ib_user_path_rec kpath;
        struct ibv_sa_path_rec path;
        pattern(&kpath, sizeof kpath, seed + 20);
        memset(&path, 0xa5, sizeof path);
        ibv_copy_path_rec_from_kern(&path, &kpath);
        dump("path_rec_from_kern", &path, sizeof path);

        pattern(&path, sizeof path, seed + 30);
        memset(&kpath, 0xa5, sizeof kpath);
        ibv_copy_path_rec_to_kern(&kpath, &path);
        dump("path_rec_to_kern", &kpath, sizeof kpath);
    }
}

static void rsockets(void) {
    errno = 0;
    printf("rsocket: %d\n", rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == EOPNOTSUPP);
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    struct sockaddr_in sin = { .sin_family = AF_INET };
    char byte;
    errno = 0;
    int badf = rbind(fds[0], (struct sockaddr *)&sin, sizeof sin) == -1 && errno == EBADF;
    errno = 0;
    badf &= rread(fds[0], &byte, 1) == -1 && errno == EBADF;
    errno = 0;
    badf &= riowrite(fds[1], &byte, 1, 0, 0) == (size_t)-1 && errno == EBADF;
    printf("not an rsocket: %d\n", badf);
    CHECK(write(fds[1], "x", 1) == 1, "write");
    fd_set readable;
    FD_ZERO(&readable);
    FD_SET(fds[0], &readable);
    struct timeval now = { 0 };
    struct pollfd p = { .fd = fds[0], .events = POLLIN };
    printf("rselect: %d, rpoll: %d\n", rselect(fds[0] + 1, &readable, NULL, NULL, &now) == 1,
           rpoll(&p, 1, 0) == 1 && (p.revents & POLLIN));
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "rates"))
        rates();
    else if (argc >= 2 && !strcmp(argv[1], "device"))
        device();
    else if (argc >= 3 && !strcmp(argv[1], "srq"))
        srq(argv[2]);
    else if (argc >= 2 && !strcmp(argv[1], "ud"))
        ud();
    else if (argc >= 2 && !strcmp(argv[1], "marshall"))
        marshall();
    else if (argc >= 2 && !strcmp(argv[1], "rsockets"))
        rsockets();
    else if (argc >= 4 && !strcmp(argv[1], "reject"))
        reject(argv[2], argv[3]);
    else
        return 2;
    printf("done\n");
    return 0;
}
