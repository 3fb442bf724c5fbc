/* A thread that waits for an event is cancelled, as a thread in rdma-core's read() of the
 * event's descriptor is: rping cancels its CQ thread so when a connection fails. Each of
 * ibv_get_cq_event, ibv_get_async_event and rdma_get_cm_event waits in a thread of its own,
 * which is cancelled and joined; then the process goes on with what the cancelled wait used:
 * the CQ's channel gives the next event (a flushed receive), the engine runs (the wait for it
 * ran the engine, with hybrid progress), and the CM channel gives an address resolution's.
 * And a cancellation pending as a thread calls the library's other calls, none of which is a
 * cancellation point in rdma-core, waits for the thread's next cancellation point: a poll (which
 * runs the engine's turn, and its system calls, with inline or hybrid progress) and a device's
 * opening and closing (which read files). The cleanup handlers of a cancelled wait run with the
 * thread's own signal mask, though the wait held its signals off (hybrid progress). And a
 * signal's handler may wait too while a wait is under way. Prints what each step saw. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <time.h>
#include <rdma/rdma_cma.h>

struct wait {
    const char *what;
    struct ibv_comp_channel *channel;
    struct ibv_context *ctx;
    struct rdma_event_channel *cm;
    int cleaned; /* set by the waiting thread's cleanup handler */
    int alarm_blocked; /* whether SIGALRM was blocked as it ran */
};

static void cleanup(void *arg) {
    struct wait *w = arg;
    sigset_t now;
    pthread_sigmask(SIG_SETMASK, NULL, &now);
    w->alarm_blocked = sigismember(&now, SIGALRM);
    w->cleaned = 1;
}

static void *waiter(void *arg) {
    struct wait *w = arg;
    int ret;
    pthread_cleanup_push(cleanup, w);
    if (w->channel) {
        struct ibv_cq *cq;
        void *context;
        ret = ibv_get_cq_event(w->channel, &cq, &context);
    } else if (w->ctx) {
        struct ibv_async_event event;
        ret = ibv_get_async_event(w->ctx, &event);
    } else {
        struct rdma_cm_event *event;
        ret = rdma_get_cm_event(w->cm, &event);
    }
    printf("%s returned %d: not cancelled\n", w->what, ret);
    pthread_cleanup_pop(0);
    return NULL;
}

/* Starts a thread in `w`'s wait, cancels it once it waits, joins it. */
static void cancel_in_wait(struct wait *w) {
    pthread_t thread;
    void *result;
    CHECK(pthread_create(&thread, NULL, waiter, w) == 0, "pthread_create");
    struct timespec pause = { 0, 300 * 1000 * 1000 };
    nanosleep(&pause, NULL);
    CHECK(pthread_cancel(thread) == 0, "pthread_cancel");
    CHECK(pthread_join(thread, &result) == 0, "pthread_join");
    printf("%s: %s, cleanup %d, alarm blocked %d\n", w->what,
           result == PTHREAD_CANCELED ? "cancelled" : "not cancelled", w->cleaned,
           w->alarm_blocked);
}

/* A handler's wait, on a channel made non-blocking, and what it returned. */
static struct ibv_comp_channel *handlers_channel;
static volatile int handlers_wait = 1, handlers_errno;
static void wait_in_handler(int signal) {
    (void)signal;
    struct ibv_cq *cq;
    void *context;
    handlers_wait = ibv_get_cq_event(handlers_channel, &cq, &context);
    handlers_errno = errno;
}

/* The calls made with a cancellation pending, and what they returned. */
static struct {
    sem_t ready, cancelled;
    struct ibv_cq *cq;
    int polled, closed;
} pending;

static void *call_with_cancellation_pending(void *arg) {
    (void)arg;
    int state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
    sem_post(&pending.ready);
    sem_wait(&pending.cancelled);
    /* The cancellation, pending, is taken at the next cancellation point. */
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &state);
    struct ibv_wc wc;
    for (int i = 0; i < 100; i++)
        pending.polled += ibv_poll_cq(pending.cq, 1, &wc) + 1;
    pending.closed = ibv_close_device(open_device(0)) == 0;
    pthread_testcancel();
    pending.closed = -1; /* not cancelled */
    return NULL;
}

