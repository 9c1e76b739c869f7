package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/server"
)

// Exit codes of the client commands, beyond those in main.go.
const (
	exitWaiting = 3 // the call waits on a person: an approval or a preview
	exitRPC     = 4 // the server (or the connection to it) answered an error
	// exitUnknown: the outcome is UNKNOWN, the tool may have acted (or
	// not). Not a failure to retry blindly: find out first.
	exitUnknown = 5
)

// exitError ends a command with an exit code. The command has already
// printed what the person needs to know, so run prints nothing more.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Client flag names and defaults.
const (
	flagAddr      = "addr"
	flagPrincipal = "principal"
	flagTimeout   = "timeout"
	flagOutput    = "output"

	defaultAddr    = "127.0.0.1:50051"
	defaultTimeout = 30 * time.Second

	envAddr      = config.EnvPrefix + "_ADDR"
	envPrincipal = config.EnvPrefix + "_PRINCIPAL"

	outputTable = "table"
	outputJSON  = "json"
)

// clientFlags are the connection flags every client command takes. They are
// persistent flags of each top-level client command (call, calls, tools,
// approvals, health, audit), so they go anywhere on its command line.
type clientFlags struct {
	addr      string
	principal string
	timeout   time.Duration
	output    string
	access    accessFlags
}

func addClientFlags(cmd *cobra.Command) *clientFlags {
	f := &clientFlags{}
	fs := cmd.PersistentFlags()
	fs.StringVar(&f.addr, flagAddr, defaultAddr, "address of the toolsvc server (or "+envAddr+")")
	fs.StringVar(&f.principal, flagPrincipal, "", "principal to act as while the server's authentication is off, sent as "+auth.PrincipalHeader+" metadata (or "+envPrincipal+"; default: the server's, \"dev\")")
	fs.DurationVar(&f.timeout, flagTimeout, defaultTimeout, "deadline of each request to the server")
	fs.StringVarP(&f.output, flagOutput, "o", outputTable, "output format: table (for people) or json (protojson of the response, for scripts)")
	f.access.register(fs)
	return f
}

// client is a connection to a toolsvc server with the settings of one
// command invocation.
type client struct {
	conn      *grpc.ClientConn
	addr      string
	principal string // empty: the server's default
	access    accessFlags
	timeout   time.Duration
	json      bool
	stdout    io.Writer
	stderr    io.Writer
	// ctx carries the principal metadata and the command's cancellation.
	ctx context.Context
}

// connect resolves the flags against the environment (a flag given wins over
// its variable) and opens a connection. The connection is lazy: a server
// that is down shows up as the first request's UNAVAILABLE error.
func (f *clientFlags) connect(cmd *cobra.Command, lookupEnv env) (*client, error) {
	fs := cmd.Flags()
	addr, principal := f.addr, f.principal
	lookupEnv.fill(fs, flagAddr, envAddr, &addr, false)
	lookupEnv.fill(fs, flagPrincipal, envPrincipal, &principal, true)
	principal = strings.TrimSpace(principal)
	var problems []string
	if strings.TrimSpace(addr) == "" {
		problems = append(problems, "--addr is empty")
	}
	if principal != "" {
		if err := auth.ValidatePrincipalID(principal); err != nil {
			problems = append(problems, fmt.Sprintf("--principal: %v", err))
		}
	}
	if f.timeout <= 0 {
		problems = append(problems, fmt.Sprintf("--timeout must be positive, not %s", f.timeout))
	}
	if f.output != outputTable && f.output != outputJSON {
		problems = append(problems, fmt.Sprintf("--output must be table or json, not %q", f.output))
	}
	access := f.access
	if err := access.resolve(fs, lookupEnv); err != nil {
		problems = append(problems, err.Error())
	}
	token, err := access.bearer()
	if err != nil {
		problems = append(problems, err.Error())
	}
	if token != "" && strings.TrimSpace(addr) != "" {
		if err := checkPlaintextToken(addr, &access); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return nil, usage(errors.New(strings.Join(problems, "; ")))
	}
	creds, err := access.transport(addr)
	if err != nil {
		return nil, usage(err)
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent("toolsvc-cli/"+buildVersion()),
		grpc.WithChainUnaryInterceptor(checkTextUnary),
		grpc.WithChainStreamInterceptor(checkTextStream))
	if err != nil {
		return nil, usage(fmt.Errorf("--addr %q: %w", addr, err))
	}
	ctx := cmd.Context()
	if principal != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, auth.PrincipalHeader, principal)
	}
	if token != "" {
		ctx = withToken(ctx, token)
	}
	return &client{
		conn: conn, addr: addr, principal: principal, access: access, timeout: f.timeout,
		json: f.output == outputJSON, stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr(), ctx: ctx,
	}, nil
}

