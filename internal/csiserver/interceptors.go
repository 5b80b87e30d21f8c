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

// LoggingInterceptor logs every call through klog with its secrets
// stripped: the request and response at verbosity 5 (they can be large),
// failures always, and the outcome and duration at verbosity 2. Handlers
// find a logger carrying the method in their context (klog.FromContext).
func LoggingInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return loggingInterceptor(nil)(ctx, req, info, handler)
}

// loggingInterceptor is LoggingInterceptor that logs no request or
// response of the quiet methods.
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

// answersAbsence tells whether err is the expected answer of a call that
// asks whether a volume is here: carve controller asks every node agent
// with ValidateVolumeCapabilities when no PersistentVolume names a
// volume's node, and all but one answer NotFound.
func answersAbsence(method string, err error) bool {
	return method == "/csi.v1.Controller/ValidateVolumeCapabilities" && status.Code(err) == codes.NotFound
}

// StreamLoggingInterceptor gives a stream's handler a logger carrying the
// method (klog.FromContext of the stream's context), and logs the stream's
// start and end at verbosity 2 and its failure always. Messages are not
// logged.
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

// loggedStream is a stream whose context carries the method's logger.
type loggedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s loggedStream) Context() context.Context { return s.ctx }

// MetricsInterceptor records csi_plugin_operations_seconds for every call
// with csi-lib-utils' server interceptor, so carve's metric matches the
// sidecars' csi_sidecar_operations_seconds.
func MetricsInterceptor(m csimetrics.CSIMetricsManager) grpc.UnaryServerInterceptor {
	return connection.ExtendedCSIMetricsManager{CSIMetricsManager: m}.RecordMetricsServerInterceptor
}

// ResultOf is the result label of carve's phase metrics for the error a
// call returns: the name of its gRPC code ("OK" for nil). An error without
// a status counts as Internal, as grpc-go would send it. The mapping lives
// here, at the edge, so that internal/metrics needs no gRPC.
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
