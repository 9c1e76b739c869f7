package console

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// ApprovalPath is the path of an approval's page on the console.
func ApprovalPath(id string) string { return "/approvals/" + url.PathEscape(id) }

// ApprovalURL returns the absolute URL of an approval's page: base (the
// console's public URL, see BaseURL) joined with ApprovalPath. Notifications
// and the MCP front door link parked calls here; opening the page decides
// nothing, the approver signs in and decides on it.
func ApprovalURL(base, id string) string {
	return strings.TrimRight(base, "/") + ApprovalPath(id)
}

// BaseURL is the console's public base URL: publicURL (console.public_url)
// when set, else the address it listens on, with https when it serves TLS
// and localhost for an unspecified host (0.0.0.0, ::).
func BaseURL(publicURL string, listen net.Addr, tls bool) string {
	if publicURL != "" {
		return strings.TrimRight(publicURL, "/")
	}
	if listen == nil {
		return ""
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	host, port, err := net.SplitHostPort(listen.String())
	if err != nil {
		return fmt.Sprintf("%s://%s", scheme, listen.String())
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return fmt.Sprintf("%s://%s", scheme, net.JoinHostPort(host, port))
}
