package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/toolsvc/toolsvc/internal/safetext"
)

// EnvPrefix prefixes every environment variable: TOOLSVC_DATABASE_URL sets
// database_url, TOOLSVC_LOG_LEVEL sets log.level.
const EnvPrefix = "TOOLSVC"

// Flag names of the common keys (see RegisterFlags).
const (
	FlagConfig          = "config"
	FlagListen          = "listen"
	FlagDatabaseURL     = "database-url"
	FlagStore           = "store"
	FlagMigrate         = "migrate"
	FlagToolsFile       = "tools-file"
	FlagDemoTools       = "demo-tools"
	FlagLogLevel        = "log-level"
	FlagLogFormat       = "log-format"
	FlagShutdownTimeout = "shutdown-timeout"
	FlagShutdownGrace   = "shutdown-grace"
	FlagMetricsListen   = "metrics-listen"
	FlagConsoleListen   = "console-listen"
	FlagMCPListen       = "mcp-listen"
)

// flagKeys maps flags to the keys they set.
var flagKeys = map[string]string{
	FlagListen:          "listen",
	FlagDatabaseURL:     "database_url",
	FlagStore:           "store",
	FlagMigrate:         "migrate",
	FlagToolsFile:       "tools_file",
	FlagDemoTools:       "demo_tools",
	FlagLogLevel:        "log.level",
	FlagLogFormat:       "log.format",
	FlagShutdownTimeout: "shutdown_timeout",
	FlagShutdownGrace:   "shutdown_grace",
	FlagMetricsListen:   "metrics.listen",
	FlagConsoleListen:   "console.listen",
	FlagMCPListen:       "mcp.listen",
}

// RegisterFlags defines the flags of the common keys on fs. Their defaults
// are shown for help only: a flag that is not given leaves the key to the
// file, the environment or the default.
func RegisterFlags(fs *pflag.FlagSet) {
	d := Default()
	fs.String(FlagConfig, "", "configuration file (YAML)")
	fs.String(FlagListen, d.Listen, "gRPC listen address; loopback only while authentication is off")
	fs.String(FlagDatabaseURL, "", "Postgres connection URL; empty uses the in-memory store")
	fs.String(FlagStore, "", "store: memory or postgres (default: postgres with a database URL, else memory; with authentication on, memory must be asked for)")
	fs.Bool(FlagMigrate, false, "apply pending database migrations at start")
	fs.String(FlagToolsFile, "", "YAML file of tool definitions synced at start")
	fs.Bool(FlagDemoTools, false, "register the demo tools (default: on with the memory store and authentication off, else off)")
	fs.String(FlagLogLevel, d.Log.Level, "log level: debug, info, warn or error")
	fs.String(FlagLogFormat, d.Log.Format, "log format: json or text")
	fs.Duration(FlagShutdownTimeout, d.ShutdownTimeout, "how long in-flight calls may finish after SIGINT/SIGTERM")
	fs.Duration(FlagShutdownGrace, d.ShutdownGrace, "after the shutdown timeout, how long the answers of aborted calls have to reach their callers")
	fs.String(FlagMetricsListen, "", "operations port: Prometheus GET /metrics and grpc.health.v1 for probes, at this host:port (off when empty)")
	fs.String(FlagConsoleListen, "", "approvers' web console at this host:port (off when empty); loopback only while authentication is off")
	fs.String(FlagMCPListen, "", "MCP front door: streamable HTTP at /mcp on this host:port (off when empty); loopback only while authentication is off")
}

// DatabaseURLFlag defines only --database-url on fs (for commands that need
// nothing else).
func DatabaseURLFlag(fs *pflag.FlagSet) {
	fs.String(FlagDatabaseURL, "", "Postgres connection URL (or TOOLSVC_DATABASE_URL)")
}

// Sources says where configuration comes from. Later sources win: defaults,
// then File, then the environment, then Flags that were given.
type Sources struct {
	// File is a YAML file; empty means none.
	File string
	// Env looks up environment variables; nil means none. Pass os.LookupEnv.
	Env func(string) (string, bool)
	// Flags holds flags defined by RegisterFlags; nil means none.
	Flags *pflag.FlagSet
}

