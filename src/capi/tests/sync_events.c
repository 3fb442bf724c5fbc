/* Synchronous IDs (rdma_create_ep, no channel) and their id->event, which librdmacm sets to
 * the event each synchronous call waited for: the server reads the client's private data in
 * the request's id->event after rdma_get_request, the client the server's in the ESTABLISHED
 * event after rdma_connect. Prints what it saw; the test reads it.
 * Usage: sync_events server|client IP PORT */
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

/* Whether `event` is of `type` and carries `data` first in its private data. */
static int carries(struct rdma_cm_event *event, enum rdma_cm_event_type type, const char *data) {
    size_t n = strlen(data) + 1;
    return event && event->event == type && event->param.conn.private_data &&
           event->param.conn.private_data_len >= n &&
           memcmp(event->param.conn.private_data, data, n) == 0;
}

int main(int argc, char **argv) {
    struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
    struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
        .max_send_sge = 1, .max_recv_sge = 1 }, .qp_type = IBV_QPT_RC };
    struct rdma_cm_id *id, *listen;
    int server = argc == 4 && !strcmp(argv[1], "server");
    if (argc != 4) { fprintf(stderr, "usage\n"); return 1; }
    if (server)
        hints.ai_flags = RAI_PASSIVE;
    if (rdma_getaddrinfo(argv[2], argv[3], &hints, &res)) { perror("rdma_getaddrinfo"); return 1; }
    if (server) {
        if (rdma_create_ep(&listen, res, NULL, &attr)) { perror("rdma_create_ep"); return 1; }
        if (rdma_listen(listen, 1)) { perror("rdma_listen"); return 1; }
        if (rdma_get_request(listen, &id)) { perror("rdma_get_request"); return 1; }
        printf("request's event carries the client's data: %d\n",
               carries(id->event, RDMA_CM_EVENT_CONNECT_REQUEST, "hello"));
        struct rdma_conn_param param = { .private_data = "welcome", .private_data_len = 8 };
        if (rdma_accept(id, &param)) { perror("rdma_accept"); return 1; }
        printf("server's event: %s\n", id->event ? rdma_event_str(id->event->event) : "none");
        printf("server's qp state: %d\n", (int) id->qp->state);
        /* The client disconnects; the server's own disconnect then ends its side. */
        rdma_disconnect(id);
        rdma_destroy_ep(id);
        rdma_destroy_ep(listen);
    } else {
        if (rdma_create_ep(&id, res, NULL, &attr)) { perror("rdma_create_ep"); return 1; }
        /* rdma_create_ep resolved the address and the route, each a synchronous call. */
        printf("client's event before connecting: %s\n",
               id->event ? rdma_event_str(id->event->event) : "none");
        struct rdma_conn_param param = { .retry_count = 7, .private_data = "hello",
            .private_data_len = 6 };
        if (rdma_connect(id, &param)) { perror("rdma_connect"); return 1; }
        printf("established event carries the server's data: %d\n",
               carries(id->event, RDMA_CM_EVENT_ESTABLISHED, "welcome"));
        printf("client's qp state: %d\n", (int) id->qp->state);
        /* rsocket's raccept and rconnect ack id->event themselves and clear it. */
        rdma_ack_cm_event(id->event);
        id->event = NULL;
        rdma_disconnect(id);
        rdma_destroy_ep(id);
    }
    rdma_freeaddrinfo(res);
    printf("%s done\n", argv[1]);
    return 0;
}
