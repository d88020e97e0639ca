package testutil

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Chromium returns the path of a Chromium to render pages with
// (scripts/install-deps.sh test installs Debian's). Without one the test is
// skipped, but in CI (CI set) it fails: the browser tests must run there.
func Chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed: run scripts/install-deps.sh test")
	}
	t.Skip("chromium is not installed (scripts/install-deps.sh test installs it; runs in CI)")
	return ""
}

// Headless opens a local file in headless Chromium, with a fresh profile
// and every background network feature off, and returns what it printed
// on standard output; args say what to do (--dump-dom, --screenshot=...).
func Headless(t testing.TB, browser, file string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatal(err)
	}
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, browser, append(append(flags, args...), "file://"+abs)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// Screenshot renders a local file in headless Chromium at width x height
// and returns the image.
func Screenshot(t testing.TB, browser, file string, width, height int) image.Image {
	t.Helper()
	out := filepath.Join(t.TempDir(), "shot.png")
	Headless(t, browser, file, "--screenshot="+out, "--window-size="+strconv.Itoa(width)+","+strconv.Itoa(height), "--hide-scrollbars")
	f, err := os.Open(out)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decoding the screenshot: %v", err)
	}
	return img
}
