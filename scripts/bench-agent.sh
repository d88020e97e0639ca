#!/usr/bin/env bash
# The agent's own CPU while it watches a process doing ~17 k file opens and
# ~9 k loopback connections a second (~40 k sockets in TIME_WAIT on the
# host), TCP sockets read from /proc/PID/net/tcp (before) and from sock_diag
# (after), runs alternating in one run. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run '^$' -bench 'AgentCPU' -benchtime 1x -timeout 30m ./pkg/pipeline/