// Load reads and validates the configuration. Bad configuration is an *Error
// listing every problem found (in the file, the environment, the flags and
// the values), each naming its key.
func Load(src Sources) (*Config, error) {
	v := viper.NewWithOptions(viper.KeyDelimiter("."))
	// origins says where each key set by a source came from, so that a
	// problem names its source and the value it was given.
	origins := map[string]origin{}
	if src.File != "" {
		v.SetConfigFile(src.File)
		// Whatever the extension, the file is YAML.
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, &Error{Problems: []string{fmt.Sprintf("config file %s: %v", src.File, err)}}
		}
		for _, key := range v.AllKeys() {
			origins[key] = origin{where: "in " + src.File, value: v.Get(key), file: true}
		}
	}
	if src.Env != nil {
		// Only keys with a value of their own are read from the environment
		// (lists of objects and maps are file-only). They are set explicitly
		// rather than through viper's AutomaticEnv so that the caller controls
		// the environment and the precedence (flags are set after them).
		for _, key := range leafKeys(reflect.TypeFor[Config](), "") {
			name := EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
			if val, ok := src.Env(name); ok {
				v.Set(key, val)
				origins[key] = origin{where: "from " + name, value: val}
			}
		}
	}
	if src.Flags != nil {
		// Set after the environment so that a flag given wins over it.
		src.Flags.Visit(func(f *pflag.Flag) {
			if key, ok := flagKeys[f.Name]; ok {
				v.Set(key, f.Value.String())
				origins[key] = origin{where: "from --" + f.Name, value: f.Value.String()}
			}
		})
	}

	cfg := Default()
	var p problems
	err := v.UnmarshalExact(cfg, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		durationStringsOnly(),
		mapstructure.StringToTimeDurationHookFunc(),
		mapstructure.StringToSliceHookFunc(","),
	)))
	if err != nil {
		p = append(p, decodeProblems(err)...)
	}
	if src.File != "" {
		cfg.resolvePaths(filepath.Dir(src.File), origins)
	}
	if err := cfg.Validate(); err != nil {
		var ce *Error
		if !errors.As(err, &ce) {
			return nil, err
		}
		p = append(p, ce.Problems...)
	}
	if len(p) > 0 {
		for i := range p {
			p[i] = withOrigin(p[i], origins)
		}
		return nil, &Error{Problems: dedupe(p)}
	}
	return cfg, nil
}

// origin is where a key's value came from.
type origin struct {
	where string // "in FILE", "from TOOLSVC_X", "from --flag"
	value any
	file  bool
}

// pathKeys are the keys that name files or directories. Written in a
// configuration file, a relative path is relative to that file, so that a
// configuration works from any working directory; from the environment or
// a flag it is relative to the working directory, as a shell user expects.
var pathKeys = []string{"tools_file", "secrets.dir", "tls.cert_file", "tls.key_file", "tls.client_ca_file"}

func (c *Config) resolvePaths(base string, origins map[string]origin) {
	ptrs := map[string]*string{
		"tools_file": &c.ToolsFile, "secrets.dir": &c.Secrets.Dir,
		"tls.cert_file": &c.TLS.CertFile, "tls.key_file": &c.TLS.KeyFile, "tls.client_ca_file": &c.TLS.ClientCAFile,
	}
	for _, key := range pathKeys {
		ptr := ptrs[key]
		if o, ok := origins[key]; ok && o.file && *ptr != "" && !filepath.IsAbs(*ptr) {
			*ptr = filepath.Join(base, *ptr)
		}
	}
}

// sensitiveKeys may hold credentials: a problem with them names the source
// but not the value.
var sensitiveKeys = []string{"database_url", "token", "secret", "password"}

