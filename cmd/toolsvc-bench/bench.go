package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/toolsvc/toolsvc/internal/config"
)

// Subjects, in the order the table lists them.
const (
	subjGRPC           = "grpc"
	subjHealth         = "health"
	subjMemoryNew      = "memory/new"
	subjMemoryReplay   = "memory/replay"
	subjPostgresNew    = "postgres/new"
	subjPostgresReplay = "postgres/replay"
	subjInsert         = "insert"
)

// env is everything the subjects run against; close stops and removes it.
type env struct {
	closers []func() error
	// insertConns is how many connections the INSERT floor holds (0
	// without Postgres).
	insertConns int
	database    string
	dbURL       string
}

func (e *env) onClose(f func() error) { e.closers = append(e.closers, f) }

// close undoes the setup in reverse order.
func (e *env) close() error {
	var errs []error
	for i := len(e.closers) - 1; i >= 0; i-- {
		errs = append(errs, e.closers[i]())
	}
	return errors.Join(errs...)
}

// setup starts the servers and opens the connections, and returns the
// subjects in table order.
func setup(ctx context.Context, o *options, run string, stderr io.Writer) (_ *env, _ []subject, err error) {
	e := &env{}
	defer func() {
		if err != nil {
			_ = e.close()
		}
	}()
	nconns := connsNeeded(o)
	grpcSubject := func(name, addr string) (subject, error) {
		cs, err := dial(addr, nconns)
		if err != nil {
			return subject{}, err
		}
		e.onClose(func() error { cs.close(); return nil })
		return subject{name: name, caller: func(_ context.Context, _, callers, i int) (func(context.Context) error, error) {
			return healthCall(cs.forCaller(i, callers, o.conns)), nil
		}}, nil
	}
	executeSubjects := func(store, addr string) (newKey, replay subject, err error) {
		cn, err := dial(addr, nconns)
		if err != nil {
			return subject{}, subject{}, err
		}
		e.onClose(func() error { cn.close(); return nil })
		cr, err := dial(addr, nconns)
		if err != nil {
			return subject{}, subject{}, err
		}
		e.onClose(func() error { cr.close(); return nil })
		newKey = subject{name: store + "/new", caller: func(_ context.Context, rep, callers, i int) (func(context.Context) error, error) {
			ec, err := newEchoCaller(cn.forCaller(i, callers, o.conns), o.tool, o.action)
			if err != nil {
				return nil, err
			}
			return newKeyCall(ec, keyPrefix(run+"n", rep, callers, i)), nil
		}}
		replay = subject{name: store + "/replay", caller: func(ctx context.Context, rep, callers, i int) (func(context.Context) error, error) {
			ec, err := newEchoCaller(cr.forCaller(i, callers, o.conns), o.tool, o.action)
			if err != nil {
				return nil, err
			}
			return replayCall(ctx, ec, keyPrefix(run+"r", rep, callers, i)+"replay")
		}}
		return newKey, replay, nil
	}

	var (
		mcpHC    *http.Client
		mcpTweak func(*config.Config)
		tweaks   []func(*config.Config)
		upURL    string
	)
	if !o.noMCP {
		up, hc, tweak, err := mcpSetup(e, o)
		if err != nil {
			return nil, nil, err
		}
		mcpHC, mcpTweak, upURL = hc, tweak, up.url
		tweaks = append(tweaks, mcpTweak)
	}
	frontDoor := func(name string, s *toolsvcServer) (subject, error) {
		u, err := s.frontDoorURL()
		if err != nil {
			return subject{}, err
		}
		return mcpSubject(e, name, u, mcpExported, mcpHC), nil
	}

	floor, err := startFloor()
	if err != nil {
		return nil, nil, fmt.Errorf("bare gRPC server: %w", err)
	}
	e.onClose(func() error { floor.stop(); return nil })
	mem, err := startToolsvc(ctx, "", tweaks...)
	if err != nil {
		return nil, nil, err
	}
	e.onClose(mem.stop)

	var subjects []subject
	s, err := grpcSubject(subjGRPC, floor.addr)
	if err != nil {
		return nil, nil, err
	}
	subjects = append(subjects, s)
	// toolsvc's health check is taken on the memory store's server: it is
	// answered from memory on either store, and this way it is measured
	// with --no-postgres too.
	if s, err = grpcSubject(subjHealth, mem.addr); err != nil {
		return nil, nil, err
	}
	subjects = append(subjects, s)
	mn, mr, err := executeSubjects("memory", mem.addr)
	if err != nil {
		return nil, nil, err
	}
	subjects = append(subjects, mn, mr)
	if !o.noMCP {
		fm, err := frontDoor(subjMCPMemory, mem)
		if err != nil {
			return nil, nil, err
		}
		subjects = append(subjects, mcpSubject(e, subjMCPDirect, upURL, mcpToolName, mcpHC), fm)
	}
	if o.noPostgres {
		return e, subjects, nil
	}

	db, err := createDatabase(ctx, o.databaseURL)
	if err != nil {
		return nil, nil, err
	}
	e.database = db.name
	e.onClose(db.drop)
	pg, err := startToolsvc(ctx, db.url, tweaks...)
	if err != nil {
		return nil, nil, err
	}
	e.onClose(pg.stop)
	e.dbURL = db.url
	if o.auditTrail > 0 {
		if err := fillTrail(ctx, db.url, o.auditTrail, o.trailDays, stderr); err != nil {
			return nil, nil, err
		}
	}
	pn, pr, err := executeSubjects("postgres", pg.addr)
	if err != nil {
		return nil, nil, err
	}
	subjects = append(subjects, pn, pr)
	if !o.noMCP {
		fp, err := frontDoor(subjMCPPostgres, pg)
		if err != nil {
			return nil, nil, err
		}
		subjects = append(subjects, fp)
	}

	maxCallers := 0
	for _, c := range o.callers {
		maxCallers = max(maxCallers, c)
	}
	// Headroom: the pool under test and whatever else uses the server.
	free, err := availableConnections(ctx, db.url, 40)
	if err != nil {
		return nil, nil, err
	}
	e.insertConns = min(maxCallers, o.insertConns, free)
	ins, err := openInsertFloor(ctx, db.url, e.insertConns)
	if err != nil {
		return nil, nil, err
	}
	e.onClose(func() error { ins.close(); return nil })
	subjects = append(subjects, subject{name: subjInsert, caller: func(_ context.Context, _, _, i int) (func(context.Context) error, error) {
		return ins.call(i), nil
	}})
	return e, subjects, nil
}

