package csiserver

import (
	"context"
	"errors"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// LoggingInterceptor logs calls with secrets stripped (payloads at V(5), outcome at V(2),
// failures always) and gives handlers a logger carrying the method.
func LoggingInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return loggingInterceptor(nil)(ctx, req, info, handler)
}

// loggingInterceptor logs no payload of the quiet methods.
func loggingInterceptor(quiet map[string]bool) grpc.UnaryServerInterceptor {
	payload := func(method string, msg any) any {
		if quiet[method] {
			return "(not logged: it carries credentials)"
		}
		return protosanitizer.StripSecrets(msg)
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		logger := klog.FromContext(ctx).WithValues("method", info.FullMethod)
		ctx = klog.NewContext(ctx, logger)
		logger.V(5).Info("GRPC call", "request", payload(info.FullMethod, req))
		start := time.Now()
		resp, err := handler(ctx, req)
		d := time.Since(start)
		if err != nil && answersAbsence(info.FullMethod, err) {
			logger.V(2).Info("GRPC call answered NotFound", "err", err, "duration", d)
			return resp, err
		}
		if err != nil {
			logger.Error(err, "GRPC call failed", "code", status.Code(err).String(), "duration", d,
				"request", payload(info.FullMethod, req))
			return resp, err
		}
		logger.V(2).Info("GRPC call succeeded", "duration", d)
		logger.V(5).Info("GRPC response", "response", payload(info.FullMethod, resp))
		return resp, nil
	}
}

// answersAbsence tells the NotFound agents answer the controller's search for a volume.
func answersAbsence(method string, err error) bool {
	return method == "/csi.v1.Controller/ValidateVolumeCapabilities" && status.Code(err) == codes.NotFound
}

// StreamLoggingInterceptor gives a stream a logger carrying the method and logs its
// start, end and failure, not its messages.
func StreamLoggingInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	logger := klog.FromContext(ss.Context()).WithValues("method", info.FullMethod)
	logger.V(2).Info("GRPC stream opened")
	start := time.Now()
	err := handler(srv, loggedStream{ServerStream: ss, ctx: klog.NewContext(ss.Context(), logger)})
	d := time.Since(start)
	if err != nil {
		logger.Error(err, "GRPC stream failed", "code", status.Code(err).String(), "duration", d)
		return err
	}
	logger.V(2).Info("GRPC stream ended", "duration", d)
	return nil
}

type loggedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s loggedStream) Context() context.Context { return s.ctx }

// MetricsInterceptor records csi_plugin_operations_seconds as the sidecars do theirs.
func MetricsInterceptor(m csimetrics.CSIMetricsManager) grpc.UnaryServerInterceptor {
	return connection.ExtendedCSIMetricsManager{CSIMetricsManager: m}.RecordMetricsServerInterceptor
}

// ResultOf is the gRPC code's name ("OK" for nil), kept at the edge so internal/metrics
// needs no gRPC.
func ResultOf(err error) string {
	if err == nil {
		return "OK"
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code().String()
	}
	return "Internal"
}