int main(void) {
    struct ibv_context *ctx = open_device(0);
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq = armed_cq(ctx, &channel);

    pending.cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    CHECK(pending.cq, "ibv_create_cq");
    CHECK(sem_init(&pending.ready, 0, 0) == 0 && sem_init(&pending.cancelled, 0, 0) == 0, "sem_init");
    pthread_t caller;
    void *result;
    CHECK(pthread_create(&caller, NULL, call_with_cancellation_pending, NULL) == 0, "pthread_create");
    sem_wait(&pending.ready);
    CHECK(pthread_cancel(caller) == 0, "pthread_cancel");
    sem_post(&pending.cancelled);
    CHECK(pthread_join(caller, &result) == 0, "pthread_join");
    printf("calls with a cancellation pending: %d polls, closed %d, %s\n", pending.polled,
           pending.closed, result == PTHREAD_CANCELED ? "cancelled after" : "not cancelled");
    CHECK(ibv_destroy_cq(pending.cq) == 0, "ibv_destroy_cq");

    struct wait cq_wait = { .what = "ibv_get_cq_event", .channel = channel };
    cancel_in_wait(&cq_wait);
    struct wait async_wait = { .what = "ibv_get_async_event", .ctx = ctx };
    cancel_in_wait(&async_wait);
    struct rdma_event_channel *cm = rdma_create_event_channel();
    CHECK(cm, "rdma_create_event_channel");
    struct wait cm_wait = { .what = "rdma_get_cm_event", .cm = cm };
    cancel_in_wait(&cm_wait);

    /* The CQ's channel and the engine go on: a receive posted to a QP that then fails is
     * flushed, and the armed CQ's event comes to this thread's wait. */
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    struct ibv_mr *mr;
    struct ibv_qp *qp = qp_with_a_receive(pd, cq, 7, &mr);
    fail_qp(qp);
    struct ibv_cq *evented;
    void *context;
    int ret = ibv_get_cq_event(channel, &evented, &context);
    ibv_ack_cq_events(cq, 1);
    struct ibv_wc wc = next_wc(cq);
    printf("the next cq event: %d, %s, wr_id %lu\n", ret, ibv_wc_status_str(wc.status),
           (unsigned long)wc.wr_id);
    CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");

    /* A handler that waits, on another channel, while this thread waits: the wait ends with
     * EINTR once the handler ran, whose own wait found nothing (EAGAIN). */
    struct ibv_cq *handlers_cq = armed_cq(ctx, &handlers_channel);
    CHECK(fcntl(handlers_channel->fd, F_SETFL, O_NONBLOCK) == 0, "fcntl");
    catch_alarm(wait_in_handler, 0);
    alarm_in(100000);
    ret = ibv_get_cq_event(channel, &evented, &context);
    printf("a wait in a handler: %d %s; the wait: %d %s\n", handlers_wait,
           strerror(handlers_errno), ret, ret ? strerror(errno) : "");
    CHECK(ibv_destroy_cq(handlers_cq) == 0 && ibv_destroy_comp_channel(handlers_channel) == 0,
          "destroys");

    /* The CM channel too. */
    struct rdma_cm_id *id;
    struct sockaddr_in dst = { .sin_family = AF_INET };
    CHECK(inet_pton(AF_INET, getenv("SOFTROCE_ADDR"), &dst.sin_addr) == 1, "address");
    CHECK(rdma_create_id(cm, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000) == 0, "rdma_resolve_addr");
    struct rdma_cm_event *cm_event;
    ret = rdma_get_cm_event(cm, &cm_event);
    printf("the next cm event: %d %s\n", ret, ret ? strerror(errno) : rdma_event_str(cm_event->event));
    if (ret == 0)
        rdma_ack_cm_event(cm_event);

    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    rdma_destroy_event_channel(cm);
    CHECK(ibv_destroy_qp(qp) == 0 && ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0, "destroys");
    CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(channel) == 0, "destroys");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    printf("done\n");
    return 0;
}
