//go:build tools

// Package tools names the command this wrapper module builds, so `go mod tidy` keeps it.
package tools

import _ "go.etcd.io/etcd/server/v3"
