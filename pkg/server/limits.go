package server

import (
	"errors"
	"fmt"

	"google.golang.org/grpc"
)

// GRPCLimits bound what one gRPC connection may make the server hold before
// any of its calls is authenticated: grpc-go's own defaults are a 16 MiB
// header list and no limit on concurrent streams.
type GRPCLimits struct {
	// MaxHeaderListBytes bounds a call's metadata (the bearer token
	// included; MaxAuthorizationBytes bounds that alone): the transport
	// refuses a larger header list before any interceptor runs. Default
	// 64 KiB (DefaultMaxHeaderListBytes); at least 16 KiB, at most 16 MiB.
	MaxHeaderListBytes int
	// MaxConcurrentStreams bounds the calls in flight on one connection
	// (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a client's further calls
	// wait for one to end. Default 256 (DefaultMaxConcurrentStreams), far
	// above what a service's own clients keep in flight per connection.
	MaxConcurrentStreams int
}

// Defaults and bounds of GRPCLimits.
const (
	DefaultMaxHeaderListBytes   = 64 << 10
	DefaultMaxConcurrentStreams = 256
	minHeaderListBytes          = 16 << 10 // a token of MaxAuthorizationBytes and the rest
	maxHeaderListBytes          = 16 << 20 // grpc-go's default
)

// WithDefaults returns l with its zero fields at their defaults.
func (l GRPCLimits) WithDefaults() GRPCLimits {
	if l.MaxHeaderListBytes == 0 {
		l.MaxHeaderListBytes = DefaultMaxHeaderListBytes
	}
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	return l
}

// Validate reports limits out of range; zero fields are defaults.
func (l GRPCLimits) Validate() error {
	var errs []error
	if h := l.MaxHeaderListBytes; h != 0 && (h < minHeaderListBytes || h > maxHeaderListBytes) {
		errs = append(errs, fmt.Errorf("gRPC max header list bytes %d: want %d to %d", h, minHeaderListBytes, maxHeaderListBytes))
	}
	if s := l.MaxConcurrentStreams; s < 0 || s > 1<<20 {
		errs = append(errs, fmt.Errorf("gRPC max concurrent streams %d: want 1 to %d (0: default %d)", s, 1<<20, DefaultMaxConcurrentStreams))
	}
	return errors.Join(errs...)
}

// serverOptions are the limits as gRPC server options; l must be valid.
func (l GRPCLimits) serverOptions() []grpc.ServerOption {
	l = l.WithDefaults()
	return []grpc.ServerOption{
		grpc.MaxHeaderListSize(uint32(l.MaxHeaderListBytes)),
		grpc.MaxConcurrentStreams(uint32(l.MaxConcurrentStreams)),
	}
}
