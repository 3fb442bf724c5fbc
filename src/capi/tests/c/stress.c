/* Threads that post, poll, take and acknowledge events, and destroy QPs, CQs, SRQs and IDs, all
 * at once (issue 49): what a program may do concurrently, done concurrently, over and over.
 * Run under AddressSanitizer (and ThreadSanitizer), which see the program's reads of the
 * library's structures and every free: a use after free, a double free, or a destroy that
 * answers EBUSY when nothing uses the object any more, fails the run.
 *
 * Each verbs round: QPs 0 and 1 of device 0 carry traffic with their peers on device 1 (a
 * poster thread posts SENDs, receives on the SRQ they share, and WRITEs; a poller drains both
 * sides' CQs), while a destroyer moves QPs 2 and 3, which share the CQ and the SRQ and get
 * their peers' SENDs too, to ERROR and destroys them, then destroys the CQ they sent on; a
 * thread takes the CQ events of the channel those CQs are on, and another the asynchronous
 * events their destruction raised, acknowledging each, whether its object is destroyed or not.
 * Each RDMA-CM round: clients on device 1 connect to a listener on device 0 while one thread
 * takes and acknowledges every event of both channels, accepting requests, and the main
 * thread destroys the clients' IDs as soon as they are connected.
 * Usage: stress ADDRESS0 ADDRESS1 ROUNDS. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

#define QPS 4
#define CLIENTS 6

static atomic_int stop;
/* What the threads did, all rounds together: printed, so that a run that did nothing shows. */
static atomic_long polled, cq_events_taken, async_events_taken, cm_events_taken;
static struct ibv_context *ctx0, *ctx1;
static struct ibv_pd *pd0, *pd1;
static char *memory0, *memory1;
static struct ibv_mr *mr0, *mr1;

struct round {
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq, *send_cq, *peer_cq;
    struct ibv_srq *srq;
    struct ibv_qp *qp[QPS], *peer[QPS];
};

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *send, struct ibv_cq *recv,
                              struct ibv_srq *srq) {
    struct ibv_qp_init_attr init = { .send_cq = send, .recv_cq = recv, .srq = srq,
        .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    CHECK(qp, "ibv_create_qp");
    return qp;
}

static void pair_up(struct ibv_qp *qp, struct ibv_context *ctx, struct ibv_qp *peer,
                    struct ibv_context *peer_ctx) {
    struct side s = { .ctx = ctx, .qp = qp }, p = { .ctx = peer_ctx, .qp = peer };
    to_rts(&s, &p);
}

static void post_recv(struct ibv_srq *srq, struct ibv_qp *qp, char *at, uint32_t lkey) {
    struct ibv_sge sge = { .addr = (uintptr_t)at, .length = 64, .lkey = lkey };
    struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
    if (srq)
        ibv_post_srq_recv(srq, &wr, &bad);
    else
        ibv_post_recv(qp, &wr, &bad);
}

static void post_send(struct ibv_qp *qp, enum ibv_wr_opcode opcode, char *at, uint32_t lkey,
                      uint64_t remote, uint32_t rkey) {
    struct ibv_sge sge = { .addr = (uintptr_t)at, .length = 64, .lkey = lkey };
    struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = opcode,
                              .send_flags = IBV_SEND_SIGNALED }, *bad;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    ibv_post_send(qp, &wr, &bad); /* a full queue is no failure here */
}

static void *poster(void *arg) {
    struct round *r = arg;
    for (int i = 0; !atomic_load(&stop); i++) {
        int q = i % 2;
        post_recv(r->srq, NULL, memory0 + 64 * (i % 32), mr0->lkey);
        post_send(r->peer[q], IBV_WR_SEND, memory1, mr1->lkey, 0, 0);
        post_send(r->qp[q], IBV_WR_RDMA_WRITE, memory0 + 4096, mr0->lkey,
                  (uintptr_t)memory1 + 4096, mr1->rkey);
        if (i % 8 == 0)
            usleep(100);
    }
    return NULL;
}

