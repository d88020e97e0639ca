/* Stand-in for NCCL 2.x (soname libnccl.so.2): the entry points of nccl.h
 * with their real names and signatures. Every call returns at once: nothing
 * is sent anywhere, and a communicator is a malloc'd record of its size and
 * this process's rank, so that ncclCommCount and ncclCommUserRank answer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 21
#define NCCL_PATCH 5
#define NCCL_VERSION_CODE (NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH)
#define NCCL_UNIQUE_ID_BYTES 128

typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

struct ncclComm {
	int nranks, rank;
};
typedef struct ncclComm *ncclComm_t;
typedef void *cudaStream_t;

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
	ncclNumResults = 8,
} ncclResult_t;

typedef enum {
	ncclInt8 = 0,
	ncclUint8 = 1,
	ncclInt32 = 2,
	ncclUint32 = 3,
	ncclInt64 = 4,
	ncclUint64 = 5,
	ncclFloat16 = 6,
	ncclFloat32 = 7,
	ncclFloat64 = 8,
	ncclBfloat16 = 9,
	ncclFloat8e4m3 = 10,
	ncclFloat8e5m2 = 11,
	ncclNumTypes = 12,
} ncclDataType_t;

typedef enum { ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, ncclNumOps } ncclRedOp_t;

/* nccl.h's ncclConfig_t; only its size and version fields are read here. */
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking, cgaClusterSize, minCTAs, maxCTAs;
	const char *netName;
	int splitShare;
} ncclConfig_t;

ncclResult_t ncclGetVersion(int *version)
{
	if (!version)
		return ncclInvalidArgument;
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}

/* Random enough to tell communicators apart: the pid, the time and a
 * counter, as the real one holds a socket address and a magic. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	static uint64_t n;
	struct timespec ts;
	if (!id)
		return ncclInvalidArgument;
	clock_gettime(CLOCK_REALTIME, &ts);
	memset(id, 0, sizeof(*id));
	uint64_t words[4] = {(uint64_t)getpid(), (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, ++n};
	memcpy(id->internal, words, sizeof(words));
	return ncclSuccess;
}

static ncclResult_t newcomm(ncclComm_t *comm, int nranks, int rank)
{
	if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	struct ncclComm *c = malloc(sizeof(*c));
	if (!c)
		return ncclSystemError;
	c->nranks = nranks;
	c->rank = rank;
	*comm = c;
	return ncclSuccess;
}

/* Neither calls the other, as in NCCL (both call an internal function):
 * a tracer hooking both must see one call. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	(void)commId;
	return newcomm(comm, nranks, rank);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config)
{
	(void)commId, (void)config;
	return newcomm(comm, nranks, rank);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
	(void)devlist;
	if (!comms || ndev < 1)
		return ncclInvalidArgument;
	for (int i = 0; i < ndev; i++) {
		ncclResult_t rc = newcomm(&comms[i], ndev, i);
		if (rc != ncclSuccess)
			return rc;
	}
	return ncclSuccess;
}

/* color < 0 (NCCL_SPLIT_NOCOLOR): this rank takes no part. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm_, ncclConfig_t *config)
{
	(void)config;
	if (!comm || !newcomm_)
		return ncclInvalidArgument;
	if (color < 0) {
		*newcomm_ = NULL;
		return ncclSuccess;
	}
	/* Without peers to ask who shares the colour, the new communicator
	 * is as large as the parent and the new rank is key. */
	return newcomm(newcomm_, comm->nranks, key % comm->nranks);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	free(comm);
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	free(comm);
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	if (!comm || !count)
		return ncclInvalidArgument;
	*count = comm->nranks;
	return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
	if (!comm || !device)
		return ncclInvalidArgument;
	*device = comm->rank;
	return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	if (!comm || !rank)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
	if (!comm || !asyncError)
		return ncclInvalidArgument;
	*asyncError = ncclSuccess;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
	switch (result) {
	case ncclSuccess:
		return "no error";
	case ncclUnhandledCudaError:
		return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError:
		return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError:
		return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument:
		return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage:
		return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError:
		return "remote process exited or there was a network error";
	case ncclInProgress:
		return "NCCL operation in progress";
	default:
		return "unknown result code";
	}
}

const char *ncclGetLastError(ncclComm_t comm)
{
	(void)comm;
	return "";
}

static ncclResult_t op(const ncclComm_t comm, ncclDataType_t datatype)
{
	if (!comm || datatype < 0 || datatype >= ncclNumTypes)
		return ncclInvalidArgument;
	return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			   ncclRedOp_t redop, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)count, (void)redop, (void)stream;
	return op(comm, datatype);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
			   ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)sendcount, (void)stream;
	return op(comm, datatype);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
			       ncclRedOp_t redop, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)recvcount, (void)redop, (void)stream;
	return op(comm, datatype);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			   ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)count, (void)root, (void)stream;
	return op(comm, datatype);
}

/* The in-place broadcast of NCCL 1, still exported. */
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
	(void)buff, (void)count, (void)root, (void)stream;
	return op(comm, datatype);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t redop,
			int root, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)count, (void)redop, (void)root, (void)stream;
	return op(comm, datatype);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
		      cudaStream_t stream)
{
	(void)sendbuff, (void)count, (void)peer, (void)stream;
	return op(comm, datatype);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
		      cudaStream_t stream)
{
	(void)recvbuff, (void)count, (void)peer, (void)stream;
	return op(comm, datatype);
}

ncclResult_t ncclGroupStart(void)
{
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
	return ncclSuccess;
}
