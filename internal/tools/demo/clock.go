package demo

import (
	"context"
	"strconv"
	"time"

	"github.com/toolsvc/toolsvc/toolkit"
)

// Clock tells the time in a time zone. Low risk, no scopes.
type Clock struct {
	// now is the clock's time source; tests replace it.
	now func() time.Time
}

// NewClock returns the clock tool, reading the system clock.
func NewClock() *Clock { return &Clock{now: time.Now} }

// Definition describes the clock tool.
func (*Clock) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name:          "clock",
		Description:   "Tell the current date and time, in UTC or in a named IANA time zone.",
		Capabilities:  []string{"demo"},
		DefaultRisk:   toolkit.RiskLow,
		AuditPayloads: true,
		Actions: []toolkit.Action{{
			Name:        "now",
			Description: "Return the current time as RFC 3339 text and Unix seconds, in the given IANA time zone (default UTC).",
			InputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {
					"timezone": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z][A-Za-z0-9_+/-]*$", "description": "An IANA time zone name such as Europe/Berlin; UTC if omitted."}
				}
			}`),
			OutputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {
					"time": {"type": "string", "format": "date-time"},
					"unix": {"type": "integer"},
					"timezone": {"type": "string"}
				},
				"required": ["time", "unix", "timezone"]
			}`),
			Examples: []toolkit.Example{
				{Description: "The time in UTC.", Input: toolkit.JSON(`{}`), Output: toolkit.JSON(`{"time": "2025-01-02T14:04:05Z", "unix": 1735826645, "timezone": "UTC"}`)},
				{Description: "The time in Berlin.", Input: toolkit.JSON(`{"timezone": "Europe/Berlin"}`), Output: toolkit.JSON(`{"time": "2025-01-02T15:04:05+01:00", "unix": 1735826645, "timezone": "Europe/Berlin"}`)},
			},
		}},
	}
}

// ClockResult is the value of a successful clock call.
type ClockResult struct {
	Time     string `json:"time"`
	Unix     int64  `json:"unix"`
	Timezone string `json:"timezone"`
}

// Execute tells the time.
func (c *Clock) Execute(_ context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var args struct {
		Timezone string `json:"timezone"`
	}
	if r := bind(call, &args); r != nil {
		return r, nil
	}
	zone := args.Timezone
	if zone == "" {
		zone = "UTC"
	}
	// "Local" is the server's own zone, not an IANA name: answering with it
	// would tell callers how the host is configured.
	loc, err := time.LoadLocation(zone)
	if err != nil || zone == "Local" {
		return toolkit.Failure("unknown timezone " + strconv.Quote(zone) + ": use an IANA name such as Europe/Berlin or UTC"), nil
	}
	now := c.now().In(loc)
	res := ClockResult{Time: now.Format(time.RFC3339), Unix: now.Unix(), Timezone: loc.String()}
	return toolkit.OK(res, "It is "+res.Time+" ("+res.Timezone+")."), nil
}
