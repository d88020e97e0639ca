package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"testing"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// documented are the files whose shell blocks (```sh) give commands to run:
// the runbooks above all, which an operator follows under an alert.
var documented = []string{"../../docs/runbooks.md", "../../deploy/README.md", "../../README.md"}

// Every autoglm-ebpf invocation in the documentation's shell blocks names a
// subcommand and flags the command tree has, with values its flags accept:
// renaming or dropping a flag fails here until the docs follow.
func TestDocumentedInvocations(t *testing.T) {
	for _, doc := range documented {
		calls, err := documentedCalls(doc)
		if err != nil {
			t.Fatal(err)
		}
		// A file whose blocks stopped being found (another fence language,
		// say) would pass with nothing checked.
		if len(calls) == 0 {
			t.Errorf("%s: no autoglm-ebpf invocation found in its ```sh blocks", doc)
		}
		t.Logf("%s: %d invocations", doc, len(calls))
		for _, c := range calls {
			if err := checkInvocation(c.args); err != nil {
				t.Errorf("%s:%d: autoglm-ebpf %s: %v", doc, c.line, strings.Join(c.args, " "), err)
			}
		}
	}
}

// The check refuses what the tool would refuse.
func TestCheckInvocation(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"attach", "--pid", "1", "--duration", "30s", "--json", "-"}, true},
		{[]string{"--log.level", "debug", "check"}, true},
		{[]string{"daemon", "--listen", ":9464"}, true}, // the old spelling
		{[]string{"run", "--", "python", "serve.py"}, true},
		{[]string{"attach", "--pidd", "1"}, false},
		{[]string{"attach", "--pid", "1", "--duration", "soon"}, false},
		{[]string{"attahc", "--pid", "1"}, false},
		{[]string{"report"}, false},
		{[]string{"check", "extra"}, false},
		{nil, false},
	} {
		if err := checkInvocation(tc.args); (err == nil) != tc.ok {
			t.Errorf("checkInvocation(%q) = %v, want ok %v", tc.args, err, tc.ok)
		}
	}
}

// checkInvocation parses args (what follows autoglm-ebpf) with a fresh
// command tree as execute would, without running anything.
func checkInvocation(args []string) error {
	root := newRoot()
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if cmd == root {
		return fmt.Errorf("no subcommand")
	}
	// Find strips the path to cmd but leaves flags given before it (root's
	// persistent ones) in rest: parsing them here takes them too.
	if err := cmd.ParseFlags(rest); err != nil {
		return err
	}
	return cmd.ValidateArgs(cmd.Flags().Args())
}

// call is one autoglm-ebpf invocation in a document.
type call struct {
	line int
	args []string
}

// documentedCalls finds the autoglm-ebpf invocations in doc's ```sh
// blocks and in its inline code (`autoglm-ebpf check`, wrapped across
// lines or not): as a command, after sudo, or after the -- of kubectl exec
// and kubectl debug. Shell variables and command substitutions stand for
// values the reader fills in; they expand to "1", which every flag of the
// tree that takes a placeholder (a pid, a count) accepts.
func documentedCalls(doc string) ([]call, error) {
	f, err := os.Open(doc)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var calls []call
	sc := bufio.NewScanner(f)
	var block strings.Builder
	in, shell, start, n := false, false, 0, 0
	var prose []string // the document's lines, blank inside code blocks
	for sc.Scan() {
		n++
		line := sc.Text()
		fence := strings.TrimSpace(line)
		switch {
		case !in && strings.HasPrefix(fence, "```"):
			lang := strings.TrimPrefix(fence, "```")
			in, shell, start = true, lang == "sh" || lang == "bash", n+1
			block.Reset()
		case in && fence == "```":
			in = false
			if !shell {
				break
			}
			got, err := shellCalls(block.String(), start)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", doc, err)
			}
			calls = append(calls, got...)
		case in:
			block.WriteString(line + "\n")
		default:
			prose = append(prose, line)
			continue
		}
		prose = append(prose, "")
	}
	if in {
		return nil, fmt.Errorf("%s:%d: code block not closed", doc, start-1)
	}
	return append(calls, inlineCalls(prose)...), sc.Err()
}

// inlineCalls finds invocations in the inline code of prose, a document's
// lines outside its code blocks. Inline code that is not shell (a
// PromQL selector, a path) is no invocation, nor the tool's bare name.
func inlineCalls(prose []string) []call {
	var calls []call
	text := strings.Join(prose, "\n")
	for i := 0; ; {
		open := strings.IndexByte(text[i:], '`')
		if open < 0 {
			return calls
		}
		open += i
		end := strings.IndexByte(text[open+1:], '`')
		if end < 0 {
			return calls
		}
		end += open + 1
		span := strings.ReplaceAll(text[open+1:end], "\n", " ")
		line := 1 + strings.Count(text[:open], "\n")
		if strings.Contains(span, "autoglm-ebpf") {
			got, err := shellCalls(span, line)
			for _, c := range got {
				// `autoglm-ebpf` alone names the tool.
				if err == nil && len(c.args) > 0 {
					calls = append(calls, c)
				}
			}
		}
		i = end + 1
	}
}

// shellCalls parses one block of shell, which starts at line first.
func shellCalls(src string, first int) ([]call, error) {
	file, err := syntax.NewParser().Parse(strings.NewReader(src), "")
	if err != nil {
		return nil, fmt.Errorf("line %d: not valid shell: %w", first, err)
	}
	cfg := &expand.Config{
		Env: expand.FuncEnviron(func(name string) string {
			if name == "IFS" { // unset: fields split as a shell's default
				return ""
			}
			return "1"
		}),
		CmdSubst: func(w io.Writer, _ *syntax.CmdSubst) error {
			_, err := io.WriteString(w, "1")
			return err
		},
	}
	var calls []call
	syntax.Walk(file, func(n syntax.Node) bool {
		ce, ok := n.(*syntax.CallExpr)
		if !ok || err != nil {
			return err == nil
		}
		var args []string
		if args, err = expand.Fields(cfg, ce.Args...); err != nil {
			err = fmt.Errorf("line %d: %w", first+int(ce.Pos().Line())-1, err)
			return false
		}
		for i, a := range args {
			if path.Base(a) == "autoglm-ebpf" && (i == 0 || args[i-1] == "sudo" || args[i-1] == "--") {
				calls = append(calls, call{line: first + int(ce.Pos().Line()) - 1, args: args[i+1:]})
				break
			}
		}
		return true
	})
	return calls, err
}
