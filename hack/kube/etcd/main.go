// Command etcd is the etcd 3.6 server, built from go.etcd.io/etcd/server/v3 exactly as the
// upstream etcd binary's main package does, so the test control plane needs no prebuilt binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
