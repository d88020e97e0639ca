package main

import (
	"errors"
	"testing"
)

func TestCobraUsage(t *testing.T) {
	for msg, want := range map[string]bool{
		`invalid argument "x" for "--interval" flag: time: invalid duration "x"`: true,
		`unknown flag: --nope`:                 true,
		`accepts at most 0 arg(s), received 1`: true,
		`loading fd BPF programs (tp_btf): map py_threads: map create: invalid argument`: false,
	} {
		if got := isCobraUsage(errors.New(msg)); got != want {
			t.Errorf("isCobraUsage(%q) = %v, want %v", msg, got, want)
		}
	}
}
