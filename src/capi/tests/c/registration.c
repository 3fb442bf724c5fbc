/* Registration refuses what the kernel's pin refuses (defect 2 of issue 49): memory not mapped,
 * or without the rights the region grants, answers EFAULT, as rdma-core's ibv_reg_mr does;
 * read-only memory registered for reading only is taken. Before, all of it was taken, and a
 * peer's WRITE into read-only memory killed the process (SIGSEGV on the engine's thread): the
 * last part shows the peer's WRITE into a read-only region refused at registration instead.
 * Prints what it saw. */
#include <sys/mman.h>
#include <unistd.h>

static const char *outcome(struct ibv_mr *mr) {
    if (mr) {
        ibv_dereg_mr(mr);
        return "registered";
    }
    return errno == EFAULT ? "EFAULT" : errno == EOPNOTSUPP ? "EOPNOTSUPP" : strerror(errno);
}

int main(void) {
    static char data[8192];
    char stack[100];
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct side a, b;
    connect_pair(&a, &b);
    char *read_only = mmap(NULL, 2 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *no_rights = mmap(NULL, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *holed = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *gone = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(read_only != MAP_FAILED && no_rights != MAP_FAILED && holed != MAP_FAILED &&
          gone != MAP_FAILED, "mmap");
    CHECK(munmap(holed + page, page) == 0 && munmap(gone, page) == 0, "munmap");
    int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    printf("static, for writing: %s\n", outcome(ibv_reg_mr(a.pd, data, sizeof data, rw)));
    printf("stack, for writing: %s\n", outcome(ibv_reg_mr(a.pd, stack, sizeof stack, rw)));
    printf("read-only, for remote writes: %s\n",
           outcome(ibv_reg_mr(a.pd, read_only, page, rw)));
    printf("read-only, for local writes: %s\n",
           outcome(ibv_reg_mr(a.pd, read_only + 8, 16, IBV_ACCESS_LOCAL_WRITE)));
    printf("read-only, for windows: %s\n",
           outcome(ibv_reg_mr(a.pd, read_only, page, IBV_ACCESS_MW_BIND)));
    printf("read-only, for remote reads: %s\n",
           outcome(ibv_reg_mr(a.pd, read_only, 2 * page, IBV_ACCESS_REMOTE_READ)));
    printf("no rights: %s\n", outcome(ibv_reg_mr(a.pd, no_rights, page, 0)));
    printf("a page unmapped inside: %s\n", outcome(ibv_reg_mr(a.pd, holed, 3 * page, 0)));
    printf("unmapped: %s\n", outcome(ibv_reg_mr(a.pd, gone, page, 0)));
    printf("on demand: %s\n", outcome(ibv_reg_mr(a.pd, data, sizeof data,
                                                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND)));

    /* The peer's READ of the read-only region it may read works, and its WRITE, which the
     * region does not grant, is refused as any access without the right is. */
    struct ibv_mr *readable = ibv_reg_mr(a.pd, read_only, page, IBV_ACCESS_REMOTE_READ);
    struct ibv_mr *landing = ibv_reg_mr(b.pd, data, sizeof data, IBV_ACCESS_LOCAL_WRITE);
    CHECK(readable && landing, "the regions of the peer's accesses");
    enum ibv_wc_status read = post_one(&b, IBV_WR_RDMA_READ, data, 64, landing->lkey,
                                       (uintptr_t)read_only, readable->rkey);
    enum ibv_wc_status write = post_one(&b, IBV_WR_RDMA_WRITE, data, 64, landing->lkey,
                                        (uintptr_t)read_only, readable->rkey);
    printf("peer reads: %d, peer's write refused: %d\n", read == IBV_WC_SUCCESS,
           write == IBV_WC_REM_ACCESS_ERR);
    printf("done\n");
    return 0;
}
