// Package lvminner holds tests of the lvm package that run INSIDE the qemu
// guest, where device-mapper exists: activation, thin pools, thin
// snapshots, online extension and filesystems on created LVs, and the
// package-against-raw-lvm benchmarks. The files are behind the guestinner
// build tag; test/guest builds them with `go test -c` on the host and runs
// the binary in the guest. Nothing else runs them.
package lvminner
