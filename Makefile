# autoglm-ebpf: `make demo` runs the tool on a bundled leaky workload,
# `make test` runs every test (BPF integration tests need root). Both install
# what they need first (Debian/Ubuntu, via apt).

GO      ?= go
BIN     := bin/autoglm-ebpf
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
CFLAGS  := -O1 -g -fno-omit-frame-pointer -Wall -pthread
FIXTURES := testdata/bin/fdwork testdata/bin/demo testdata/bin/schedwork testdata/bin/sockwork testdata/bin/cudawork testdata/bin/realcuda testdata/bin/leaderexit testdata/bin/ncclrank
GOSRC   := $(shell find cmd pkg -name '*.go' -o -name '*.o') go.mod go.sum

.PHONY: build deps test-deps generate-deps generate check-generate fixtures test fuzz demo screenshot bench kernels image image-root e2e clean
.PHONY: build-arm64 arm64-deps kernels-arm64 kernels-both kernels-deps kernels-arm64-deps fixtures-arm64

build: $(BIN)

$(BIN): $(GOSRC)
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $@ ./cmd/autoglm-ebpf

# The arm64 binary (NVIDIA Grace nodes), cross-built with cgo (go-nvml) by
# Debian's aarch64 cross compiler against its arm64 glibc.
BIN_ARM64 := bin/arm64/autoglm-ebpf
ARM64_CC ?= aarch64-linux-gnu-gcc
ARM64_CXX ?= aarch64-linux-gnu-g++
ARM64_GO := GOARCH=arm64 CGO_ENABLED=1 CC=$(ARM64_CC) CXX=$(ARM64_CXX) $(GO)
build-arm64: arm64-deps $(BIN_ARM64)

$(BIN_ARM64): $(GOSRC)
	$(ARM64_GO) build -ldflags "-X main.version=$(VERSION)" -o $@ ./cmd/autoglm-ebpf

deps:
	@scripts/install-deps.sh

test-deps:
	@scripts/install-deps.sh test

generate-deps:
	@scripts/install-deps.sh generate

arm64-deps:
	@scripts/install-deps.sh arm64

# Rebuild the committed BPF objects and Go bindings (needs clang).
generate: generate-deps
	$(GO) generate ./...

# CI: the committed objects must be what the sources produce.
check-generate: generate
	@git diff --exit-code --stat -- pkg bpf || { echo "generated BPF files drifted: run 'make generate' and commit"; exit 1; }

CUDA_STUBS := testdata/bin/cuda/libcuda.so.1 testdata/bin/cuda/libcudart.so.11.0
STUB_CFLAGS := -shared -fPIC -O1 -g -fno-omit-frame-pointer -Wall

NCCL_STUB := testdata/bin/nccl/libnccl.so.2

fixtures: $(FIXTURES) $(CUDA_STUBS) $(NCCL_STUB)

# Stand-ins for the CUDA driver and runtime, with their real sonames and
# version node (the tests build the same in pkg/testutil).
testdata/bin/cuda/libcuda.so.1: testdata/cuda_stub.c
	@mkdir -p $(@D)
	$(CC) $(STUB_CFLAGS) -Wl,-soname,libcuda.so.1 -o $@ $<

testdata/bin/cuda/libcudart.so.11.0: testdata/cudart_stub.c testdata/cudart_stub.map testdata/bin/cuda/libcuda.so.1
	$(CC) $(STUB_CFLAGS) -Wl,-soname,libcudart.so.11.0 -Wl,--version-script=testdata/cudart_stub.map \
		-o $@ testdata/cudart_stub.c testdata/bin/cuda/libcuda.so.1 '-Wl,-rpath,$$ORIGIN'

# Stand-in for NCCL 2.x, with its real soname (pkg/testutil builds the same).
testdata/bin/nccl/libnccl.so.2: testdata/nccl_stub.c
	@mkdir -p $(@D)
	$(CC) $(STUB_CFLAGS) -Wl,-soname,libnccl.so.2 -o $@ $<

