// Command etcd is etcd's server main, built from go.etcd.io/etcd/server/v3 at the version
// k8s.io/kubernetes pins (etcd's own module cannot be `go install`ed: its go.mod has replaces).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
