// Package dbproxy is a TCP proxy in front of a test database that can cut
// it off, as a database restart or a network partition would: Down closes
// every forwarded connection and refuses new ones, Up lets them through
// again. Tests use it to take Postgres away from running servers without
// touching the shared database server.
package dbproxy

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a database server and can cut the
// database off: Down closes its listener and every forwarded connection, so
// that open connections break and new ones are refused, as when the
// database's host goes away; Up listens again on the same address.
type Proxy struct {
	t      testing.TB
	target string
	addr   string

	mu    sync.Mutex
	lis   net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// New starts a proxy to the server of dbURL and returns it with dbURL
// rewritten to go through it. It stops when the test ends.
func New(t testing.TB, dbURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, target: u.Host, conns: map[net.Conn]bool{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = lis.Addr().String()
	p.serve(lis)
	t.Cleanup(func() {
		p.Down()
		p.wg.Wait()
	})
	u.Host = p.addr
	return p, u.String()
}

func (p *Proxy) serve(lis net.Listener) {
	p.mu.Lock()
	p.lis = lis
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.forward(c)
		}
	}()
}

func (p *Proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.lis == nil { // went down meanwhile
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	pipe := func(dst, src net.Conn) {
		defer p.wg.Done()
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}
	p.wg.Add(2)
	go pipe(c, up)
	go pipe(up, c)
}

// Down cuts the database off.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lis != nil {
		p.lis.Close()
		p.lis = nil
	}
	for c := range p.conns {
		c.Close()
	}
}

// Up lets connections through again.
func (p *Proxy) Up() {
	p.t.Helper()
	lis, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy: listen again on %s: %v", p.addr, err)
	}
	p.serve(lis)
}