static void *poller(void *arg) {
    struct round *r = arg;
    struct ibv_wc wc[16];
    while (!atomic_load(&stop)) {
        int n = ibv_poll_cq(r->cq, 16, wc), m = ibv_poll_cq(r->peer_cq, 16, wc);
        atomic_fetch_add(&polled, (n > 0 ? n : 0) + (m > 0 ? m : 0));
    }
    return NULL;
}

/* Waits up to 10 ms for `fd` to be readable. */
static int readable(int fd) {
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, 10) == 1;
}

static void *cq_events(void *arg) {
    struct round *r = arg;
    while (!atomic_load(&stop)) {
        ibv_req_notify_cq(r->cq, 0);
        struct ibv_cq *cq;
        void *context;
        if (readable(r->channel->fd) && ibv_get_cq_event(r->channel, &cq, &context) == 0) {
            ibv_ack_cq_events(cq, 1);
            atomic_fetch_add(&cq_events_taken, 1);
        }
    }
    return NULL;
}

static void *async_events(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        struct ibv_async_event event;
        if (readable(ctx0->async_fd) && ibv_get_async_event(ctx0, &event) == 0) {
            usleep(50); /* held while the destroyer may be destroying its object */
            ibv_ack_async_event(&event);
            atomic_fetch_add(&async_events_taken, 1);
        }
    }
    return NULL;
}

static void *destroyer(void *arg) {
    struct round *r = arg;
    struct ibv_qp_attr to_error = { .qp_state = IBV_QPS_ERR };
    for (int q = 2; q < QPS; q++) {
        usleep(200 + (unsigned)rand() % 2000);
        ibv_modify_qp(r->qp[q], &to_error, IBV_QP_STATE);
        usleep((unsigned)rand() % 500);
        CHECK(ibv_destroy_qp(r->qp[q]) == 0, "ibv_destroy_qp (destroyer)");
    }
    /* Nothing uses it any more: it must go, events of it held or not. */
    CHECK(ibv_destroy_cq(r->send_cq) == 0, "ibv_destroy_cq (destroyer)");
    return NULL;
}

static void verbs_round(void) {
    struct round r;
    r.channel = ibv_create_comp_channel(ctx0);
    CHECK(r.channel, "ibv_create_comp_channel");
    fcntl(r.channel->fd, F_SETFL, fcntl(r.channel->fd, F_GETFL) | O_NONBLOCK);
    r.cq = ibv_create_cq(ctx0, 256, NULL, r.channel, 0);
    r.send_cq = ibv_create_cq(ctx0, 256, NULL, r.channel, 0);
    r.peer_cq = ibv_create_cq(ctx1, 256, NULL, NULL, 0);
    struct ibv_srq_init_attr srq_init = { .attr = { .max_wr = 64, .max_sge = 1 } };
    r.srq = ibv_create_srq(pd0, &srq_init);
    CHECK(r.cq && r.send_cq && r.peer_cq && r.srq, "the round's CQs and SRQ");
    for (int q = 0; q < QPS; q++) {
        r.qp[q] = make_qp(pd0, q < 2 ? r.cq : r.send_cq, r.cq, r.srq);
        r.peer[q] = make_qp(pd1, r.peer_cq, r.peer_cq, NULL);
        pair_up(r.qp[q], ctx0, r.peer[q], ctx1);
        pair_up(r.peer[q], ctx1, r.qp[q], ctx0);
    }
    atomic_store(&stop, 0);
    pthread_t threads[5];
    void *(*bodies[5])(void *) = { poster, poller, cq_events, async_events, destroyer };
    for (int t = 0; t < 5; t++)
        CHECK(pthread_create(&threads[t], NULL, bodies[t], &r) == 0, "pthread_create");
    pthread_join(threads[4], NULL);
    usleep(2000);
    atomic_store(&stop, 1);
    for (int t = 0; t < 4; t++)
        pthread_join(threads[t], NULL);
    for (int q = 0; q < QPS; q++) {
        if (q < 2)
            CHECK(ibv_destroy_qp(r.qp[q]) == 0, "ibv_destroy_qp");
        CHECK(ibv_destroy_qp(r.peer[q]) == 0, "ibv_destroy_qp (peer)");
    }
    CHECK(ibv_destroy_srq(r.srq) == 0, "ibv_destroy_srq");
    CHECK(ibv_destroy_cq(r.cq) == 0 && ibv_destroy_cq(r.peer_cq) == 0, "ibv_destroy_cq");
    CHECK(ibv_destroy_comp_channel(r.channel) == 0, "ibv_destroy_comp_channel");
}

