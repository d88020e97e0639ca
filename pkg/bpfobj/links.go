package bpfobj

import (
	"errors"
	"sync"

	"github.com/cilium/ebpf/link"
)

// CloseLinks closes links concurrently: each uprobe waits for an RCU grace
// period (about 100 ms) when removed, and concurrent waits share one.
func CloseLinks(links []link.Link) error {
	errs := make([]error, len(links))
	var wg sync.WaitGroup
	for i, l := range links {
		wg.Go(func() { errs[i] = l.Close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}
