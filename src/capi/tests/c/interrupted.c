/* A signal ends a wait for an event, as it ends rdma-core's read() of the event's descriptor
 * when the handler has no SA_RESTART: ibv_get_cq_event, ibv_get_async_event and
 * rdma_get_cm_event return -1 with EINTR. qperf ends a test's last wait with its alarm this
 * way; a library that waits on instead hangs the program. With SA_RESTART the wait goes on,
 * as the kernel restarts the read(): here until an event comes. Prints what each returned. */
#include <arpa/inet.h>
#include <pthread.h>
#include <time.h>
#include <rdma/rdma_cma.h>

static volatile sig_atomic_t alarms;
static void on_alarm(int signal) { (void)signal; alarms++; }

/* After 200 ms, an address resolution on the channel `arg`, whose event ends the wait. */
static void *resolve_later(void *arg) {
    alarm_elsewhere_after_a_pause();
    struct rdma_cm_id *id;
    struct sockaddr_in dst = { .sin_family = AF_INET };
    CHECK(inet_pton(AF_INET, getenv("SOFTROCE_ADDR"), &dst.sin_addr) == 1, "address");
    CHECK(rdma_create_id(arg, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000) == 0, "rdma_resolve_addr");
    return NULL;
}

int main(void) {
    catch_alarm(on_alarm, 0);

    struct ibv_context *ctx = open_device(0);
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq = armed_cq(ctx, &channel);
    struct ibv_cq *evented;
    void *context;
    alarm_in(50000);
    int ret = ibv_get_cq_event(channel, &evented, &context);
    printf("ibv_get_cq_event: %d %s, alarms %d\n", ret, ret ? strerror(errno) : "", alarms);

    struct ibv_async_event event;
    alarm_in(50000);
    ret = ibv_get_async_event(ctx, &event);
    printf("ibv_get_async_event: %d %s, alarms %d\n", ret, ret ? strerror(errno) : "", alarms);

    struct rdma_event_channel *cm = rdma_create_event_channel();
    CHECK(cm, "rdma_create_event_channel");
    struct rdma_cm_event *cm_event;
    alarm_in(50000);
    ret = rdma_get_cm_event(cm, &cm_event);
    printf("rdma_get_cm_event: %d %s, alarms %d\n", ret, ret ? strerror(errno) : "", alarms);

    catch_alarm(on_alarm, SA_RESTART);
    pthread_t later;
    CHECK(pthread_create(&later, NULL, resolve_later, cm) == 0, "pthread_create");
    alarm_in(50000);
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
