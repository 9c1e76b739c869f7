package server

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Config is the server's limits (keys under "server" in the configuration):
// message sizes, streams per connection, keepalive, watch streams, and how
// often grpc.health.v1 asks the store whether it is there.
type Config struct {
	// MaxRecvMessageBytes bounds a request message. A larger one is refused
	// inside the error contract (RESOURCE_EXHAUSTED MESSAGE_TOO_LARGE) up to
	// HardMessageLimit of it; beyond that gRPC refuses it unread (a bare
	// RESOURCE_EXHAUSTED), so that no request can make the server buffer
	// more.
	MaxRecvMessageBytes int `mapstructure:"max_recv_message_bytes"`
	// MaxSendMessageBytes bounds a response message: a larger answer is
	// replaced by RESOURCE_EXHAUSTED RESPONSE_TOO_LARGE. gRPC clients accept
	// 4 MiB by default; a larger value helps only clients that raise theirs.
	MaxSendMessageBytes int `mapstructure:"max_send_message_bytes"`
	// MaxConcurrentStreams bounds the calls (and watch streams) open at once
	// on one connection; a client past it waits for one to end.
	MaxConcurrentStreams int `mapstructure:"max_concurrent_streams"`
	// MaxWatchStreams bounds the watch streams (WatchApprovals,
	// WatchToolHealth) open on this server, all principals together.
	MaxWatchStreams int `mapstructure:"max_watch_streams"`
	// MaxWatchStreamsPerPrincipal bounds the watch streams one principal has
	// open on this server.
	MaxWatchStreamsPerPrincipal int `mapstructure:"max_watch_streams_per_principal"`
	// StoreProbeInterval is how often the store is pinged for
	// grpc.health.v1 (a request that finds the store unavailable turns it
	// NOT_SERVING at once; the next successful ping turns it back).
	StoreProbeInterval time.Duration `mapstructure:"store_probe_interval"`
	// Keepalive configures connection keepalive and its enforcement.
	Keepalive KeepaliveConfig `mapstructure:"keepalive"`
	// HandshakeTimeout bounds how long a new connection may take to set up
	// (TLS and the HTTP/2 preface) before it is closed: a peer that opens
	// sockets and never speaks holds a file descriptor for this long, not
	// for gRPC's default of two minutes.
	HandshakeTimeout time.Duration `mapstructure:"handshake_timeout"`
	// MaxConnections bounds the connections open at once on the gRPC
	// listener (the toolsvc main package wraps it in a limit); past it, new
	// connections wait in the kernel's accept queue until one closes. Keep
	// it well below the process's file descriptor limit.
	MaxConnections int `mapstructure:"max_connections"`
}

// KeepaliveConfig configures keepalive pings: the server's own (to find
// dead peers and keep idle connections through proxies) and what it allows
// clients.
type KeepaliveConfig struct {
	// Time: an idle connection is pinged after this long.
	Time time.Duration `mapstructure:"time"`
	// Timeout: a connection whose ping is not answered within this is closed.
	Timeout time.Duration `mapstructure:"timeout"`
	// MinTime: a client pinging more often than this is sent GOAWAY
	// ("too_many_pings") and disconnected.
	MinTime time.Duration `mapstructure:"min_time"`
	// PermitWithoutStream allows client pings on a connection without an
	// open call (a client waiting between calls keeps its connection warm).
	PermitWithoutStream bool `mapstructure:"permit_without_stream"`
	// MaxConnectionIdle closes a connection without calls for this long;
	// 0: never.
	MaxConnectionIdle time.Duration `mapstructure:"max_connection_idle"`
	// MaxConnectionAge closes a connection after this long (clients
	// reconnect, which spreads them over replicas again); 0: never.
	MaxConnectionAge time.Duration `mapstructure:"max_connection_age"`
	// MaxConnectionAgeGrace is how long calls open when MaxConnectionAge
	// passes may still finish; 0: without bound.
	MaxConnectionAgeGrace time.Duration `mapstructure:"max_connection_age_grace"`
}

// Defaults of Config.
const (
	// DefaultMaxMessageBytes is gRPC's own default receive limit, and what
	// gRPC clients accept by default: a larger response would be refused by
	// them.
	DefaultMaxMessageBytes = 4 << 20
	// DefaultMaxConcurrentStreams is Go's HTTP/2 server default.
	DefaultMaxConcurrentStreams     = 250
	DefaultMaxWatchStreams          = 1000
	DefaultMaxWatchStreamsPrincipal = 16
	DefaultStoreProbeInterval       = time.Second
	// DefaultHandshakeTimeout is enough for a TLS handshake across the
	// world, and short enough that idle sockets do not pile up.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultMaxConnections leaves room below the common file descriptor
	// limit of 1024 for the database pool, the operations port and logs
	// (agents hold a connection each and multiplex their calls on it).
	DefaultMaxConnections = 900
)

