/* A child after fork() never runs its parent's engine (defect 3 of issue 49): with inline
 * progress, a SEND's datagram waits on the parent's socket until the parent next calls in.
 * The child calls the parent's QP (refused at once: it is not the child's) and exits (the
 * library's exit handler does nothing in a child); neither takes the datagram, so the parent's
 * first poll completes its receive. The child may open a device of its own and use it.
 * Run with three addresses in SOFTROCE_ADDR and SOFTROCE_PROGRESS=inline. Prints what it saw. */
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    static char sent[64] = "across the fork", received[64];
    struct side a, b;
    connect_pair(&a, &b);
    struct ibv_mr *into = ibv_reg_mr(a.pd, received, sizeof received, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *from = ibv_reg_mr(b.pd, sent, sizeof sent, 0);
    CHECK(into && from, "ibv_reg_mr");
    struct ibv_sge sge = { .addr = (uintptr_t)received, .length = sizeof received,
                           .lkey = into->lkey };
    struct ibv_recv_wr recv = { .wr_id = 5, .sg_list = &sge, .num_sge = 1 }, *bad_recv;
    CHECK(ibv_post_recv(a.qp, &recv, &bad_recv) == 0, "ibv_post_recv");
    /* Inline progress: the SEND leaves within the call, and waits on a's socket. */
    struct ibv_sge out = { .addr = (uintptr_t)sent, .length = sizeof sent, .lkey = from->lkey };
    struct ibv_send_wr send = { .wr_id = 6, .sg_list = &out, .num_sge = 1,
                                .opcode = IBV_WR_SEND }, *bad_send;
    CHECK(ibv_post_send(b.qp, &send, &bad_send) == 0, "ibv_post_send");

    pid_t child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0) {
        struct ibv_qp_attr attr;
        struct ibv_qp_init_attr init;
        errno = 0;
        int ret = ibv_query_qp(a.qp, &attr, IBV_QP_STATE, &init);
        printf("child: the parent's qp refused: %d\n", ret != 0);
        struct ibv_context *own = open_device(2);
        struct ibv_cq *cq = ibv_create_cq(own, 4, NULL, NULL, 0);
        struct ibv_wc wc;
        printf("child: a device of its own works: %d\n",
               cq && ibv_poll_cq(cq, 1, &wc) == 0 && ibv_destroy_cq(cq) == 0 &&
               ibv_close_device(own) == 0);
        exit(0);
    }
    int status;
    CHECK(waitpid(child, &status, 0) == child, "waitpid");
    printf("child exited: %d\n", WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct ibv_wc wc;
    int n = ibv_poll_cq(a.cq, 1, &wc);
    printf("the parent's first poll completes its receive: %d\n",
           n == 1 && wc.wr_id == 5 && wc.status == IBV_WC_SUCCESS &&
           strcmp(received, "across the fork") == 0);
    printf("done\n");
    return 0;
}
