// Package reason reads the ErrorInfo reason (api/moveapi's Error*) a node
// agent puts on its status, telling apart answers that share a gRPC code.
package reason

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
)

// Of is the reason of carve's ErrorInfo on err's status, or "".
func Of(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == moveapi.ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// CopyInProgress tells an ABORTED answer meaning an earlier call still
// copies into the volume (moveapi.ErrorCopyInProgress): progress, not a
// failure.
func CopyInProgress(err error) bool {
	return status.Code(err) == codes.Aborted && Of(err) == moveapi.ErrorCopyInProgress
}