testdata/bin/%: testdata/%.c
	@mkdir -p testdata/bin
	$(CC) $(CFLAGS) -o $@ $<

test: deps test-deps build fixtures
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/e2e
	# -p 1: packages one at a time, so that tests which count the programs
	# loaded in the kernel see only their own.
	$(GO) test -count=1 -p 1 -timeout 20m ./...

# Fuzz targets of what a process controls (the files it maps, its /proc
# files, its Python interpreter's memory) and of the report, each for
# FUZZTIME, one after another. A crash's input
# is left under the package's testdata/fuzz/: fix it and commit the input,
# which plain `go test` then runs as a regression case.
# The engine minimizes every input that finds new code, uncounted; with the
# default 60 s per input, a 17 KiB ELF seed takes the whole run.
FUZZTIME ?= 60s
FUZZMINIMIZETIME ?= 3s
FUZZ := pkg/symbolize:FuzzELF pkg/symbolize:FuzzReadable pkg/procinfo:FuzzParseMaps \
	pkg/procinfo:FuzzParseStat pkg/pyframes:FuzzLineTables pkg/pyframes:FuzzPyMemory \
	pkg/model:FuzzFindingJSON pkg/report:FuzzReport

fuzz: test-deps
	@set -e; for t in $(FUZZ); do \
		echo "== $${t#*:} ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./$${t%%:*}; \
	done

# The worker leaks an fd per request, bursts 3 GiB of (stand-in) GPU memory
# at 12 s and fails an allocation at 15 s; the stand-in GPU has 1 GiB free
# per allocation.
demo: deps build fixtures
	@echo "== autoglm-ebpf watching a demo inference worker for 25 s: fd leak, GPU burst, GPU allocation failure =="
	CUDA_STUB_LIMIT=1073741824 ./$(BIN) run --duration 25s --json bin/demo-report.json --html bin/demo-report.html -- testdata/bin/demo 60 testdata/bin/cuda/libcudart.so.11.0
	@echo "== JSON report: bin/demo-report.json; HTML report with charts: bin/demo-report.html =="

# README's picture of the demo's HTML report: the page as a browser shows
# it, reduced to a small palette.
screenshot: demo
	@scripts/install-deps.sh screenshot
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
		--disable-component-update --disable-sync --user-data-dir=$$(mktemp -d) --hide-scrollbars \
		--window-size=1400,1640 --screenshot=bin/demo-report.png file://$(CURDIR)/bin/demo-report.html
	pngquant --force --quality=60-90 --output docs/demo-report.png bin/demo-report.png

bench: deps build fixtures
	@scripts/bench.sh

# The kernel matrix: Debian's 5.10, 6.1, 6.1-rt and 6.12 booted under qemu,
# the tool checked and its workloads' findings asserted in each
# (scripts/kernels.sh; logs and reports under bin/kernels/KERNEL/).
# KERNELS="6.1 5.10" runs some.
KERNELS ?=
KERNELS_PREREQS := kernels-deps build fixtures bin/cudatrack.test
kernels: $(KERNELS_PREREQS)
	scripts/kernels.sh $(KERNELS)

kernels-deps: deps
	@scripts/install-deps.sh kernels

# pkg/cudatrack's tests, which the matrix's oomsnap step runs in each guest.
bin/cudatrack.test: $(GOSRC)
	$(GO) test -c -o $@ ./pkg/cudatrack

