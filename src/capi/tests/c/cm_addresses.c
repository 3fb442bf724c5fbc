/* What librdmacm's address calls answer as the kernel and rdma-core do, where libfabric's
 * verbs provider relies on it: rdma_getaddrinfo with the addresses only in the hints, a bind to
 * a loopback address that no device has (the first device, at its own address), port 0 (an
 * ephemeral port, at the bind), a port another ID holds (EADDRINUSE until it is destroyed), and
 * a second bind of one ID (EINVAL, the first kept).
 * SOFTROCE_ADDR names one address, given again as argv[1]. Prints what it saw. */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static struct sockaddr_in ipv4(const char *ip, uint16_t port) {
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
    CHECK(inet_pton(AF_INET, ip, &sin.sin_addr) == 1, "inet_pton");
    return sin;
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: cm_addresses DEVICE-ADDRESS");
    const char *device = argv[1];

    struct sockaddr_in src = ipv4(device, 0), dst = ipv4("127.0.0.9", 7000);
    struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP,
                                   .ai_src_addr = (struct sockaddr *)&src,
                                   .ai_src_len = sizeof src,
                                   .ai_dst_addr = (struct sockaddr *)&dst,
                                   .ai_dst_len = sizeof dst }, *res = NULL;
    int ret = rdma_getaddrinfo(NULL, NULL, &hints, &res);
    printf("addresses from the hints: %d\n",
           ret == 0 && res->ai_family == AF_INET && res->ai_src_addr && res->ai_dst_addr &&
           ((struct sockaddr_in *)res->ai_src_addr)->sin_addr.s_addr == src.sin_addr.s_addr &&
           ((struct sockaddr_in *)res->ai_dst_addr)->sin_port == htons(7000));
    if (ret == 0)
        rdma_freeaddrinfo(res);
    struct rdma_addrinfo empty = { .ai_port_space = RDMA_PS_TCP };
    errno = 0;
    printf("no addresses at all: %d\n",
           rdma_getaddrinfo(NULL, NULL, &empty, &res) == -1 && errno == EINVAL);

    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *loop, *first, *second;
    CHECK(channel && rdma_create_id(channel, &loop, NULL, RDMA_PS_TCP) == 0 &&
          rdma_create_id(channel, &first, NULL, RDMA_PS_TCP) == 0 &&
          rdma_create_id(channel, &second, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");

    struct sockaddr_in localhost = ipv4("127.0.0.1", 0);
    ret = rdma_bind_addr(loop, (struct sockaddr *)&localhost);
    struct sockaddr_in *bound = (struct sockaddr_in *)rdma_get_local_addr(loop);
    char text[INET_ADDRSTRLEN] = "";
    if (ret == 0)
        inet_ntop(AF_INET, &bound->sin_addr, text, sizeof text);
    printf("localhost binds the device: %d\n", ret == 0 && loop->verbs != NULL &&
                                               strcmp(text, device) == 0);
    uint16_t port = ntohs(rdma_get_src_port(loop));
    unsigned low = 32768, high = 60999;
    FILE *range = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (range) {
        CHECK(fscanf(range, "%u %u", &low, &high) == 2, "ip_local_port_range");
        fclose(range);
    }
    printf("port 0 is an ephemeral port: %d\n", port >= low && port <= high);
    CHECK(rdma_listen(loop, 1) == 0, "rdma_listen");
    printf("it listens there: %d\n", ntohs(rdma_get_src_port(loop)) == port);

    struct sockaddr_in fixed = ipv4(device, 7471);
    CHECK(rdma_bind_addr(first, (struct sockaddr *)&fixed) == 0, "rdma_bind_addr");
    struct sockaddr_in elsewhere = ipv4(device, 7472);
    errno = 0;
    ret = rdma_bind_addr(first, (struct sockaddr *)&elsewhere);
    printf("a bound ID binds once: %d\n", ret == -1 && errno == EINVAL &&
                                          ntohs(rdma_get_src_port(first)) == 7471);
    errno = 0;
    ret = rdma_bind_addr(second, (struct sockaddr *)&fixed);
    printf("a port held: %d\n", ret == -1 && errno == EADDRINUSE);
    CHECK(rdma_destroy_id(first) == 0, "rdma_destroy_id");
    printf("free again: %d\n", rdma_bind_addr(second, (struct sockaddr *)&fixed) == 0);

    rdma_destroy_id(second);
    rdma_destroy_id(loop);
    rdma_destroy_event_channel(channel);
    printf("done\n");
    return 0;
}