// checkTextUnary refuses, as a usage error, a request whose text (an
// argument or flag: an id, a name, a comment...) holds NUL or invalid UTF-8:
// the server would refuse it, and protobuf cannot even send invalid UTF-8.
func checkTextUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := checkText(req); err != nil {
		return err
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func checkTextStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &checkedStream{ClientStream: s}, nil
}

// checkedStream checks each request it sends.
type checkedStream struct{ grpc.ClientStream }

func (s *checkedStream) SendMsg(m any) error {
	if err := checkText(m); err != nil {
		return err
	}
	return s.ClientStream.SendMsg(m)
}

func checkText(req any) error {
	m, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	err := server.CheckRequestText(m)
	if f, ok := fault.As(err); ok {
		problems := make([]string, len(f.Violations))
		for i, v := range f.Violations {
			problems[i] = v.Field + ": " + v.Description
		}
		return usage(errors.New(strings.Join(problems, "; ")))
	}
	return err
}

// withClient connects, runs fn and closes the connection.
func (f *clientFlags) withClient(cmd *cobra.Command, lookupEnv env, fn func(*client) error) error {
	c, err := f.connect(cmd, lookupEnv)
	if err != nil {
		return err
	}
	defer c.conn.Close()
	return fn(c)
}

// call runs one unary request under the --timeout deadline; an error it
// returns has been printed and carries exit code 4.
func (c *client) call(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.timeout)
	defer cancel()
	if err := fn(ctx); err != nil {
		return c.rpcError(err)
	}
	return nil
}

// unary runs one RPC with the client's timeout and returns its response;
// a failure is printed (rpcError) and becomes exit code 4.
func unary[T any](c *client, fn func(ctx context.Context) (T, error)) (T, error) {
	var out T
	err := c.call(func(ctx context.Context) error {
		var err error
		out, err = fn(ctx)
		return err
	})
	return out, err
}

// rpcError prints an error from the server: in table mode every detail the
// server attached, readably; in json mode the google.rpc.Status as protojson
// on stderr. It returns the exit error (code 4).
func (c *client) rpcError(err error) error {
	var ue *usageError
	if errors.As(err, &ue) {
		return err // refused before it was sent (checkText)
	}
	st := status.Convert(err)
	if c.json {
		if b, jerr := marshalJSON(st.Proto(), true); jerr == nil {
			c.stderr.Write(b)
			return &exitError{code: exitRPC}
		}
	}
	printRPCStatus(c.stderr, st, c.hint(st))
	return &exitError{code: exitRPC}
}

// hint explains errors that did not come from toolsvc itself.
func (c *client) hint(st *status.Status) string {
	if st.Code() == codes.Unauthenticated && !c.access.authenticates() {
		return fmt.Sprintf("authenticate with a token (--%s, %s or --%s) or a client certificate (--%s and --%s)",
			flagTokenFile, envToken, flagToken, flagCertFile, flagKeyFile)
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.ErrorInfo); ok {
			return ""
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Sprintf("is toolsvc serving at %s? (--addr or %s)", c.addr, envAddr)
	case codes.DeadlineExceeded:
		return fmt.Sprintf("no answer within --timeout %s", c.timeout)
	}
	return ""
}

// printRPCStatus writes a gRPC status for a person:
//
//	toolsvc: PermissionDenied: principal "ann" requested this call and may not resolve its approval
//	  reason:       SELF_APPROVAL
//	  metadata:     approval_id=01K...
//	  retry after:  2s
//	  field violations:
//	    tool.name: must match ^[a-z0-9_-]{1,64}$
func printRPCStatus(w io.Writer, st *status.Status, hint string) {
	fmt.Fprintln(w, wrapped(fmt.Sprintf("toolsvc: %s: %s", st.Code(), st.Message())))
	var pairs [][2]string
	var violations []*errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			pairs = append(pairs, [2]string{"reason", d.GetReason()})
			if md := d.GetMetadata(); len(md) > 0 {
				var kv []string
				for _, k := range slices.Sorted(maps.Keys(md)) {
					kv = append(kv, k+"="+md[k])
				}
				pairs = append(pairs, [2]string{"metadata", strings.Join(kv, ", ")})
			}
		case *errdetails.RetryInfo:
			delay := d.GetRetryDelay().AsDuration()
			if delay >= time.Second {
				delay = delay.Round(time.Second)
			}
			pairs = append(pairs, [2]string{"retry after", delay.String()})
		case *errdetails.BadRequest:
			violations = append(violations, d.GetFieldViolations()...)
		case proto.Message:
			if b, err := marshalJSON(d, false); err == nil {
				pairs = append(pairs, [2]string{"detail", strings.TrimSpace(string(b))})
			}
		default:
			pairs = append(pairs, [2]string{"detail", fmt.Sprint(d)})
		}
	}
	if hint != "" {
		pairs = append(pairs, [2]string{"hint", hint})
	}
	width := 0
	for _, p := range pairs {
		width = max(width, len(p[0])+1)
	}
	pad := strings.Repeat(" ", 2+width+2)
	for _, p := range pairs {
		for i, line := range wrap(p[1], termWidth-len(pad)) {
			if i == 0 {
				fmt.Fprintf(w, "  %-*s  %s\n", width, p[0]+":", line)
			} else {
				fmt.Fprintf(w, "%s%s\n", pad, line)
			}
		}
	}
	if len(violations) > 0 {
		fmt.Fprintf(w, "  field violations (%d):\n", len(violations))
		for _, v := range violations {
			fmt.Fprintf(w, "    %s\n", strings.Join(wrap(v.GetField()+": "+v.GetDescription(), termWidth-4), "\n      "))
		}
	}
}

