// Package peers measures carve against TopoLVM, the driver users would
// otherwise pick, in one run on the end-to-end test bed (make bench-peers,
// tag peers): the same control plane, the same simulated nodes, volume
// groups of the same sizes on loop devices, the same workload, the two
// drivers alternating; it prints each figure for both and their ratio.
// TopoLVM is built from the Go module proxy at the release pinned in
// test/tools/topolvm (hack/topolvm.sh) and runs with its own chart's flags in
// the mode its docs recommend with storage capacity tracking: a central
// csi-provisioner with --enable-capacity, no scheduler extender.
package peers
