/* A signal ends a wait for an event, as it ends rdma-core's read() of the event's descriptor
 * when the handler has no SA_RESTART: ibv_get_cq_event, ibv_get_async_event and
 * rdma_get_cm_event return -1 with EINTR. qperf ends a test's last wait with its alarm this
 * way; a library that waits on instead hangs the program. With SA_RESTART the wait goes on,
 * as the kernel restarts the read(): here until an event comes. Prints what each returned. */
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <time.h>
#include <rdma/rdma_cma.h>

static volatile sig_atomic_t alarms;
static void on_alarm(int signal) { (void)signal; alarms++; }

/* Arms a one-shot alarm 50 ms from now. */
static void alarm_soon(void) {
    struct itimerval soon = { .it_value = { .tv_sec = 0, .tv_usec = 50000 } };
    CHECK(setitimer(ITIMER_REAL, &soon, NULL) == 0, "setitimer");
}

/* After 200 ms, an address resolution on the channel `arg`, whose event ends the wait. */
static void *resolve_later(void *arg) {
    sigset_t alarm_only;
    sigemptyset(&alarm_only);
    sigaddset(&alarm_only, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alarm_only, NULL); /* the alarm is the waiting thread's */
    struct timespec pause = { 0, 200 * 1000 * 1000 };
    nanosleep(&pause, NULL);
    struct rdma_cm_id *id;
    struct sockaddr_in dst = { .sin_family = AF_INET };
    CHECK(inet_pton(AF_INET, getenv("SOFTROCE_ADDR"), &dst.sin_addr) == 1, "address");
    CHECK(rdma_create_id(arg, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000) == 0, "rdma_resolve_addr");
    return NULL;
}

int main(void) {
    struct sigaction action = { .sa_handler = on_alarm, .sa_flags = 0 };
    sigemptyset(&action.sa_mask);
    CHECK(sigaction(SIGALRM, &action, NULL) == 0, "sigaction");

    struct ibv_context *ctx = open_device(0);
    struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
    CHECK(channel, "ibv_create_comp_channel");
    struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, channel, 0);
    CHECK(cq && ibv_req_notify_cq(cq, 0) == 0, "ibv_create_cq");
    struct ibv_cq *evented;
    void *context;
    alarm_soon();
    int ret = ibv_get_cq_event(channel, &evented, &context);
    printf("ibv_get_cq_event: %d %s, alarms %d\n", ret, ret ? strerror(errno) : "", alarms);

    struct ibv_async_event event;
    alarm_soon();
    ret = ibv_get_async_event(ctx, &event);
    printf("ibv_get_async_event: %d %s, alarms %d\n", ret, ret ? strerror(errno) : "", alarms);

    struct rdma_event_channel *cm = rdma_create_event_channel();
    CHECK(cm, "rdma_create_event_channel");
    struct rdma_cm_event *cm_event;
    alarm_soon();
    ret = rdma_get_cm_event(cm, &cm_event);
    printf("rdma_get_cm_event: %d %s, alarms %d\n", ret, ret ? strerror(errno) : "", alarms);

    struct sigaction restart = { .sa_handler = on_alarm, .sa_flags = SA_RESTART };
    sigemptyset(&restart.sa_mask);
    CHECK(sigaction(SIGALRM, &restart, NULL) == 0, "sigaction");
    pthread_t later;
    CHECK(pthread_create(&later, NULL, resolve_later, cm) == 0, "pthread_create");
    alarm_soon();
    ret = rdma_get_cm_event(cm, &cm_event);
    printf("restarted: %d %s, alarms %d\n", ret,
           ret ? strerror(errno) : rdma_event_str(cm_event->event), alarms);
    pthread_join(later, NULL);
    if (ret == 0)
        rdma_ack_cm_event(cm_event);

    /* The channel still works after the interrupted wait. */
    CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(channel) == 0, "destroys");
    printf("done\n");
    return 0;
}
