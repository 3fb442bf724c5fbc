/* A listener whose request is queued and unread, then moved to a second channel ("migrate")
 * or destroyed ("destroy"). Prints what it saw; the test reads it.
 * Usage: listener_moves migrate|destroy IP PORT */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static int readable(struct rdma_event_channel *ch, int ms) {
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    return poll(&p, 1, ms) == 1;
}

static struct rdma_cm_event *next(struct rdma_event_channel *ch) {
    struct rdma_cm_event *event;
    if (rdma_get_cm_event(ch, &event)) { perror("rdma_get_cm_event"); _exit(1); }
    return event;
}

int main(int argc, char **argv) {
    struct rdma_event_channel *first = rdma_create_event_channel();
    struct rdma_event_channel *second = rdma_create_event_channel();
    struct rdma_cm_id *listener;
    struct addrinfo *addr;
    if (argc != 4 || getaddrinfo(argv[2], argv[3], NULL, &addr)) { fprintf(stderr, "usage\n"); return 1; }
    if (rdma_create_id(first, &listener, NULL, RDMA_PS_TCP) || rdma_bind_addr(listener, addr->ai_addr)
        || rdma_listen(listener, 1)) { perror("listen"); return 1; }
    printf("listening\n");
    fflush(stdout);
    if (!readable(first, 30000)) { fprintf(stderr, "no request came\n"); return 1; }
    if (!strcmp(argv[1], "destroy")) {
        rdma_destroy_id(listener);
        printf("destroyed, the request unread\ndone\n");
        fflush(stdout);
        sleep(10); /* alive while the peer hears, or not: the test ends it */
        return 0;
    }
    if (rdma_migrate_id(listener, second)) { perror("rdma_migrate_id"); return 1; }
    struct rdma_cm_event *event = next(second);
    struct rdma_cm_id *child = event->id;
    printf("request on the second channel: %d, its id there: %d\n",
           event->event == RDMA_CM_EVENT_CONNECT_REQUEST, child->channel == second);
    fflush(stdout);
    rdma_ack_cm_event(event);
    struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
        .max_send_sge = 1, .max_recv_sge = 1 }, .qp_type = IBV_QPT_RC };
    struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
        .retry_count = 7, .rnr_retry_count = 7 };
    if (rdma_create_qp(child, NULL, &attr) || rdma_accept(child, &param)) { perror("accept"); return 1; }
    if (!readable(second, 10000)) { fprintf(stderr, "nothing more on the second channel\n"); return 1; }
    event = next(second);
    printf("then on the second channel: %s\n", rdma_event_str(event->event));
    fflush(stdout);
    rdma_ack_cm_event(event);
    rdma_disconnect(child);
    rdma_destroy_qp(child);
    rdma_destroy_id(child);
    rdma_destroy_id(listener);
    printf("done\n");
    return 0;
}
