package procinfo

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestRealThreadName(t *testing.T) {
	fs := realFS(t)
	// Name a thread of this process, as pthread_setname_np does.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old, err := fs.ThreadName(os.Getpid(), unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	setName := func(s string) error {
		p, err := unix.BytePtrFromString(s)
		if err != nil {
			return err
		}
		return unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(p)), 0, 0, 0)
	}
	if err := setName("named-worker"); err != nil {
		t.Fatal(err)
	}
	defer setName(old)
	if got, err := fs.ThreadName(os.Getpid(), unix.Gettid()); err != nil || got != "named-worker" {
		t.Errorf("ThreadName = %q, %v; want named-worker", got, err)
	}
	// A thread that does not exist (tids never reach 2^22 by default).
	if _, err := fs.ThreadName(os.Getpid(), 1<<22+1); !errors.Is(err, ErrNoProcess) {
		t.Errorf("ThreadName of a missing thread: %v, want ErrNoProcess", err)
	}
}

func TestAllowedCPUs(t *testing.T) {
	// The Go runtime sizes itself from the same affinity mask.
	if n, err := AllowedCPUs(os.Getpid()); err != nil || n != runtime.NumCPU() {
		t.Errorf("AllowedCPUs(self) = %d, %v; want %d", n, err, runtime.NumCPU())
	}
	if _, err := AllowedCPUs(1<<22 + 1); !errors.Is(err, ErrNoProcess) {
		t.Errorf("AllowedCPUs of a missing pid: %v, want ErrNoProcess", err)
	}
}
