/* No panic crosses into C (defect 5 of issue 49): with SIGPIPE ignored and standard error a
 * pipe whose reader has gone, every call that says something on standard error still returns
 * its own answer (EOPNOTSUPP for what softroce lacks, EINVAL for a GID index it lacks), and
 * the process lives on. The test closes the pipe, then writes the line this reads first. */
#include <dlfcn.h>
#include <signal.h>
#include <rdma/rdma_cma.h>

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    char line[8];
    CHECK(fgets(line, sizeof line, stdin), "the go-ahead on stdin");
    struct side s;
    open_side(0, &s);
    printf("resize: %s\n", ibv_resize_cq(s.cq, 8) == EOPNOTSUPP ? "EOPNOTSUPP" : "other");
    union ibv_gid gid;
    memset(&gid, 0, sizeof gid);
    printf("attach: %s\n", ibv_attach_mcast(s.qp, &gid, 0) == EOPNOTSUPP ? "EOPNOTSUPP" : "other");
    printf("detach: %s\n", ibv_detach_mcast(s.qp, &gid, 0) == EOPNOTSUPP ? "EOPNOTSUPP" : "other");
    int ret = ibv_query_gid(s.ctx, 1, 1, &gid);
    printf("gid index 1: %d %s\n", ret, errno == EINVAL ? "EINVAL" : "other");
    struct rdma_cm_id *id;
    CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in group = { .sin_family = AF_INET };
    ret = rdma_join_multicast(id, (struct sockaddr *)&group, NULL);
    printf("join: %d %s\n", ret, errno == EOPNOTSUPP ? "EOPNOTSUPP" : "other");
    ret = rdma_leave_multicast(id, (struct sockaddr *)&group);
    printf("leave: %d %s\n", ret, errno == EOPNOTSUPP ? "EOPNOTSUPP" : "other");
    /* A provider's entry point, which only a vendor library would reach. */
    int (*provider)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "ibv_cmd_alloc_pd");
    CHECK(provider, "dlsym ibv_cmd_alloc_pd");
    printf("provider: %s\n", provider() == EOPNOTSUPP ? "EOPNOTSUPP" : "other");
    printf("alive\n");
    return 0;
}
