/* Any number of ranks over Open MPI: ROUNDS of MPI_Alltoall, BLOCK bytes from every rank to
 * every rank (itself too), each block's bytes a function of its sender, its receiver, the round
 * and the offset, every byte checked on arrival. Rank 0 first prints, for each rank, the device
 * address it runs on (SOFTROCE_ADDR, which `softroce run` sets), so that the test can see which
 * ranks shared an address. Rank 0 prints "alltoall ok" only if every byte on every rank arrived
 * as sent; the exit status is 0 only then. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 8
#define BLOCK (64 * 1024)
#define ADDR_LEN 64

static unsigned char pattern(int from, int to, int round, size_t i)
{
	return (unsigned char)(from * 151 + to * 59 + round * 17 + i * 13 + (i >> 8));
}

int main(int argc, char **argv)
{
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);

	char addr[ADDR_LEN] = { 0 };
	const char *mine = getenv("SOFTROCE_ADDR");
	snprintf(addr, sizeof addr, "%s", mine ? mine : "(none)");
	char *addrs = rank == 0 ? malloc((size_t)size * ADDR_LEN) : NULL;
	if (rank == 0 && !addrs)
		MPI_Abort(MPI_COMM_WORLD, 3);
	MPI_Gather(addr, ADDR_LEN, MPI_CHAR, addrs, ADDR_LEN, MPI_CHAR, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		for (int r = 0; r < size; r++)
			printf("rank %d on %s\n", r, addrs + (size_t)r * ADDR_LEN);
		fflush(stdout);
		free(addrs);
	}

	size_t total = (size_t)size * BLOCK;
	unsigned char *out = malloc(total), *in = malloc(total);
	if (!out || !in)
		MPI_Abort(MPI_COMM_WORLD, 3);
	long bad = 0;
	double start = MPI_Wtime();
	for (int round = 0; round < ROUNDS; round++) {
		for (int to = 0; to < size; to++)
			for (size_t i = 0; i < BLOCK; i++)
				out[(size_t)to * BLOCK + i] = pattern(rank, to, round, i);
		/* What was there is the last round's data, or zeros: neither is this round's. */
		if (round == 0)
			memset(in, 0, total);
		MPI_Alltoall(out, BLOCK, MPI_BYTE, in, BLOCK, MPI_BYTE, MPI_COMM_WORLD);
		for (int from = 0; from < size; from++)
			for (size_t i = 0; i < BLOCK; i++)
				if (in[(size_t)from * BLOCK + i] != pattern(from, rank, round, i)) {
					if (!bad)
						fprintf(stderr,
							"rank %d: round %d, from rank %d, byte %zu: %u, not %u\n",
							rank, round, from, i, in[(size_t)from * BLOCK + i],
							pattern(from, rank, round, i));
					bad++;
				}
	}
	double seconds = MPI_Wtime() - start;

	long all_bad = 0;
	MPI_Allreduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("%d ranks, %d rounds of %d KiB per pair in %.2f s: %s\n", size, ROUNDS,
		       BLOCK / 1024, seconds, all_bad ? "DATA DIFFERS" : "alltoall ok");
	free(out);
	free(in);
	MPI_Finalize();
	return all_bad ? 1 : 0;
}
