/* A QP destroyed while its connection lives on (one of issue 49's suspected defects): rping's
 * client frees its QP with ibv_destroy_qp and keeps the ID, whose connection held the QP in the
 * engine, in RTS, taking the peer's WRITEs into the program's registered memory after the
 * destroy. Now the destroy takes it out of the engine: the peer's next WRITE reaches nothing and
 * fails at the peer (its retries run out), and the memory keeps what it had.
 * Device 0 serves, device 1 connects. Usage: destroyed_qp SERVER_ADDRESS CLIENT_ADDRESS */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type) {
    struct rdma_cm_event *event;
    CHECK(rdma_get_cm_event(ch, &event) == 0, "rdma_get_cm_event");
    if (event->event != type) {
        fprintf(stderr, "got %s (status %d), not %s\n", rdma_event_str(event->event),
                event->status, rdma_event_str(type));
        exit(1);
    }
    return event;
}

static struct sockaddr_in at(const char *addr, int port) {
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
    CHECK(inet_pton(AF_INET, addr, &sin.sin_addr) == 1, "the address");
    return sin;
}

int main(int argc, char **argv) {
    static char target[64] = "untouched", source[64];
    CHECK(argc == 3, "usage: destroyed_qp SERVER_ADDRESS CLIENT_ADDRESS");
    struct rdma_event_channel *sch = rdma_create_event_channel();
    struct rdma_event_channel *cch = rdma_create_event_channel();
    struct rdma_cm_id *listen_id, *client, *served;
    CHECK(sch && cch && rdma_create_id(sch, &listen_id, NULL, RDMA_PS_TCP) == 0 &&
          rdma_create_id(cch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in server = at(argv[1], 7310), from = at(argv[2], 0);
    CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&server) == 0, "rdma_bind_addr");
    CHECK(rdma_listen(listen_id, 1) == 0, "rdma_listen");
    CHECK(rdma_resolve_addr(client, (struct sockaddr *)&from, (struct sockaddr *)&server,
                            2000) == 0, "rdma_resolve_addr");
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
    CHECK(rdma_resolve_route(client, 2000) == 0, "rdma_resolve_route");
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    struct ibv_qp_init_attr attr = { .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
    CHECK(rdma_create_qp(client, NULL, &attr) == 0, "rdma_create_qp (client)");
    struct rdma_conn_param param = { .retry_count = 2, .rnr_retry_count = 7 };
    CHECK(rdma_connect(client, &param) == 0, "rdma_connect");
    struct rdma_cm_event *request = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    served = request->id;
    rdma_ack_cm_event(request);
    /* A fresh copy: rdma_create_qp wrote the client's CQs into `attr`. */
    struct ibv_qp_init_attr served_attr = { .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
    CHECK(rdma_create_qp(served, NULL, &served_attr) == 0, "rdma_create_qp (server)");
    CHECK(rdma_accept(served, &param) == 0, "rdma_accept");
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ESTABLISHED));
    rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ESTABLISHED));

    struct ibv_mr *into = ibv_reg_mr(served->pd, target, sizeof target,
                                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_mr *out = ibv_reg_mr(client->pd, source, sizeof source, 0);
    CHECK(into && out, "ibv_reg_mr");
    struct side peer = { .ctx = client->verbs, .pd = client->pd, .cq = client->send_cq,
                         .qp = client->qp };
    strcpy(source, "first");
    enum ibv_wc_status first = post_one(&peer, IBV_WR_RDMA_WRITE, source, 16, out->lkey,
                                        (uintptr_t)target, into->rkey);
    printf("write before the destroy: %d\n", first == IBV_WC_SUCCESS &&
                                              strcmp(target, "first") == 0);

    /* As rping's client: the QP goes, the ID and its connection stay. */
    CHECK(ibv_destroy_qp(served->qp) == 0, "ibv_destroy_qp");
    strcpy(source, "second");
    enum ibv_wc_status second = post_one(&peer, IBV_WR_RDMA_WRITE, source, 16, out->lkey,
                                         (uintptr_t)target, into->rkey);
    printf("write after the destroy reaches nothing: %d (status %d)\n",
           second == IBV_WC_RETRY_EXC_ERR && strcmp(target, "first") == 0, second);

    CHECK(ibv_dereg_mr(into) == 0 && ibv_dereg_mr(out) == 0, "ibv_dereg_mr");
    rdma_destroy_qp(client);
    CHECK(rdma_destroy_id(client) == 0 && rdma_destroy_id(served) == 0 &&
          rdma_destroy_id(listen_id) == 0, "rdma_destroy_id");
    printf("done\n");
    return 0;
}
