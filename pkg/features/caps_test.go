package features

import (
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMissingCaps(t *testing.T) {
	bit := func(caps ...uint) (m uint64) {
		for _, c := range caps {
			m |= 1 << c
		}
		return m
	}
	for _, tc := range []struct {
		eff  uint64
		want []string
	}{
		{0, []string{"CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}},
		{bit(unix.CAP_BPF, unix.CAP_PERFMON, unix.CAP_SYS_PTRACE, unix.CAP_DAC_READ_SEARCH), nil},
		// Before 5.8, CAP_SYS_ADMIN held the BPF and perf rights.
		{bit(unix.CAP_SYS_ADMIN, unix.CAP_SYS_PTRACE, unix.CAP_DAC_READ_SEARCH), nil},
		{bit(unix.CAP_BPF, unix.CAP_PERFMON, unix.CAP_DAC_READ_SEARCH), []string{"CAP_SYS_PTRACE"}},
	} {
		if got := missingCaps(tc.eff); !slices.Equal(got, tc.want) {
			t.Errorf("missingCaps(%#x) = %v, want %v", tc.eff, got, tc.want)
		}
	}
}
