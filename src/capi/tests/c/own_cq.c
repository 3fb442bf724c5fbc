/* rdma_create_qp with a CQ of the program's own (defect 1 of issue 49): librdmacm makes only
 * the CQ the attributes lack and names only that one in the ID, and rdma_destroy_qp destroys
 * only what it made; the program's CQ lives on, and is the program's to destroy. A PD of
 * another context than the ID's is refused (EINVAL), as librdmacm refuses it.
 * Usage: own_cq ADDRESS (the device's). Prints what it saw. */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: own_cq ADDRESS");
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id;
    CHECK(ch && rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in sin = { .sin_family = AF_INET };
    CHECK(inet_pton(AF_INET, argv[1], &sin.sin_addr) == 1, "the address");
    CHECK(rdma_bind_addr(id, (struct sockaddr *)&sin) == 0 && id->verbs, "rdma_bind_addr");
    struct ibv_cq *mine = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
    CHECK(mine, "ibv_create_cq");
    struct ibv_qp_init_attr attr = { .send_cq = mine, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 } };
    CHECK(rdma_create_qp(id, NULL, &attr) == 0, "rdma_create_qp");
    printf("the id names only the cq librdmacm made: %d\n",
           id->send_cq == NULL && id->recv_cq != NULL && id->recv_cq != mine &&
           id->qp->send_cq == mine && id->qp->recv_cq == id->recv_cq);
    rdma_destroy_qp(id);
    struct ibv_wc wc;
    printf("own cq polls after rdma_destroy_qp: %d\n", ibv_poll_cq(mine, 1, &wc) == 0);
    printf("own cq destroyed by the program: %d\n", ibv_destroy_cq(mine) == 0);

    /* A PD of a context the program opened itself, not the ID's. */
    struct ibv_context *other = ibv_open_device(id->verbs->device);
    struct ibv_pd *pd = other ? ibv_alloc_pd(other) : NULL;
    CHECK(pd, "a PD of another context");
    struct ibv_qp_init_attr again = { .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 } };
    int ret = rdma_create_qp(id, pd, &again);
    printf("pd of another context: %d %s, no qp: %d\n", ret, errno == EINVAL ? "EINVAL" : "other",
           id->qp == NULL);
    CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(other) == 0, "closing the other context");
    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    rdma_destroy_event_channel(ch);
    printf("done\n");
    return 0;
}