# The arm64 matrix: Debian's arm64 6.1 and 6.12 under qemu-system-aarch64,
# with an arm64 userland from Debian's packages as the guest's root
# (scripts/kernels.sh with KERNELS_ARCH=arm64; under bin/kernels/arm64/KERNEL/).
# What runs in the guest is cross-built here: the tool, the fixtures (and
# stand-ins) in testdata/bin-arm64, laid out as testdata/bin, and the
# test binaries of the oomsnap and eustack steps, which find the prebuilt
# fixtures through AUTOGLM_TEST_FIXTURES (the guest has no compiler).
ARM64_FIX := testdata/bin-arm64
ARM64_FIXTURES := $(FIXTURES:testdata/bin/%=$(ARM64_FIX)/%) $(CUDA_STUBS:testdata/bin/%=$(ARM64_FIX)/%) \
	$(NCCL_STUB:testdata/bin/%=$(ARM64_FIX)/%) $(ARM64_FIX)/cuda/unwindchain_c $(ARM64_FIX)/cuda/unwindchain_cc \
	$(ARM64_FIX)/cuda/unwindchain_c_pac $(ARM64_FIX)/cuda/unwindchain_cc_pac \
	$(ARM64_FIX)/cuda/cudawork_static

KERNELS_ARM64_PREREQS := kernels-arm64-deps $(BIN_ARM64) fixtures-arm64 bin/arm64/cudatrack.test bin/arm64/fdtrack.test
kernels-arm64: $(KERNELS_ARM64_PREREQS)
	KERNELS_ARCH=arm64 scripts/kernels.sh $(KERNELS)

# Both matrices side by side, as CI runs them: each guest is one emulated
# vCPU (one host thread busy), and CI's machine has two cores; one after
# the other they were 43 of CI's 81 minutes. Each line is marked with its
# matrix; fails when either does.
kernels-both: $(KERNELS_PREREQS) $(KERNELS_ARM64_PREREQS)
	@bash -c 'set -o pipefail; \
		scripts/kernels.sh $(KERNELS) 2>&1 | sed -u "s/^/[amd64] /" & x86=$$!; \
		KERNELS_ARCH=arm64 scripts/kernels.sh $(KERNELS) 2>&1 | sed -u "s/^/[arm64] /" & arm=$$!; \
		rc=0; wait $$x86 || rc=1; wait $$arm || rc=1; exit $$rc'

# Before anything is cross-built: the toolchain comes with the rest.
kernels-arm64-deps: deps
	@scripts/install-deps.sh kernels-arm64

bin/arm64/%.test: $(GOSRC)
	$(ARM64_GO) test -c -o $@ ./pkg/$*

fixtures-arm64: $(ARM64_FIXTURES)

$(ARM64_FIX)/cuda/libcuda.so.1: testdata/cuda_stub.c
	@mkdir -p $(@D)
	$(ARM64_CC) $(STUB_CFLAGS) -Wl,-soname,libcuda.so.1 -o $@ $<

$(ARM64_FIX)/cuda/libcudart.so.11.0: testdata/cudart_stub.c testdata/cudart_stub.map $(ARM64_FIX)/cuda/libcuda.so.1
	$(ARM64_CC) $(STUB_CFLAGS) -Wl,-soname,libcudart.so.11.0 -Wl,--version-script=testdata/cudart_stub.map \
		-o $@ testdata/cudart_stub.c $(ARM64_FIX)/cuda/libcuda.so.1 '-Wl,-rpath,$$ORIGIN'

# As pkg/testutil.CUDAChain, CUDAChainPAC and CUDAStaticWork build them,
# with the stand-ins found next to them wherever the folder is; the _pac
# chains sign their return addresses (pointer authentication).
$(ARM64_FIX)/cuda/unwindchain_c: testdata/unwindchain.c $(ARM64_FIX)/cuda/libcudart.so.11.0
	$(ARM64_CC) -O2 -g -fomit-frame-pointer -Wall -o $@ $^ '-Wl,-rpath,$$ORIGIN'

$(ARM64_FIX)/cuda/unwindchain_cc: testdata/unwindchain.cc $(ARM64_FIX)/cuda/libcudart.so.11.0
	$(ARM64_CXX) -O2 -g -fomit-frame-pointer -Wall -o $@ $^ '-Wl,-rpath,$$ORIGIN'

$(ARM64_FIX)/cuda/unwindchain_c_pac: testdata/unwindchain.c $(ARM64_FIX)/cuda/libcudart.so.11.0
	$(ARM64_CC) -O2 -g -fomit-frame-pointer -mbranch-protection=standard -Wall -o $@ $^ '-Wl,-rpath,$$ORIGIN'

