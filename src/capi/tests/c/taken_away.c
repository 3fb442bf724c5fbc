/* Memory a program takes away after registering it (issue 49, defect 2's second half): the
 * kernel's pin would leave the NIC the old pages; softroce reaches the program's memory
 * itself, and a peer's WRITE into unmapped memory killed the process. Now each access fails
 * instead, as an access no key grants: the peer's WRITE, READ and atomic into a region whose
 * pages were unmapped, and its WRITE into one made read-only, end in remote access errors;
 * the program's own SEND out of unmapped memory carries zeros. The process lives on.
 * With an argument, the program first blocks every signal, as daemons do before they start
 * threads, which inherit the mask: the library's engine threads (thread progress) must still
 * take the faults they recover from. Prints what it saw. */
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    static char landing[4096];
    (void)argv;
    if (argc > 1) {
        sigset_t all;
        sigfillset(&all);
        CHECK(pthread_sigmask(SIG_BLOCK, &all, NULL) == 0, "pthread_sigmask");
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct side a, b;
    int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
              IBV_ACCESS_REMOTE_ATOMIC;
    const char *ops[3] = { "write", "read", "atomic" };
    enum ibv_wr_opcode opcodes[3] = { IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ,
                                      IBV_WR_ATOMIC_FETCH_AND_ADD };
    for (int op = 0; op < 3; op++) {
        connect_pair(&a, &b); /* afresh: the last pair ended in error */
        char *memory = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
        struct ibv_mr *mr = ibv_reg_mr(a.pd, memory, page, all);
        struct ibv_mr *into = ibv_reg_mr(b.pd, landing, sizeof landing, IBV_ACCESS_LOCAL_WRITE);
        CHECK(memory != MAP_FAILED && mr && into, "the regions");
        CHECK(munmap(memory, page) == 0, "munmap");
        uint32_t len = op == 2 ? 8 : 64;
        struct ibv_sge sge = { .addr = (uintptr_t)landing, .length = len, .lkey = into->lkey };
        struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
                                  .opcode = opcodes[op], .send_flags = IBV_SEND_SIGNALED }, *bad;
        if (op == 2) {
            wr.wr.atomic.remote_addr = (uintptr_t)memory;
            wr.wr.atomic.rkey = mr->rkey;
            wr.wr.atomic.compare_add = 1;
        } else {
            wr.wr.rdma.remote_addr = (uintptr_t)memory;
            wr.wr.rdma.rkey = mr->rkey;
        }
        CHECK(ibv_post_send(b.qp, &wr, &bad) == 0, "ibv_post_send");
        struct ibv_wc wc = next_wc(b.cq);
        printf("peer's %s into unmapped memory: %s\n", ops[op],
               wc.status == IBV_WC_REM_ACCESS_ERR ? "remote access error"
                                                  : ibv_wc_status_str(wc.status));
        CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr of the unmapped region");
    }

    connect_pair(&a, &b); /* afresh: the last pair ended in error */
    char *protected = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
    struct ibv_mr *mr = ibv_reg_mr(a.pd, protected, page, all);
    struct ibv_mr *from = ibv_reg_mr(b.pd, landing, sizeof landing, IBV_ACCESS_LOCAL_WRITE);
    CHECK(protected != MAP_FAILED && mr && from, "the regions");
    protected[0] = 'x';
    CHECK(mprotect(protected, page, PROT_READ) == 0, "mprotect");
    enum ibv_wc_status status = post_one(&b, IBV_WR_RDMA_WRITE, landing, 64, from->lkey,
                                         (uintptr_t)protected, mr->rkey);
    printf("peer's write into memory made read-only: %s, memory as it was: %d\n",
           status == IBV_WC_REM_ACCESS_ERR ? "remote access error" : ibv_wc_status_str(status),
           protected[0] == 'x');

    /* The program's own SEND out of memory it unmapped after registering it: its payload is
     * read as its packet is built, and what cannot be read is sent as zeros (a NIC would send
     * what the pinned pages held). */
    connect_pair(&a, &b); /* afresh: the last pair ended in error */
    char *source = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(source, 'y', 64);
    struct ibv_mr *out = ibv_reg_mr(a.pd, source, page, 0);
    struct ibv_mr *in = ibv_reg_mr(b.pd, landing, sizeof landing, IBV_ACCESS_LOCAL_WRITE);
    CHECK(source != MAP_FAILED && out && in, "the regions");
    struct ibv_sge rsge = { .addr = (uintptr_t)landing, .length = 64, .lkey = in->lkey };
    struct ibv_recv_wr recv = { .wr_id = 2, .sg_list = &rsge, .num_sge = 1 }, *bad_recv;
    CHECK(ibv_post_recv(b.qp, &recv, &bad_recv) == 0, "ibv_post_recv");
    memset(landing, 'z', 64);
    CHECK(munmap(source, page) == 0, "munmap");
    status = post_one(&a, IBV_WR_SEND, source, 64, out->lkey, 0, 0);
    struct ibv_wc wc = next_wc(b.cq);
    int zeros = 1;
    for (int i = 0; i < 64; i++)
        zeros &= landing[i] == 0;
    printf("send out of unmapped memory: %s, received: %s\n",
           status == IBV_WC_SUCCESS ? "sent" : ibv_wc_status_str(status),
           wc.status == IBV_WC_SUCCESS && zeros ? "zeros" : "other");
    printf("alive\n");
    return 0;
}
