package app_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// While authentication is off the bound socket must be a loopback one,
// whatever the configured address looked like: the configuration is checked
// for a loopback name, but a name is resolved only when the socket is bound.
func TestListenRefusesANonLoopbackSocket(t *testing.T) {
	cfg := apptest.Config(t, apptest.Memory)
	a, err := app.New(context.Background(), cfg, app.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// As if "localhost" had resolved to every interface.
	cfg.Listen = "0.0.0.0:0"
	lis, err := a.Listen()
	if err == nil {
		lis.Close()
		t.Fatalf("listening on %s with authentication off", lis.Addr())
	}
	if !strings.Contains(err.Error(), "not a loopback address") || !strings.Contains(err.Error(), "authentication is off") {
		t.Fatalf("unclear refusal: %v", err)
	}
	// The loopback socket is accepted.
	cfg.Listen = "127.0.0.1:0"
	lis, err = a.Listen()
	if err != nil {
		t.Fatal(err)
	}
	lis.Close()
}

func TestCheckLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		ok   bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}, true},
		{&net.TCPAddr{IP: net.ParseIP("127.0.1.1"), Port: 1}, true},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 1}, true},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:127.0.0.1"), Port: 1}, true},
		{&net.TCPAddr{IP: net.ParseIP("0.0.0.0"), Port: 1}, false},
		{&net.TCPAddr{IP: net.ParseIP("::"), Port: 1}, false},
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 1}, false},
		{&net.UnixAddr{Name: "/tmp/x", Net: "unix"}, false},
	} {
		if err := app.CheckLoopback(tc.addr); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.addr, err)
		}
	}
}

// The listener holds at most server.max_connections connections open at
// once: the next is accepted only when one of them closes.
func TestListenCapsConnections(t *testing.T) {
	cfg := apptest.Config(t, apptest.Memory)
	cfg.Server.MaxConnections = 2
	a, err := app.New(context.Background(), cfg, app.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	lis, err := a.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	first, second := <-accepted, <-accepted
	select {
	case c := <-accepted:
		t.Fatalf("a third connection was accepted while two were open: %v", c.RemoteAddr())
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	select {
	case third := <-accepted:
		third.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the third connection was not accepted once one closed")
	}
	second.Close()
}
