/* A handler that calls exit() while the program waits in ibv_get_cq_event: the process ends.
 * The wait runs the engine on the waiting thread (hybrid progress), and the library's exit
 * hook flushes the open devices through their engines: had the handler run while the thread
 * held the engine, the flush would wait for the thread, which waits for the flush. Prints a
 * line from the handler, then exits with 0 from it. */
#include <signal.h>
#include <sys/time.h>

static void on_alarm(int signal) {
    (void)signal;
    printf("the handler exits\n");
    fflush(stdout);
    exit(0);
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
    struct itimerval soon = { .it_value = { .tv_sec = 0, .tv_usec = 100000 } };
    CHECK(setitimer(ITIMER_REAL, &soon, NULL) == 0, "setitimer");
    printf("waiting\n");
    fflush(stdout);
    struct ibv_cq *evented;
    void *context;
    int ret = ibv_get_cq_event(channel, &evented, &context);
    printf("ibv_get_cq_event returned %d: the handler did not exit\n", ret);
    return 1;
}