// printJSON writes m as indented protojson (field names as in the .proto).
func (c *client) printJSON(m proto.Message) error {
	b, err := marshalJSON(m, true)
	if err != nil {
		return err
	}
	_, err = c.stdout.Write(b)
	return err
}

// marshalJSON renders m as protojson with the proto's field names, followed
// by a newline: indented, or on one line (for streams: one object per line).
// The output is re-indented because protojson varies its whitespace on
// purpose, and scripts and documentation want stable output.
func marshalJSON(m proto.Message, indent bool) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if indent {
		err = json.Indent(&buf, raw, "", "  ")
	} else {
		err = json.Compact(&buf, raw)
	}
	if err != nil {
		return nil, err
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

// listPage fetches one page of a list: its items and the next page token.
type listPage[T any] func(ctx context.Context, pageSize int32, token string) ([]T, string, error)

// collect follows page tokens until the last page, or until limit items
// (0: no limit). Each page is one request under --timeout.
func collect[T any](c *client, limit, maxPage int, fetch listPage[T]) ([]T, error) {
	var all []T
	token := ""
	for {
		size := maxPage
		if limit > 0 && limit-len(all) < size {
			size = limit - len(all)
		}
		var items []T
		var next string
		if err := c.call(func(ctx context.Context) error {
			var err error
			items, next, err = fetch(ctx, int32(size), token)
			return err
		}); err != nil {
			return nil, err
		}
		all = append(all, items...)
		if limit > 0 && len(all) >= limit {
			return all[:limit], nil
		}
		if next == "" {
			return all, nil
		}
		token = next
	}
}

// addLimitFlag defines --limit on a list command.
func addLimitFlag(cmd *cobra.Command) *int {
	return cmd.Flags().Int("limit", 0, "return at most this many (0: all, following page tokens)")
}

func checkLimit(limit int) error {
	if limit < 0 {
		return usage(fmt.Errorf("--limit must be 0 (all) or positive, not %d", limit))
	}
	return nil
}

// fields prints "label:  value" lines with the values aligned; a value of
// several lines (JSON) continues indented under its label. Empty values are
// skipped.
type fields struct {
	w     io.Writer
	lines [][2]string
}

func newFields(w io.Writer) *fields { return &fields{w: w} }

func (f *fields) add(label, value string) {
	if value != "" {
		f.lines = append(f.lines, [2]string{label, value})
	}
}

func (f *fields) flush() error {
	width := 0
	for _, l := range f.lines {
		width = max(width, len(l[0])+1)
	}
	var b strings.Builder
	for _, l := range f.lines {
		value := strings.TrimRight(l[1], "\n")
		if !strings.Contains(value, "\n") {
			// Long text wraps under its value column, to fit termWidth.
			pad := strings.Repeat(" ", width+2)
			for i, line := range wrap(value, termWidth-width-2) {
				if i == 0 {
					fmt.Fprintf(&b, "%-*s  %s\n", width, l[0]+":", line)
				} else {
					fmt.Fprintf(&b, "%s%s\n", pad, line)
				}
			}
			continue
		}
		fmt.Fprintf(&b, "%s:\n", l[0])
		for _, line := range strings.Split(value, "\n") {
			fmt.Fprintf(&b, "  %s\n", line)
		}
	}
	f.lines = nil
	_, err := io.WriteString(f.w, b.String())
	return err
}

// Time formats: local time, readable, to the second.
const timeLayout = "2006-01-02 15:04:05 MST"

// short formats a timestamp for a table column: local time to the second,
// without the zone; "-" when unset.
func short(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().Local().Format("2006-01-02 15:04:05")
}

// shortDay is short without the year, for the narrowest tables.
func shortDay(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().Local().Format("01-02 15:04:05")
}

// when formats a timestamp in local time; "" when unset.
func when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().Local().Format(timeLayout)
}

