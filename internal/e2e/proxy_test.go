package e2e_test

import (
	"testing"

	"github.com/toolsvc/toolsvc/internal/e2e/dbproxy"
)

// dbProxy cuts a test's database off from its servers (see dbproxy).
type dbProxy = dbproxy.Proxy

func newDBProxy(t *testing.T, dbURL string) (*dbProxy, string) { return dbproxy.New(t, dbURL) }
