/* A device that fails while the program waits on it (issue 49: a failure of the library's
 * becomes one the program sees). Device 0's socket is replaced under the library, as a program
 * that closes a descriptor it does not own would: its next send fails, and the device stops.
 * Then each wait ends: ibv_get_async_event with IBV_EVENT_DEVICE_FATAL, ibv_get_cq_event with
 * EIO (as a read of rdma-core's channel after its device is gone), rdma_get_cm_event with
 * RDMA_CM_EVENT_DEVICE_REMOVAL for an ID on the device; every later call fails. Device 1 goes on.
 * Usage: device_fatal DEVICE0_ADDRESS. Prints what it saw. */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static struct side a, b;
static struct ibv_comp_channel *channel;
static struct rdma_event_channel *cm_channel;
static volatile pid_t waiting[3];
static char said[3][128];

static void *async_waiter(void *arg) {
    waiting[0] = (pid_t)syscall(SYS_gettid);
    struct ibv_async_event event;
    int ret = ibv_get_async_event(a.ctx, &event);
    snprintf(said[0], sizeof said[0], "async wait: %d, device fatal: %d", ret,
             ret == 0 && event.event_type == IBV_EVENT_DEVICE_FATAL);
    if (ret == 0)
        ibv_ack_async_event(&event);
    return arg;
}

static void *cq_waiter(void *arg) {
    waiting[1] = (pid_t)syscall(SYS_gettid);
    struct ibv_cq *cq;
    void *context;
    int ret = ibv_get_cq_event(channel, &cq, &context);
    snprintf(said[1], sizeof said[1], "cq wait: %d, EIO: %d", ret, ret == -1 && errno == EIO);
    return arg;
}

static void *cm_waiter(void *arg) {
    waiting[2] = (pid_t)syscall(SYS_gettid);
    struct rdma_cm_event *event;
    int ret = rdma_get_cm_event(cm_channel, &event);
    snprintf(said[2], sizeof said[2], "cm wait: %d, device removal: %d", ret,
             ret == 0 && event->event == RDMA_CM_EVENT_DEVICE_REMOVAL);
    if (ret == 0)
        rdma_ack_cm_event(event);
    return arg;
}

/* Whether waiter `which` sleeps in the kernel (state S), within 10 s. */
static int blocked(int which) {
    for (int i = 0; i < 10000; i++, usleep(1000)) {
        char path[64], stat[512];
        pid_t tid = waiting[which];
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
        FILE *f = tid ? fopen(path, "r") : NULL;
        if (!f)
            continue;
        size_t n = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[n] = 0;
        char *end = strrchr(stat, ')');
        if (end && end[1] == ' ' && end[2] == 'S')
            return 1;
    }
    return 0;
}

/* Replaces every UDP socket bound to `addr`:4791 with /dev/null; how many there were. */
static int break_sockets(const char *addr) {
    int replaced = 0, null = open("/dev/null", O_RDWR);
    DIR *dir = opendir("/proc/self/fd");
    struct dirent *entry;
    CHECK(null >= 0 && dir, "/dev/null and /proc/self/fd");
    while ((entry = readdir(dir))) {
        int fd = atoi(entry->d_name), type = 0;
        struct sockaddr_in sin;
        socklen_t len = sizeof sin, type_len = sizeof type;
        if (getsockname(fd, (struct sockaddr *)&sin, &len) == 0 && sin.sin_family == AF_INET &&
            ntohs(sin.sin_port) == 4791 && sin.sin_addr.s_addr == inet_addr(addr) &&
            getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_DGRAM) {
            CHECK(dup2(null, fd) == fd, "dup2");
            replaced++;
        }
    }
    closedir(dir);
    close(null);
    return replaced;
}

int main(int argc, char **argv) {
    static char buf[64];
    CHECK(argc == 2, "usage: device_fatal DEVICE0_ADDRESS");
    connect_pair(&a, &b);
    channel = ibv_create_comp_channel(a.ctx);
    struct ibv_cq *watched = channel ? ibv_create_cq(a.ctx, 4, NULL, channel, 0) : NULL;
    CHECK(watched && ibv_req_notify_cq(watched, 0) == 0, "a CQ on a channel");
    struct rdma_cm_id *listener;
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(7320) };
    CHECK(inet_pton(AF_INET, argv[1], &sin.sin_addr) == 1, "the address");
    cm_channel = rdma_create_event_channel();
    CHECK(cm_channel && rdma_create_id(cm_channel, &listener, NULL, RDMA_PS_TCP) == 0 &&
          rdma_bind_addr(listener, (struct sockaddr *)&sin) == 0 && rdma_listen(listener, 1) == 0,
          "a listening ID on device 0");
    struct ibv_mr *mr = ibv_reg_mr(a.pd, buf, sizeof buf, 0);
    CHECK(mr, "ibv_reg_mr");

    pthread_t threads[3];
    void *(*waiters[3])(void *) = { async_waiter, cq_waiter, cm_waiter };
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&threads[i], NULL, waiters[i], NULL) == 0, "pthread_create");
    for (int i = 0; i < 3; i++)
        if (!blocked(i)) {
            fprintf(stderr, "waiter %d never blocked: %s\n", i, said[i]);
            return 1;
        }

    printf("sockets replaced: %d\n", break_sockets(argv[1]) > 0);
    /* The send that finds the socket gone. */
    struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
    struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED }, *bad;
    CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "ibv_post_send");
    for (int i = 0; i < 3; i++) {
        pthread_join(threads[i], NULL);
        printf("%s\n", said[i]);
    }
    struct ibv_wc wc;
    int n;
    while ((n = ibv_poll_cq(a.cq, 1, &wc)) == 1)
        ;
    printf("poll after the failure: %d\n", n);
    bad = NULL;
    int refused = ibv_post_send(a.qp, &wr, &bad);
    printf("post after the failure refused: %d, bad_wr %d\n", refused != 0,
           bad == &wr);
    struct ibv_cq *cq;
    void *context;
    int ret = ibv_get_cq_event(channel, &cq, &context);
    printf("a later cq wait: %d, EIO: %d\n", ret, ret == -1 && errno == EIO);
    /* The region is the program's again: a failed device's engines hold it no more. */
    printf("dereg after the failure: %d\n", ibv_dereg_mr(mr));
    /* Device 1 is another device: it goes on. */
    struct ibv_pd *pd = ibv_alloc_pd(b.ctx);
    printf("the other device works: %d\n", pd && ibv_dealloc_pd(pd) == 0);
    printf("done\n");
    return 0;
}
