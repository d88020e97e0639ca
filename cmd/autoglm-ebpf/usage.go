package main

import "strings"

// isCobraUsage recognises cobra's own argument errors (unknown command,
// wrong number of arguments), which it returns as plain errors. They start
// the message: a runtime error quoting EINVAL ("map create: invalid
// argument") is no usage error.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires at least", "invalid argument"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
