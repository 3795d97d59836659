// testkit's NetworkPolicy enforcer for the real-node harness (see build.sh): the controller of
// sigs.k8s.io/kube-network-policies (nftables rules that send a new connection's first packet
// to an NFQUEUE, where the policies decide), run as a plain process inside the node's network
// namespace with a kubeconfig instead of in-cluster credentials. Upstream's cmd/main.go only
// knows rest.InClusterConfig; this is that file with --kubeconfig, no metrics server, no NRI
// (pod addresses come from the API server; see below) and
// SIGTERM handled like SIGINT (the controller removes its nftables table on the way out), and
// --cleanup, which only removes that table (the harness runs it after every stop, so a killed
// enforcer leaves no rule that queues packets nobody reads).
// On this machine's kernel (no CONFIG_NFT_QUEUE) upstream's nftables table is refused and only
// logged; testkit/netpolenforcer.py diverts the packets to the queue with iptables' NFQUEUE
// target instead. Not part of the product.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() { os.Exit(run()) }

func run() int {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster (required)")
	nodeName := flag.String("hostname-override", "", "the Node whose pods are enforced (required)")
	queueID := flag.Int("nfqueue-id", 100, "the NFQUEUE number")
	table := flag.String("nftables-table", "kube-network-policies", "the inet nftables table it owns")
	failOpen := flag.Bool("fail-open", false, "accept packets while the enforcer is not running")
	cleanup := flag.Bool("cleanup", false, "only remove the nftables table, then exit")
	klog.InitFlags(nil)
	flag.Parse()
	if *cleanup {
		return removeTable(*table)
	}
	if *kubeconfig == "" || *nodeName == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig and --hostname-override are required")
		return 2
	}
	// No NRI: v0.8.0's Config.NRIdisabled leaves the plugin nil and the packet path then
	// dereferences it (a panic at the first address no pod holds), so the plugin is made but
	// given a connection that cannot be opened (an fd variable that is no number): its Run
	// fails at once, it never dials /var/run/nri/nri.sock (which could be another runtime's
	// on a shared machine) and it answers every address lookup with nothing.
	if err := os.Setenv("NRI_PLUGIN_SOCKET", "off"); err != nil {
		klog.Errorf("NRI_PLUGIN_SOCKET: %v", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
	defer cancel()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Errorf("kubeconfig: %v", err)
		return 1
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Errorf("client: %v", err)
		return 1
	}
	factory := informers.NewSharedInformerFactory(clientset, 0)
	controller, err := networkpolicy.NewController(
		clientset,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{
			FailOpen:            *failOpen,
			QueueID:             *queueID,
			NodeName:            *nodeName,
			NetfilterBug1766Fix: true,
			NFTableName:         *table,
		},
	)
	if err != nil {
		klog.Errorf("controller: %v", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- controller.Run(ctx) }()
	factory.Start(ctx.Done())
	select {
	case err = <-done: // nfqueue or nftables refused: say so and stop
		klog.Errorf("controller stopped: %v", err)
		return 1
	case <-ctx.Done():
	}
	// Run removes its table on the way out (deferred cleanNFTablesRules).
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	return 0
}

// removeTable deletes the inet table if it is there (add then delete: no error when absent).
func removeTable(name string) int {
	nft, err := nftables.New()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nftables: %v\n", err)
		return 1
	}
	t := &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
	nft.AddTable(t)
	nft.DelTable(t)
	if err := nft.Flush(); err != nil {
		fmt.Fprintf(os.Stderr, "removing table %s: %v\n", name, err)
		return 1
	}
	return 0
}