// bench runs every subject at every caller count, repetition after
// repetition, and reports; it returns how many calls failed.
func bench(ctx context.Context, o *options, stdout, stderr io.Writer) (failed uint64, err error) {
	started := time.Now().UTC()
	run := randomHex(4)
	e, subjects, err := setup(ctx, o, run, stderr)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := e.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	d := newDriver(o)
	var cells []cell
	for rep := range o.reps {
		for ci, callers := range o.callers {
			// Each (repetition, caller count) starts the rotation one
			// subject further on.
			k := rep*len(o.callers) + ci
			for j := range subjects {
				s := subjects[(k+j)%len(subjects)]
				c := d.measure(ctx, s, rep+1, callers)
				cells = append(cells, c)
				failed += c.Failed
				fmt.Fprintf(stderr, "rep %d/%d  callers %3d  %-16s %9.0f calls/s  p50 %-8s p99 %-8s failed %d%s\n",
					rep+1, o.reps, callers, s.name, c.CallsPerSec, fmtMicros(c.P50Micros), fmtMicros(c.P99Micros),
					c.Failed, errSuffix(c.Error))
				if ctx.Err() != nil {
					return failed, errors.New("interrupted")
				}
			}
		}
	}
	var retention []cell
	if o.auditTrail > 0 {
		for _, s := range subjects {
			if s.name != subjPostgresNew {
				continue
			}
			c, err := retentionCheck(ctx, d, s, o.reps+1, slices.Max(o.callers), o.trailDays, e.dbURL, stderr)
			if err != nil {
				return failed, err
			}
			failed += c.Failed
			retention = append(retention, c)
		}
	}
	r := newReport(o, e, started, subjects, cells)
	if o.json {
		return failed, r.writeJSON(stdout)
	}
	r.writeText(stdout)
	for _, c := range retention {
		fmt.Fprintf(stdout, "\nwhile retention removed the oldest day (see stderr): %s at %d callers %.0f calls/s, p50 %s, p99 %s\n",
			c.Subject, c.Callers, c.CallsPerSec, fmtMicros(c.P50Micros), fmtMicros(c.P99Micros))
	}
	return failed, nil
}

func errSuffix(msg string) string {
	if msg == "" {
		return ""
	}
	const limit = 200
	if len(msg) > limit {
		msg = msg[:limit] + "…"
	}
	return " (" + msg + ")"
}
