/* rdma_listen's backlog (defect 4 of issue 49): a listener whose program does not read its
 * events keeps at most `backlog` requests unread, as the kernel's ucma does. A SIDR request
 * beyond it is refused (the client sees UNREACHABLE, SIDR status 2); a REQ beyond it is let go
 * unanswered, to be sent again (the library says so on standard error, once per listener).
 * Device 0 serves, device 1's IDs ask. After 10 SIDR requests and 5 REQs, each listener of
 * backlog 4 holds 4. The RC count waits for the test's go-ahead on stdin, which comes once the
 * line about port 7300 has been printed: the fifth REQ was handled then.
 * Usage: backlog SERVER_ADDRESS. Prints what it saw. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#define BACKLOG 4
#define SIDR_CLIENTS 10
#define RC_CLIENTS 5

static struct rdma_cm_id *listener(struct rdma_event_channel *ch, const char *addr, int port,
                                   enum rdma_port_space ps) {
    struct rdma_cm_id *id;
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
    CHECK(inet_pton(AF_INET, addr, &sin.sin_addr) == 1, "the address");
    CHECK(rdma_create_id(ch, &id, NULL, ps) == 0, "rdma_create_id");
    CHECK(rdma_bind_addr(id, (struct sockaddr *)&sin) == 0, "rdma_bind_addr");
    CHECK(rdma_listen(id, BACKLOG) == 0, "rdma_listen");
    return id;
}

/* Starts `n` clients of port space `ps` towards `addr:port`; returns them. */
static struct rdma_cm_id **clients(struct rdma_event_channel *ch, int n, const char *addr,
                                   int port, enum rdma_port_space ps) {
    struct rdma_cm_id **ids = calloc(n, sizeof *ids);
    struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(port) };
    CHECK(inet_pton(AF_INET, addr, &dst.sin_addr) == 1, "the address");
    for (int i = 0; i < n; i++) {
        CHECK(rdma_create_id(ch, &ids[i], NULL, ps) == 0, "rdma_create_id");
        CHECK(rdma_resolve_addr(ids[i], NULL, (struct sockaddr *)&dst, 2000) == 0,
              "rdma_resolve_addr");
    }
    return ids;
}

/* Drives the clients' events (address and route resolved, then connect) until `refused`
 * UNREACHABLE events have come. */
static void until_refused(struct rdma_event_channel *ch, int refused) {
    struct rdma_cm_event *event;
    struct ibv_qp_init_attr attr = { .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct rdma_conn_param param = { .retry_count = 7 };
    while (refused > 0) {
        CHECK(rdma_get_cm_event(ch, &event) == 0, "rdma_get_cm_event (clients)");
        struct rdma_cm_id *id = event->id;
        enum rdma_cm_event_type type = event->event;
        int status = event->status;
        rdma_ack_cm_event(event);
        if (type == RDMA_CM_EVENT_ADDR_RESOLVED) {
            CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
        } else if (type == RDMA_CM_EVENT_ROUTE_RESOLVED) {
            if (id->ps == RDMA_PS_TCP)
                CHECK(rdma_create_qp(id, NULL, &attr) == 0, "rdma_create_qp");
            CHECK(rdma_connect(id, &param) == 0, "rdma_connect");
            if (id->ps == RDMA_PS_TCP)
                refused--; /* the REQs are counted as sent */
        } else if (type == RDMA_CM_EVENT_UNREACHABLE && status == 2) {
            refused--;
        } else if (type == RDMA_CM_EVENT_UNREACHABLE && status == -ETIMEDOUT) {
            /* A queued SIDR request that no one answered, given up on. */
        } else {
            fprintf(stderr, "unexpected: %s (status %d)\n", rdma_event_str(type), status);
            exit(1);
        }
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: backlog SERVER_ADDRESS");
    struct rdma_event_channel *served = rdma_create_event_channel();
    struct rdma_event_channel *asking = rdma_create_event_channel();
    CHECK(served && asking, "rdma_create_event_channel");
    struct rdma_cm_id *sidr = listener(served, argv[1], 7301, RDMA_PS_UDP);
    struct rdma_cm_id *rc = listener(served, argv[1], 7300, RDMA_PS_TCP);

    struct rdma_cm_id **ud = clients(asking, SIDR_CLIENTS, argv[1], 7301, RDMA_PS_UDP);
    until_refused(asking, SIDR_CLIENTS - BACKLOG);
    printf("sidr refused beyond the backlog: %d\n", SIDR_CLIENTS - BACKLOG);

    struct rdma_cm_id **req = clients(asking, RC_CLIENTS, argv[1], 7300, RDMA_PS_TCP);
    until_refused(asking, RC_CLIENTS);
    char line[8];
    CHECK(fgets(line, sizeof line, stdin), "the go-ahead on stdin");
    int sidr_waiting = 0, rc_waiting = 0;
    struct rdma_cm_event *event;
    fcntl(served->fd, F_SETFL, fcntl(served->fd, F_GETFL) | O_NONBLOCK);
    while (rdma_get_cm_event(served, &event) == 0) {
        sidr_waiting += event->listen_id == sidr;
        rc_waiting += event->listen_id == rc;
        struct rdma_cm_id *request = event->id;
        rdma_ack_cm_event(event);
        rdma_destroy_id(request);
    }
    CHECK(errno == EAGAIN, "draining the listeners' channel");
    printf("sidr requests waiting: %d\n", sidr_waiting);
    printf("rc requests waiting: %d\n", rc_waiting);

    for (int i = 0; i < SIDR_CLIENTS; i++)
        rdma_destroy_id(ud[i]);
    for (int i = 0; i < RC_CLIENTS; i++) {
        rdma_destroy_qp(req[i]);
        rdma_destroy_id(req[i]);
    }
    rdma_destroy_id(sidr);
    rdma_destroy_id(rc);
    printf("done\n");
    return 0;
}
