// Command lvmcount runs an lvm command and notes that it ran. make
// bench-peers puts it in front of lvm in TopoLVM's lvm-command-prefix, to
// count the LVM commands topolvm-node runs (carve counts its own in its
// metrics). Usage: lvmcount LOG LVM ARGS...: it appends the time and
// ARGS[0] (the subcommand) as one line to LOG, then replaces itself with
// LVM ARGS...
package main

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: lvmcount LOG LVM [ARGS...]")
		os.Exit(2)
	}
	sub := "-"
	if len(os.Args) > 3 {
		sub = os.Args[3]
	}
	if err := note(os.Args[1], fmt.Sprintf("%d %s\n", time.Now().UnixNano(), sub)); err != nil {
		fmt.Fprintf(os.Stderr, "lvmcount: %v\n", err)
		os.Exit(1)
	}
	err := syscall.Exec(os.Args[2], os.Args[2:], os.Environ())
	fmt.Fprintf(os.Stderr, "lvmcount: exec %s: %v\n", os.Args[2], err)
	os.Exit(1)
}

// note appends line to the file at path; one write with O_APPEND, so
// commands run at once do not mix their lines.
func note(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