/* The RDMA-CM rounds' shared state: the listener's and the clients' channels, and how many
 * clients the event thread saw connected. */
static struct rdma_event_channel *served, *asking;
static atomic_int established;
/* Any other event a client got (an error: UNREACHABLE, REJECTED, ...): the last one's type and
 * status, printed if the clients' connections do not all come up. */
static atomic_int client_failures, last_failure, last_failure_status;

static void *cm_events(void *arg) {
    (void)arg;
    struct rdma_event_channel *channels[2] = { served, asking };
    while (!atomic_load(&stop)) {
        for (int c = 0; c < 2; c++) {
            struct rdma_cm_event *event;
            if (!readable(channels[c]->fd) || rdma_get_cm_event(channels[c], &event) != 0)
                continue;
            struct rdma_cm_id *id = event->id;
            enum rdma_cm_event_type type = event->event;
            if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
                struct ibv_qp_init_attr attr = { .qp_type = IBV_QPT_RC,
                    .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
                             .max_recv_sge = 1 } };
                if (rdma_create_qp(id, NULL, &attr) == 0)
                    rdma_accept(id, NULL);
            } else if (type == RDMA_CM_EVENT_ESTABLISHED && c == 1) {
                atomic_fetch_add(&established, 1);
            } else if (c == 1 && type != RDMA_CM_EVENT_ADDR_RESOLVED &&
                       type != RDMA_CM_EVENT_ROUTE_RESOLVED && type != RDMA_CM_EVENT_DISCONNECTED) {
                atomic_store(&last_failure, type);
                atomic_store(&last_failure_status, event->status);
                atomic_fetch_add(&client_failures, 1);
            } else if (type == RDMA_CM_EVENT_DISCONNECTED && c == 0) {
                /* The server's side ends as its peer's ID is destroyed. */
                usleep(20);
            }
            rdma_ack_cm_event(event);
            atomic_fetch_add(&cm_events_taken, 1);
        }
    }
    return NULL;
}

