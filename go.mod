module github.com/open-autoglm/autoglm-ebpf

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/procfs v0.23.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
