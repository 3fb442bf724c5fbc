/* rping's teardown, its threads' interleavings made deterministic in one: the QP destroyed with
 * ibv_destroy_qp while the ID lives on (a QP made next may take its memory), a DISCONNECTED
 * event taken after that, and the ID destroyed while that event is held and read after. Run
 * with MALLOC_PERTURB_, so that freed memory reads as the perturb byte. Prints what it saw;
 * the test reads it. Usage: held_events SERVER_IP PORT */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type) {
    struct rdma_cm_event *event;
    if (rdma_get_cm_event(ch, &event)) { perror("rdma_get_cm_event"); exit(1); }
    if (event->event != type) {
        fprintf(stderr, "got %s, not %s\n", rdma_event_str(event->event), rdma_event_str(type));
        exit(1);
    }
    return event;
}

int main(int argc, char **argv) {
    static int marker;
    struct addrinfo *dst;
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id;
    struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
        .max_send_sge = 1, .max_recv_sge = 1 }, .qp_type = IBV_QPT_RC };
    struct rdma_conn_param param = { .retry_count = 7 };
    if (argc != 3 || getaddrinfo(argv[1], argv[2], NULL, &dst)) { fprintf(stderr, "usage\n"); return 1; }
    if (!ch || rdma_create_id(ch, &id, &marker, RDMA_PS_TCP)) { perror("rdma_create_id"); return 1; }
    if (rdma_resolve_addr(id, NULL, dst->ai_addr, 2000)) { perror("rdma_resolve_addr"); return 1; }
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(id, 2000)) { perror("rdma_resolve_route"); return 1; }
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    /* No CQs given: librdmacm makes them, with the ID as their context (rdma_verbs.h's
     * rdma_get_send_comp and rdma_get_recv_comp assert it). */
    if (rdma_create_qp(id, NULL, &attr)) { perror("rdma_create_qp"); return 1; }
    printf("cq context is the id: %d\n",
           id->send_cq->cq_context == id && id->recv_cq->cq_context == id);
    if (rdma_connect(id, &param)) { perror("rdma_connect"); return 1; }
    struct rdma_cm_event *established = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
    /* librdmacm sets id->event only in a synchronous ID's own calls: taking an asynchronous
     * ID's event writes nothing into the ID, which another thread may be in a call on. */
    printf("asynchronous id's event unset: %d\n", id->event == NULL);
    rdma_ack_cm_event(established);
    /* rping's client frees its QP with ibv_destroy_qp, not rdma_destroy_qp: id->qp dangles.
     * The next QP of the same size takes the same memory, in glibc, from this thread's cache. */
    struct ibv_qp *old = id->qp;
    if (ibv_destroy_qp(old)) { perror("ibv_destroy_qp"); return 1; }
    struct ibv_qp *fresh = ibv_create_qp(id->pd, &attr);
    if (!fresh) { perror("ibv_create_qp"); return 1; }
    printf("fresh qp at the old one's address: %d\n", fresh == old);
    /* The server disconnected at once: the event waits, and is taken now. */
    struct rdma_cm_event *event = expect(ch, RDMA_CM_EVENT_DISCONNECTED);
    printf("fresh qp state: %d\n", (int) fresh->state);
    ibv_destroy_qp(fresh);
    /* rping's main thread destroys the ID while its CM thread still holds this event. */
    if (rdma_destroy_id(id)) { perror("rdma_destroy_id"); return 1; }
    printf("held event's id context intact: %d\n", event->id == id && id->context == &marker);
    rdma_ack_cm_event(event);
    rdma_destroy_event_channel(ch);
    freeaddrinfo(dst);
    printf("done\n");
    return 0;
}
