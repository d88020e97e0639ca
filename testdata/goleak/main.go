// goleak is a Go program that leaks files: RATE times a second for
// SECONDS, cacheShard opens a file and main keeps it. Its opening stack
// runs through os.Open (inlined into cacheShard), os.OpenFile and the Go
// runtime's syscall wrapper in a static executable; the site to name is
// cacheShard's line.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

var kept []*os.File

//go:noinline
func cacheShard(path string) *os.File {
	f, err := os.Open(path) // leak: open
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return f
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: goleak RATE SECONDS")
		os.Exit(2)
	}
	rate, err1 := strconv.Atoi(os.Args[1])
	secs, err2 := strconv.Atoi(os.Args[2])
	if err1 != nil || err2 != nil || rate <= 0 {
		fmt.Fprintln(os.Stderr, "usage: goleak RATE SECONDS")
		os.Exit(2)
	}
	fmt.Println("ready")
	end := time.Now().Add(time.Duration(secs) * time.Second)
	for t := time.NewTicker(time.Second / time.Duration(rate)); time.Now().Before(end); <-t.C {
		kept = append(kept, cacheShard("/dev/null"))
	}
}
