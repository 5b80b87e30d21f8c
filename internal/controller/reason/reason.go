// Package reason reads why a node agent refused a call: the ErrorInfo
// reason (api/moveapi's Error* constants) the agent puts on its status,
// which tells apart answers that share a gRPC code.
package reason

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
)

// Of is the reason of the ErrorInfo of carve's domain on err's status,
// or "".
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

// CopyInProgress tells an ABORTED answer that says the volume's data is
// still being copied into it by an earlier call (moveapi.ErrorCopyInProgress):
// progress, not a failure. ABORTED for anything else (another operation on
// the volume, an agent that does not say why) is not.
func CopyInProgress(err error) bool {
	return status.Code(err) == codes.Aborted && Of(err) == moveapi.ErrorCopyInProgress
}
