// Command etcd is the etcd server at the version k8s.io/kubernetes itself pins
// (go.etcd.io/etcd/server/v3 in go.mod), so the apiserver talks to the etcd it
// was tested with. It is the same entry point as etcd's own main package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
