// The C++ twin of unwindchain.c: the same six calls down to cudaMalloc
// through a namespace, a class template, a virtual method, a lambda and a
// function with an exception handler (whose FDE carries a personality and a
// language-specific data area), built -O2 -fomit-frame-pointer; with a FIFO's
// path as argument it opens that (and blocks) instead of allocating.
//
// Prints "ready"; at each SIGUSR1 allocates (or opens) and prints "done".
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <unistd.h>

extern "C" int cudaMalloc(void **devPtr, size_t size);

static volatile sig_atomic_t go;
static void on_usr1(int) { go = 1; }

namespace engine {

static const char *fifo;

__attribute__((noinline)) long alloc_weights(long n)
{
	if (fifo) {
		if (open(fifo, O_RDONLY) < 0)
			throw std::runtime_error("open failed");
		return n;
	}
	void *p = nullptr;
	if (cudaMalloc(&p, static_cast<size_t>(n) << 20))
		throw std::runtime_error("cudaMalloc failed");
	return p ? n : -1;
}

template <typename T> struct Layer {
	volatile T scale[7];
	__attribute__((noinline)) long build(long n)
	{
		for (int i = 0; i < 7; i++)
			scale[i] = n * i;
		long r = alloc_weights(n + 1);
		return r + static_cast<long>(scale[n % 7]);
	}
};

struct Block {
	virtual ~Block() = default;
	virtual long build(long n);
};

__attribute__((noinline)) long Block::build(long n)
{
	Layer<long> layer;
	long r = layer.build(n + 1);
	return r + static_cast<long>(layer.scale[1]);
}

__attribute__((noinline)) long build_model(Block &b, long n)
{
	volatile long words[13];
	for (int i = 0; i < 13; i++)
		words[i] = n + i;
	auto step = [&](long k) __attribute__((noinline)) { return b.build(k) + words[k % 13]; };
	return step(n + 1) + 1;
}

__attribute__((noinline)) long load_checkpoint(Block &b, long n)
{
	try {
		return build_model(b, n + 1);
	} catch (const std::exception &e) {
		std::fprintf(stderr, "%s\n", e.what());
		return -1;
	}
}

} // namespace engine

int main(int argc, char **argv)
{
	engine::fifo = argc > 1 ? argv[1] : nullptr;
	std::signal(SIGUSR1, on_usr1);
	// SIGUSR1 is let in only inside sigsuspend: one that came between the
	// test of go and a pause() would be lost, and the test wait forever.
	sigset_t usr1, open_set;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, &open_set);
	std::printf("ready\n");
	std::fflush(stdout);
	engine::Block block;
	engine::Block *volatile b = &block; // a real virtual call
	for (;;) {
		while (!go)
			sigsuspend(&open_set);
		go = 0;
		long r = engine::load_checkpoint(*b, 1);
		std::printf("done %ld\n", r);
		std::fflush(stdout);
	}
}
