/* A signal handler that jumps out of a wait for a CQ event (an alarm's timeout around
 * ibv_get_cq_event, with sigsetjmp and siglongjmp) leaves the thread as it would leave
 * rdma-core's read(): its cancellation as the program had it, its signal mask as saved, and
 * the channel's next wait working. With hybrid or inline progress the wait runs the engine and
 * holds the thread's signals off meanwhile; the handler used to run, and jump, from inside the
 * library's work, which left the thread's cancellation disabled. A handler with SA_RESTART
 * lets the wait go on until its event comes. Prints what it found. */
#include <setjmp.h>

static sigjmp_buf timeout;
static volatile sig_atomic_t alarms;
static void jump_out(int signal) {
    (void)signal;
    alarms++;
    siglongjmp(timeout, 1);
}
static void count(int signal) { (void)signal; alarms++; }

/* Whether SIGALRM is blocked in the calling thread. */
static int alarm_blocked(void) {
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    return sigismember(&now, SIGALRM);
}

/* The calling thread's cancellation state, left as it is. */
static const char *cancel_state(void) {
    int state;
    CHECK(pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &state) == 0, "pthread_setcancelstate");
    pthread_setcancelstate(state, NULL);
    return state == PTHREAD_CANCEL_ENABLE ? "enabled" : "disabled";
}

/* After 200 ms, the QP `arg` fails: its posted receive is flushed, an event of the armed CQ. */
static void *fail_later(void *arg) {
    alarm_elsewhere_after_a_pause();
    fail_qp(arg);
    return NULL;
}

int main(void) {
    struct ibv_context *ctx = open_device(0);
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq = armed_cq(ctx, &channel);
    struct ibv_cq *evented;
    void *context;

    /* Three timeouts in a row: each jump leaves the thread as the wait found it. */
    catch_alarm(jump_out, 0);
    for (int round = 1; round <= 3; round++) {
        if (sigsetjmp(timeout, 1) == 0) {
            alarm_in(50000);
            int ret = ibv_get_cq_event(channel, &evented, &context);
            printf("round %d: not jumped out: %d %s\n", round, ret, ret ? strerror(errno) : "");
            continue;
        }
        printf("round %d: jumped out, alarms %d, cancellation %s, alarm blocked %d\n", round,
               alarms, cancel_state(), alarm_blocked());
    }

    /* The channel's next wait: interrupted by a handler without SA_RESTART, as a read(). */
    catch_alarm(count, 0);
    alarm_in(50000);
    int ret = ibv_get_cq_event(channel, &evented, &context);
    printf("the next wait: %d %s, alarms %d\n", ret, ret ? strerror(errno) : "", alarms);

    /* With SA_RESTART it goes on through the alarm, until a receive is flushed. */
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    struct ibv_mr *mr;
    struct ibv_qp *qp = qp_with_a_receive(pd, cq, 9, &mr);
    catch_alarm(count, SA_RESTART);
    alarm_in(50000); /* before the QP fails, however slowly the thread below starts */
    pthread_t later;
    CHECK(pthread_create(&later, NULL, fail_later, qp) == 0, "pthread_create");
    ret = ibv_get_cq_event(channel, &evented, &context);
    pthread_join(later, NULL);
    CHECK(ret == 0, "ibv_get_cq_event after the alarm");
    ibv_ack_cq_events(cq, 1);
    struct ibv_wc wc = next_wc(cq);
    printf("restarted: %d, alarms %d, %s, wr_id %lu\n", ret, alarms,
           ibv_wc_status_str(wc.status), (unsigned long)wc.wr_id);

    CHECK(ibv_destroy_qp(qp) == 0 && ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0,
          "destroys");
    CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(channel) == 0, "destroys");
    ibv_close_device(ctx);
    printf("done\n");
    return 0;
}
