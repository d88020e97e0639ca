// Package launch starts a command held just before its exec, so that probes
// can be in place for the process (same pid) before the command's first
// instruction runs.
package launch

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// gate is a POSIX shell that waits for one line on fd 3, closes it and execs
// the command in place (keeping its pid). If we go away without releasing it,
// read fails on EOF and the command never runs untraced.
const gate = `read _ <&3 || exit 125; exec 3<&-; exec "$@"`

// Gated is a started, held command.
type Gated struct {
	Cmd *exec.Cmd
	w   *os.File
}

// Start starts argv held at the gate. The caller sets up tracking of
// g.Cmd.Process.Pid, then calls Release.
func Start(argv []string, stdin, stdout, stderr *os.File) (*Gated, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command given")
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return nil, fmt.Errorf("command %q: %w", argv[0], err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", gate, "sh"}, argv...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.ExtraFiles = []*os.File{r}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("starting %q: %w", argv[0], err)
	}
	r.Close()
	return &Gated{Cmd: cmd, w: w}, nil
}

// Release lets the command exec.
func (g *Gated) Release() error {
	defer g.w.Close()
	_, err := g.w.Write([]byte("go\n"))
	return err
}

// Abort kills the held command without letting it run.
func (g *Gated) Abort() {
	g.w.Close()
	_ = g.Cmd.Process.Kill()
	_ = g.Cmd.Wait()
}
