package engine

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
)

// RequestCounter counts the requests an etcd client sends, by operation
// (range, put, txn, lease_keep_alive, watch, ...), to show that steady
// state costs etcd a number of requests independent of the fire rate
// (docs/design.md invariant 5). Install it with DialOptions on the client:
//
//	clientv3.Config{DialOptions: rc.DialOptions(), ...}
//
// It is safe for concurrent use.
type RequestCounter struct {
	counts sync.Map // operation -> *atomic.Uint64
}

// DialOptions returns the interceptors to pass to clientv3.Config.
func (c *RequestCounter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.add(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
			method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.add(method)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil || !desc.ClientStreams {
				return s, err
			}
			return &countedStream{ClientStream: s, c: c, op: opName(method)}, nil
		}),
	}
}

// countedStream counts each message sent on a client stream (keep-alives,
// watch creations) as one request.
type countedStream struct {
	grpc.ClientStream
	c  *RequestCounter
	op string
}

func (s *countedStream) SendMsg(m any) error {
	s.c.inc(s.op)
	return s.ClientStream.SendMsg(m)
}

func (c *RequestCounter) add(method string) { c.inc(opName(method)) }

func (c *RequestCounter) inc(op string) {
	v, ok := c.counts.Load(op)
	if !ok {
		v, _ = c.counts.LoadOrStore(op, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
}

// opName turns "/etcdserverpb.KV/Range" into "range" and
// "/etcdserverpb.Lease/LeaseKeepAlive" into "lease_keep_alive".
func opName(method string) string {
	name := method[strings.LastIndexByte(method, '/')+1:]
	var b strings.Builder
	for i, r := range name {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Counts returns the requests sent so far, by operation.
func (c *RequestCounter) Counts() map[string]uint64 {
	out := map[string]uint64{}
	c.counts.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}