static void cm_round(const char *server_addr, const char *client_addr, int port) {
    struct sockaddr_in server = { .sin_family = AF_INET, .sin_port = htons(port) };
    struct sockaddr_in from = { .sin_family = AF_INET };
    CHECK(inet_pton(AF_INET, server_addr, &server.sin_addr) == 1 &&
          inet_pton(AF_INET, client_addr, &from.sin_addr) == 1, "the addresses");
    struct rdma_cm_id *listener, *clients[CLIENTS];
    CHECK(rdma_create_id(served, &listener, NULL, RDMA_PS_TCP) == 0 &&
          rdma_bind_addr(listener, (struct sockaddr *)&server) == 0 &&
          rdma_listen(listener, CLIENTS) == 0, "the listener");
    atomic_store(&stop, 0);
    atomic_store(&established, 0);
    atomic_store(&client_failures, 0);
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, cm_events, NULL) == 0, "pthread_create");
    for (int c = 0; c < CLIENTS; c++) {
        CHECK(rdma_create_id(asking, &clients[c], NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
        CHECK(rdma_resolve_addr(clients[c], (struct sockaddr *)&from, (struct sockaddr *)&server,
                                2000) == 0, "rdma_resolve_addr");
    }
    /* Address and route resolved come on `asking`, which the event thread takes: the main
     * thread resolves and connects each client once its route is there (id->route.num_paths). */
    for (int c = 0; c < CLIENTS; c++) {
        while (!clients[c]->verbs)
            usleep(100);
        for (int tries = 0; rdma_resolve_route(clients[c], 2000) != 0; tries++) {
            CHECK(tries < 10000, "rdma_resolve_route");
            usleep(100);
        }
        while (clients[c]->route.num_paths == 0)
            usleep(100);
        struct ibv_qp_init_attr attr = { .qp_type = IBV_QPT_RC,
            .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
        struct rdma_conn_param param = { .retry_count = 3 };
        CHECK(rdma_create_qp(clients[c], NULL, &attr) == 0 &&
              rdma_connect(clients[c], &param) == 0, "rdma_connect");
    }
    for (int waited = 0; atomic_load(&established) < CLIENTS; waited++) {
        if (waited == 20000) {
            fprintf(stderr, "round on port %d: %d of %d clients connected; %d other events, the "
                    "last %s (status %d)\n", port, atomic_load(&established), CLIENTS,
                    atomic_load(&client_failures), rdma_event_str(atomic_load(&last_failure)),
                    atomic_load(&last_failure_status));
            CHECK(0, "the clients' connections");
        }
        usleep(1000);
    }
    /* Destroyed while the event thread takes their peers' (and maybe their own) events. */
    for (int c = 0; c < CLIENTS; c++) {
        rdma_destroy_qp(clients[c]);
        CHECK(rdma_destroy_id(clients[c]) == 0, "rdma_destroy_id (client)");
    }
    usleep(20000);
    atomic_store(&stop, 1);
    pthread_join(thread, NULL);
    CHECK(rdma_destroy_id(listener) == 0, "rdma_destroy_id (listener)");
}

int main(int argc, char **argv) {
    CHECK(argc == 4, "usage: stress ADDRESS0 ADDRESS1 ROUNDS");
    int rounds = atoi(argv[3]);
    srand(49);
    ctx0 = open_device(0);
    ctx1 = open_device(1);
    pd0 = ibv_alloc_pd(ctx0);
    pd1 = ibv_alloc_pd(ctx1);
    memory0 = calloc(1, 8192);
    memory1 = calloc(1, 8192);
    int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    mr0 = ibv_reg_mr(pd0, memory0, 8192, all);
    mr1 = ibv_reg_mr(pd1, memory1, 8192, all);
    CHECK(pd0 && pd1 && mr0 && mr1, "the PDs and regions");
    fcntl(ctx0->async_fd, F_SETFL, fcntl(ctx0->async_fd, F_GETFL) | O_NONBLOCK);
    for (int i = 0; i < rounds; i++)
        verbs_round();
    printf("verbs rounds: %d\n", rounds);
    printf("completions: %d, cq events: %d, asynchronous events: %d\n", polled > rounds,
           cq_events_taken > rounds, async_events_taken > 0);
    fprintf(stderr, "completions %ld, cq events %ld, asynchronous events %ld\n", (long)polled,
            (long)cq_events_taken, (long)async_events_taken);
    served = rdma_create_event_channel();
    asking = rdma_create_event_channel();
    CHECK(served && asking, "rdma_create_event_channel");
    fcntl(served->fd, F_SETFL, fcntl(served->fd, F_GETFL) | O_NONBLOCK);
    fcntl(asking->fd, F_SETFL, fcntl(asking->fd, F_GETFL) | O_NONBLOCK);
    for (int i = 0; i < rounds; i++)
        cm_round(argv[1], argv[2], 7400 + i);
    printf("cm rounds: %d, events: %d\n", rounds, cm_events_taken >= 4 * CLIENTS * rounds);
    fprintf(stderr, "cm events %ld\n", (long)cm_events_taken);
    rdma_destroy_event_channel(served);
    rdma_destroy_event_channel(asking);
    CHECK(ibv_dereg_mr(mr0) == 0 && ibv_dereg_mr(mr1) == 0, "ibv_dereg_mr");
    CHECK(ibv_dealloc_pd(pd0) == 0 && ibv_dealloc_pd(pd1) == 0, "ibv_dealloc_pd");
    CHECK(ibv_close_device(ctx0) == 0 && ibv_close_device(ctx1) == 0, "ibv_close_device");
    free(memory0);
    free(memory1);
    printf("done\n");
    return 0;
}