// withOrigin adds to a problem line ("key: what is wrong") where the key's
// value came from and, unless it may be a credential, the value itself:
// "log.level: must be ... (from TOOLSVC_LOG_LEVEL="loud")". A problem with a
// part of a key (principals[1].id) names the file the key is in.
func withOrigin(line string, origins map[string]origin) string {
	key, rest, ok := strings.Cut(line, ": ")
	if !ok || strings.Contains(key, " ") {
		return line
	}
	o, found := origins[key]
	if !found {
		// principals[1].id: the source of principals; server.keepalive: a
		// section set by its leaves.
		top, _, _ := strings.Cut(key, "[")
		for k, ko := range origins {
			if k == top || strings.HasPrefix(k, top+".") {
				o, found = ko, true
				o.value = nil
				break
			}
		}
		if !found {
			return line
		}
	}
	where := o.where
	if o.value != nil && !sensitive(key) {
		if s, isString := o.value.(string); isString {
			where += "=" + safetext.Quote(s)
		} else if _, scalar := o.value.(map[string]any); !scalar {
			where += "=" + safetext.Quote(fmt.Sprint(o.value))
		}
	}
	return key + ": " + rest + " (" + where + ")"
}

func sensitive(key string) bool {
	for _, s := range sensitiveKeys {
		if strings.Contains(key, s) {
			return true
		}
	}
	return false
}

// leafKeys lists the keys of t that take a single value (or a list of
// strings): the keys the environment and flags can set.
func leafKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := f.Tag.Get("mapstructure")
		if name == "" || name == "-" {
			continue
		}
		key := prefix + name
		ft := f.Type
		switch {
		case ft == reflect.TypeFor[time.Duration]():
			keys = append(keys, key)
		case ft.Kind() == reflect.Struct:
			keys = append(keys, leafKeys(ft, key+".")...)
		case ft.Kind() == reflect.Map:
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.String:
		default:
			keys = append(keys, key)
		}
	}
	return keys
}

// durationStringsOnly refuses numbers for durations: mapstructure would read
// `shutdown_timeout: 15` as 15 nanoseconds.
func durationStringsOnly() mapstructure.DecodeHookFuncType {
	return func(from, to reflect.Type, data any) (any, error) {
		if to != reflect.TypeFor[time.Duration]() {
			return data, nil
		}
		switch from.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
			reflect.Float32, reflect.Float64:
			return nil, fmt.Errorf("want a duration with a unit, such as \"15s\" or \"2m\", got the number %v", data)
		}
		return data, nil
	}
}

// decodeProblems turns mapstructure's joined errors into one line per
// problem, each naming its key.
func decodeProblems(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		de, ok := err.(*mapstructure.DecodeError)
		if !ok {
			// viper wraps mapstructure's errors in a summary line.
			if inner := errors.Unwrap(err); inner != nil {
				walk(inner)
				return
			}
			out = append(out, errorLines(err)...)
			return
		}
		inner := de.Unwrap()
		if _, nested := inner.(interface{ Unwrap() []error }); nested {
			walk(inner)
			return
		}
		if _, nested := inner.(*mapstructure.DecodeError); nested {
			walk(inner)
			return
		}
		msg := inner.Error()
		if keys, ok := strings.CutPrefix(msg, "has invalid keys: "); ok {
			for _, k := range strings.Split(keys, ", ") {
				full := k
				if de.Name() != "" {
					full = de.Name() + "." + k
				}
				out = append(out, fmt.Sprintf("%s: unknown key", full))
			}
			return
		}
		name := de.Name()
		if name == "" {
			name = "config"
		}
		out = append(out, fmt.Sprintf("%s: %s", name, msg))
	}
	walk(err)
	return out
}

func dedupe(lines []string) []string {
	seen := map[string]bool{}
	out := lines[:0:0]
	for _, l := range lines {
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	// Stable, readable order: by key.
	sort.SliceStable(out, func(i, j int) bool { return keyOf(out[i]) < keyOf(out[j]) })
	return out
}

func keyOf(line string) string {
	k, _, _ := strings.Cut(line, ":")
	return k
}
