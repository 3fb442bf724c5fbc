/* Two ranks over Open MPI: a ping-pong of 8-byte messages (timed after WARMUP exchanges, which
 * include UCX's wire-up of the ranks' endpoints), then a window of sixteen 1 MiB
 * nonblocking sends each way, every byte checked. Exit status 0 only if all arrived intact. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WARMUP 100
#define PINGS 10000
#define WINDOW 16
#define BIG (1 << 20)

static unsigned char pattern(int from, int message, size_t i)
{
	return (unsigned char)(from * 131 + message * 31 + i * 7 + (i >> 9));
}

int main(int argc, char **argv)
{
	int rank, size, bad = 0;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 2) {
		fprintf(stderr, "mpi_exchange: needs 2 ranks, has %d\n", size);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int peer = 1 - rank;

	uint64_t token = 0;
	double start = 0;
	for (int i = 0; i < WARMUP + PINGS; i++) {
		if (i == WARMUP)
			start = MPI_Wtime();
		if (rank == 0) {
			token = i;
			MPI_Send(&token, 1, MPI_UINT64_T, peer, 0, MPI_COMM_WORLD);
			MPI_Recv(&token, 1, MPI_UINT64_T, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			if (token != (uint64_t)i + 1)
				bad++;
		} else {
			MPI_Recv(&token, 1, MPI_UINT64_T, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			token++;
			MPI_Send(&token, 1, MPI_UINT64_T, peer, 0, MPI_COMM_WORLD);
		}
	}
	double half_round_trip = (MPI_Wtime() - start) / PINGS / 2;

	unsigned char *out = malloc((size_t)WINDOW * BIG), *in = malloc((size_t)WINDOW * BIG);
	if (!out || !in)
		MPI_Abort(MPI_COMM_WORLD, 3);
	memset(in, 0, (size_t)WINDOW * BIG);
	for (int m = 0; m < WINDOW; m++)
		for (size_t i = 0; i < BIG; i++)
			out[(size_t)m * BIG + i] = pattern(rank, m, i);
	MPI_Request requests[2 * WINDOW];
	start = MPI_Wtime();
	for (int m = 0; m < WINDOW; m++) {
		MPI_Irecv(in + (size_t)m * BIG, BIG, MPI_BYTE, peer, m, MPI_COMM_WORLD, &requests[m]);
		MPI_Isend(out + (size_t)m * BIG, BIG, MPI_BYTE, peer, m, MPI_COMM_WORLD,
			  &requests[WINDOW + m]);
	}
	MPI_Waitall(2 * WINDOW, requests, MPI_STATUSES_IGNORE);
	double seconds = MPI_Wtime() - start;
	for (int m = 0; m < WINDOW; m++)
		for (size_t i = 0; i < BIG; i++)
			if (in[(size_t)m * BIG + i] != pattern(peer, m, i)) {
				if (!bad)
					fprintf(stderr, "rank %d: message %d byte %zu differs\n", rank, m, i);
				bad++;
			}

	int all_bad = 0;
	MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("ping-pong 8 B: %.2f us; window of %d x 1 MiB each way: %.1f MB/s; %s\n",
		       half_round_trip * 1e6, WINDOW, 2.0 * WINDOW * BIG / seconds / 1e6,
		       all_bad ? "DATA DIFFERS" : "data checked");
	free(out);
	free(in);
	MPI_Finalize();
	return all_bad ? 1 : 0;
}