// whenRel is when plus how far from now: "2026-05-01 14:00:00 CEST (in 59m30s)".
func whenRel(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	d := time.Until(ts.AsTime()).Round(time.Second)
	switch {
	case d > 0:
		return fmt.Sprintf("%s (in %s)", when(ts), d)
	case d < 0:
		return fmt.Sprintf("%s (%s ago)", when(ts), -d)
	}
	return when(ts) + " (now)"
}

// orDash fills an empty table cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// enumName is an enum value's name without its type prefix: RISK_LEVEL_HIGH
// is HIGH; the unspecified value is "".
func enumName(e protoreflect.Enum) string {
	if e.Number() == 0 {
		return ""
	}
	d := e.Descriptor()
	v := d.Values().ByNumber(e.Number())
	if v == nil {
		return strconv.Itoa(int(e.Number()))
	}
	return strings.TrimPrefix(string(v.Name()), enumPrefix(d))
}

// enumPrefix is the common prefix of an enum's value names (that of its
// UNSPECIFIED value).
func enumPrefix(d protoreflect.EnumDescriptor) string {
	return strings.TrimSuffix(string(d.Values().ByNumber(0).Name()), "UNSPECIFIED")
}

// parseEnum reads an enum value from a flag: the short name in any case
// ("pending", "read-only") or the full name ("APPROVAL_STATE_PENDING").
// Unspecified is not accepted; only is, if given, the set of values allowed.
func parseEnum(flag, s string, d protoreflect.EnumDescriptor, only ...protoreflect.EnumNumber) (protoreflect.EnumNumber, error) {
	prefix := enumPrefix(d)
	name := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))
	name = strings.TrimPrefix(name, prefix)
	var valid []string
	for i := 0; i < d.Values().Len(); i++ {
		v := d.Values().Get(i)
		if v.Number() == 0 || (len(only) > 0 && !slices.Contains(only, v.Number())) {
			continue
		}
		short := strings.TrimPrefix(string(v.Name()), prefix)
		if short == name {
			return v.Number(), nil
		}
		valid = append(valid, strings.ToLower(strings.ReplaceAll(short, "_", "-")))
	}
	return 0, usage(fmt.Errorf("--%s %q: want one of %s", flag, s, strings.Join(valid, ", ")))
}

// valueJSON renders a structured value as indented JSON with sorted keys;
// "" for no value.
func valueJSON(v *structpb.Value) string {
	if v == nil {
		return ""
	}
	b, err := json.MarshalIndent(v.AsInterface(), "", "  ")
	if err != nil {
		return fmt.Sprint(v.AsInterface())
	}
	return string(b)
}

// structJSON is valueJSON of a Struct.
func structJSON(s *structpb.Struct) string {
	if s == nil {
		return ""
	}
	return valueJSON(structpb.NewStructValue(s))
}

// compactJSON renders a Struct on one line with sorted keys.
func compactJSON(s *structpb.Struct) string {
	if s == nil {
		return ""
	}
	b, err := json.Marshal(s.AsMap())
	if err != nil {
		return fmt.Sprint(s.AsMap())
	}
	return string(b)
}

// exactArgs accepts exactly the named positional arguments, as a usage error
// otherwise.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == len(names) {
			for i, a := range args {
				if strings.TrimSpace(a) == "" {
					return usage(fmt.Errorf("%s: %s is empty", cmd.CommandPath(), names[i]))
				}
			}
			return nil
		}
		want := strings.Join(names, " ")
		if len(args) < len(names) {
			return usage(fmt.Errorf("%s needs %s (usage: %s)", cmd.CommandPath(), want, cmd.UseLine()))
		}
		return usage(fmt.Errorf("%s takes %s, got %q (usage: %s)", cmd.CommandPath(), want, args, cmd.UseLine()))
	}
}

// requireFlag refuses an empty value of a required flag as a usage error.
func requireFlag(name, value string) error {
	if strings.TrimSpace(value) == "" {
		return usage(fmt.Errorf("--%s is required", name))
	}
	return nil
}

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// connectionFlags are the flags a printed follow-up command needs to reach
// the same server as the same principal.
func (c *client) connectionFlags() []string {
	var out []string
	if c.addr != defaultAddr {
		out = append(out, "--addr", shellQuote(c.addr))
	}
	if c.principal != "" {
		out = append(out, "--principal", shellQuote(c.principal))
	}
	return append(out, c.access.flags()...)
}
