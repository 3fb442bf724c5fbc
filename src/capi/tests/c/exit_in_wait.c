/* A handler that calls exit() while the program waits in ibv_get_cq_event: the process ends.
 * The wait runs the engine on the waiting thread (hybrid progress), and the library's exit
 * hook flushes the open devices through their engines: had the handler run while the thread
 * held the engine, the flush would wait for the thread, which waits for the flush. Prints a
 * line from the handler, then exits with 0 from it. */
static void on_alarm(int signal) {
    (void)signal;
    printf("the handler exits\n");
    fflush(stdout);
    exit(0);
}

int main(void) {
    catch_alarm(on_alarm, 0);
    struct ibv_comp_channel *channel;
    armed_cq(open_device(0), &channel);
    alarm_in(100000);
    printf("waiting\n");
    fflush(stdout);
    struct ibv_cq *evented;
    void *context;
    int ret = ibv_get_cq_event(channel, &evented, &context);
    printf("ibv_get_cq_event returned %d: the handler did not exit\n", ret);
    return 1;
}