// Bounds of the message limits: below the minimum no real request fits;
// HardMessageLimit of the maximum must stay within an int32 (gRPC's frame
// length).
const (
	minMessageBytes = 64 << 10
	maxMessageBytes = 256 << 20
)

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		MaxRecvMessageBytes:         DefaultMaxMessageBytes,
		MaxSendMessageBytes:         DefaultMaxMessageBytes,
		MaxConcurrentStreams:        DefaultMaxConcurrentStreams,
		MaxWatchStreams:             DefaultMaxWatchStreams,
		MaxWatchStreamsPerPrincipal: DefaultMaxWatchStreamsPrincipal,
		StoreProbeInterval:          DefaultStoreProbeInterval,
		HandshakeTimeout:            DefaultHandshakeTimeout,
		MaxConnections:              DefaultMaxConnections,
		Keepalive: KeepaliveConfig{
			// Often enough to outlive the idle timeouts of load balancers
			// (typically 60–350 s) and to find a vanished watcher in about a
			// minute and a half.
			Time:    time.Minute,
			Timeout: 20 * time.Second,
			// Clients commonly ping every 10–30 s; gRPC's own 5 min would
			// disconnect them.
			MinTime:             10 * time.Second,
			PermitWithoutStream: true,
		},
	}
}

// HardMessageLimit is the size past which gRPC itself refuses a message,
// before toolsvc sees it: four times limit. Messages between limit and it
// are read and then refused inside the error contract; it keeps a sender
// from making the server buffer an arbitrary amount.
func HardMessageLimit(limit int) int {
	return int(min(int64(limit)*4, math.MaxInt32))
}

// Validate reports every problem, each naming its key under "server".
func (c Config) Validate() error {
	var errs []error
	add := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("server.%s: "+format, append([]any{key}, args...)...))
	}
	for key, v := range map[string]int{"max_recv_message_bytes": c.MaxRecvMessageBytes, "max_send_message_bytes": c.MaxSendMessageBytes} {
		if v < minMessageBytes || v > maxMessageBytes {
			add(key, "must be from %d (64 KiB) to %d (256 MiB) bytes, not %d", minMessageBytes, maxMessageBytes, v)
		}
	}
	if c.MaxConcurrentStreams < 1 || c.MaxConcurrentStreams > math.MaxInt32 {
		add("max_concurrent_streams", "must be positive, not %d", c.MaxConcurrentStreams)
	}
	if c.MaxWatchStreams < 1 {
		add("max_watch_streams", "must be positive, not %d", c.MaxWatchStreams)
	}
	switch {
	case c.MaxWatchStreamsPerPrincipal < 1:
		add("max_watch_streams_per_principal", "must be positive, not %d", c.MaxWatchStreamsPerPrincipal)
	case c.MaxWatchStreams >= 1 && c.MaxWatchStreamsPerPrincipal > c.MaxWatchStreams:
		add("max_watch_streams_per_principal", "must be at most max_watch_streams (%d), not %d", c.MaxWatchStreams, c.MaxWatchStreamsPerPrincipal)
	}
	if c.StoreProbeInterval < 10*time.Millisecond {
		add("store_probe_interval", "must be at least 10ms, not %s", c.StoreProbeInterval)
	}
	if c.HandshakeTimeout < 100*time.Millisecond || c.HandshakeTimeout > 2*time.Minute {
		add("handshake_timeout", "must be from 100ms to 2m, not %s", c.HandshakeTimeout)
	}
	if c.MaxConnections < 1 {
		add("max_connections", "must be positive, not %d", c.MaxConnections)
	}
	k := c.Keepalive
	// gRPC raises a keepalive time or timeout below a second to a second.
	if k.Time < time.Second {
		add("keepalive.time", "must be at least 1s, not %s", k.Time)
	}
	if k.Timeout < time.Second {
		add("keepalive.timeout", "must be at least 1s, not %s", k.Timeout)
	}
	for key, v := range map[string]time.Duration{
		"keepalive.min_time": k.MinTime, "keepalive.max_connection_idle": k.MaxConnectionIdle,
		"keepalive.max_connection_age": k.MaxConnectionAge, "keepalive.max_connection_age_grace": k.MaxConnectionAgeGrace,
	} {
		if v < 0 {
			add(key, "must not be negative (0: off), not %s", v)
		}
	}
	return sortedJoin(errs)
}

// sortedJoin joins errs in the order of their text, so that problems found
// by ranging over maps are reported the same way every time.
func sortedJoin(errs []error) error {
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}
