package metrics

import (
	"errors"
	"time"

	"google.golang.org/grpc/status"
)

// This file is the only one of the package that imports gRPC: it keeps
// ObservePhase for the controller's handlers until they time their phases
// with Begin and End, and then goes, with its test.

// ObservePhase records one phase; err is the error the RPC returned. New
// code uses Begin and Op.End, which take the result label from the caller.
func (r *Recorder) ObservePhase(phase, deviceClass string, d time.Duration, err error) {
	r.observePhase(phase, deviceClass, d, codeName(err))
}

// codeName is the gRPC code of err ("OK" for nil); errors without a status
// count as Internal, as grpc-go would send them.
func codeName(err error) string {
	if err == nil {
		return "OK"
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code().String()
	}
	return "Internal"
}
