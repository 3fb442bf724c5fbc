/* Registration at the scale a middleware reaches (issue 50): COUNT regions over one buffer
 * (4 KiB each, on 256 pages in turn), each registered again elsewhere with ibv_rereg_mr,
 * deregistered, and all of it twice; then COUNT windows. Every key handed out is checked
 * unique among those alive. Prints what it saw. */

static int by_value(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

/* Whether the `n` keys are all different (sorts them). */
static int distinct(uint32_t *keys, long n) {
    qsort(keys, n, sizeof *keys, by_value);
    for (long i = 1; i < n; i++)
        if (keys[i] == keys[i - 1])
            return 0;
    return 1;
}

/* Whether every region's lkey differs from the others', and every rkey too. */
static int keys_distinct(struct ibv_mr **mrs, long n, uint32_t *keys) {
    for (long i = 0; i < n; i++)
        keys[i] = mrs[i]->lkey;
    int lkeys = distinct(keys, n);
    for (long i = 0; i < n; i++)
        keys[i] = mrs[i]->rkey;
    return lkeys && distinct(keys, n);
}

int main(int argc, char **argv) {
    long count = argc > 1 ? atol(argv[1]) : 100000;
    enum { PAGES = 256, PAGE = 4096 };
    uint8_t *buffer = aligned_alloc(PAGE, PAGES * PAGE);
    struct ibv_mr **mrs = calloc(count, sizeof *mrs);
    uint32_t *keys = calloc(count, sizeof *keys);
    CHECK(buffer && mrs && keys, "allocations");
    memset(buffer, 0, PAGES * PAGE);
    struct ibv_context *ctx = open_device(0);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");

    for (int round = 1; round <= 2; round++) {
        for (long i = 0; i < count; i++) {
            mrs[i] = ibv_reg_mr(pd, buffer + (i % PAGES) * PAGE, PAGE, ALL_ACCESS);
            if (!mrs[i]) {
                fprintf(stderr, "region %ld of round %d: ", i, round);
                CHECK(0, "ibv_reg_mr");
            }
        }
        printf("round %d registered %ld, keys distinct: %d\n", round, count,
               keys_distinct(mrs, count, keys));
        long moved = 0;
        for (long i = 0; i < count; i++) {
            uint8_t *to = buffer + ((i + 1) % PAGES) * PAGE;
            int flags = IBV_REREG_MR_CHANGE_TRANSLATION;
            int access = 0;
            if (i % 2) {
                flags |= IBV_REREG_MR_CHANGE_ACCESS;
                access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
            }
            if (ibv_rereg_mr(mrs[i], flags, NULL, to, PAGE, access) != 0) {
                fprintf(stderr, "region %ld of round %d: ", i, round);
                CHECK(0, "ibv_rereg_mr");
            }
            moved += mrs[i]->addr == to;
        }
        printf("round %d reregistered %ld, keys distinct: %d\n", round, moved,
               keys_distinct(mrs, count, keys));
        long gone = 0;
        for (long i = 0; i < count; i++)
            gone += ibv_dereg_mr(mrs[i]) == 0;
        printf("round %d deregistered %ld\n", round, gone);
    }

    struct ibv_mw **mws = (struct ibv_mw **)mrs;
    for (long i = 0; i < count; i++) {
        mws[i] = ibv_alloc_mw(pd, i % 2 ? IBV_MW_TYPE_2 : IBV_MW_TYPE_1);
        if (!mws[i]) {
            fprintf(stderr, "window %ld: ", i);
            CHECK(0, "ibv_alloc_mw");
        }
        keys[i] = mws[i]->rkey;
    }
    printf("windows %ld, rkeys distinct: %d\n", count, distinct(keys, count));
    long gone = 0;
    for (long i = 0; i < count; i++)
        gone += ibv_dealloc_mw(mws[i]) == 0;
    printf("windows deallocated %ld\n", gone);
    printf("pd deallocated: %d\n", ibv_dealloc_pd(pd) == 0);
    printf("done\n");
    return 0;
}
