package fdtrack

import (
	"slices"
	"testing"
)

func TestGroupTargets(t *testing.T) {
	var links []string
	for _, n := range []string{"a", "b", "c", "d"} {
		links = append(links, "/var/cache/tok/"+n+".json")
	}
	links = append(links, "/dev/null", "/dev/null", "/dev/null", "/dev/null", "/dev/null",
		"socket:[101]", "socket:[102]", "pipe:[7]", "anon_inode:[eventfd]", "/etc/hosts")
	got := groupTargets(links)
	want := []Target{{"/dev/null", 5}, {"/var/cache/tok/*.json", 4}, {"socket", 2}}
	if !slices.Equal(got, want) {
		t.Errorf("groupTargets = %v, want %v", got, want)
	}
	if got := groupTargets([]string{"anon_inode:[eventfd]", "anon_inode:[eventfd]", "pipe:[1]"}); !slices.Equal(got, []Target{{"eventfd", 2}, {"pipe", 1}}) {
		t.Errorf("anon kinds: %v", got)
	}
	if got := groupTargets(nil); len(got) != 0 {
		t.Errorf("no links: %v", got)
	}
}