$(ARM64_FIX)/cuda/unwindchain_cc_pac: testdata/unwindchain.cc $(ARM64_FIX)/cuda/libcudart.so.11.0
	$(ARM64_CXX) -O2 -g -fomit-frame-pointer -mbranch-protection=standard -Wall -o $@ $^ '-Wl,-rpath,$$ORIGIN'

$(ARM64_FIX)/cuda/cudawork_static: testdata/cudawork.c testdata/cudart_stub.c $(ARM64_FIX)/cuda/libcuda.so.1
	$(ARM64_CC) $(CFLAGS) -o $@ $^ '-Wl,-rpath,$$ORIGIN'

$(ARM64_FIX)/nccl/libnccl.so.2: testdata/nccl_stub.c
	@mkdir -p $(@D)
	$(ARM64_CC) $(STUB_CFLAGS) -Wl,-soname,libnccl.so.2 -o $@ $<

$(ARM64_FIX)/%: testdata/%.c
	@mkdir -p $(@D)
	$(ARM64_CC) $(CFLAGS) -o $@ $<

# The container image, built offline from bin/autoglm-ebpf, bin/arm64/autoglm-ebpf
# and the glibc each links against (deploy/image): one OCI layout archive
# whose index holds the linux/amd64 and linux/arm64 images, for
# `docker load`, `podman load` or `ctr -n k8s.io images import` (each
# takes its machine's platform), and their SPDX SBOMs beside it
# (bin/autoglm-ebpf-image-ARCH.spdx.json). IMAGE_REPO names it (tag: VERSION).
IMAGE_REPO ?= ghcr.io/open-autoglm/autoglm-ebpf
image: deps arm64-deps build build-arm64
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) $(GO) run ./deploy/image -binary $(BIN) -binary $(BIN_ARM64) \
		-version $(VERSION) -revision $$(git rev-parse HEAD 2>/dev/null) -repository $(IMAGE_REPO) -o bin/autoglm-ebpf-image.tar

# The same files in bin/image-root-amd64 and bin/image-root-arm64, for
# deploy/Dockerfile (FROM scratch; TARGETARCH picks the folder).
image-root: deps arm64-deps build build-arm64
	$(GO) run ./deploy/image -binary $(BIN) -rootfs bin/image-root-amd64
	$(GO) run ./deploy/image -binary $(BIN_ARM64) -rootfs bin/image-root-arm64

# End to end on a real one-node Kubernetes (root): etcd, the Kubernetes
# components built from test/e2e/kube (cached in bin/e2e and Go's build
# cache), containerd, runc and the CNI bridge plugin; the agent's image from
# `make image`, the kustomize base and the Helm chart applied with only the
# image overridden, a leaking workload pod, Prometheus with the shipped rules
# and Alertmanager. Everything is torn down at the end, and checked.
KUBE_VERSION := v1.34.4
KUBE_BIN := bin/e2e/kube-$(KUBE_VERSION)
KUBE_CMDS := kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34 \
	-X k8s.io/component-base/version.gitTreeState=clean
$(KUBE_BIN)/kubelet: test/e2e/kube/go.mod test/e2e/kube/go.sum
	@mkdir -p $(@D)
	cd test/e2e/kube && $(GO) build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $(abspath $(@D))/ $(addprefix k8s.io/kubernetes/cmd/,$(KUBE_CMDS))

e2e: deps build fixtures image $(KUBE_BIN)/kubelet
	@scripts/install-deps.sh e2e
	$(GO) test -tags e2e -count=1 -v -timeout 30m ./test/e2e -args -kube-bin $(abspath $(KUBE_BIN)) \
		-image $(abspath bin/autoglm-ebpf-image.tar) -image-ref $(IMAGE_REPO):$(VERSION) \
		-fixtures $(abspath testdata/bin) -run-dir $(abspath bin/e2e/run)

clean:
	rm -rf bin testdata/bin
