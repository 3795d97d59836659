// Command testkit-csi-node is the CSI node plugin of the testkit loop-device provisioner's
// driver loop.testkit.local, for the real-node harness (testkit/realnode.py). Not part of the
// product.
//
// The provisioner (testkit/provisioner.py) makes every volume on the host: a filesystem volume
// is an ext4 image already loop-mounted under its state directory, a block volume a loop
// device; the PV's volumeAttributes["testkit.local/path"] says which. So this plugin has no
// controller service and no staging: NodePublishVolume bind-mounts that mount point (or
// device) at the kubelet's target path, read-only when asked, and NodeUnpublishVolume
// unmounts and removes the target. It registers itself with the kubelet through the plugin
// registration socket (the part node-driver-registrar plays next to a real driver).
//
// A path outside the provisioner's volume directory, or a device other than /dev/loopN, is
// refused: the volume context is whatever a PV's author wrote.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	driverName = "loop.testkit.local"
	pathAttr   = "testkit.local/path"
	version    = "0.1.0"
)

var loopDevice = regexp.MustCompile(`^/dev/loop[0-9]+$`)

type plugin struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	registerapi.UnimplementedRegistrationServer
	nodeID     string
	volumesDir string
	endpoint   string
}

// -- identity -------------------------------------------------------------------------------

func (p *plugin) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: driverName, VendorVersion: version}, nil
}

func (p *plugin) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (p *plugin) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// -- node -----------------------------------------------------------------------------------

func (p *plugin) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: p.nodeID}, nil
}

func (p *plugin) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil // no staging, no stats, no expansion
}

// source is the volume's host path from its context, checked.
func (p *plugin) source(req *csi.NodePublishVolumeRequest, block bool) (string, error) {
	path := req.GetVolumeContext()[pathAttr]
	if path == "" {
		return "", status.Errorf(codes.InvalidArgument, "volume %s: no %s in its volume context", req.GetVolumeId(), pathAttr)
	}
	if block {
		if !loopDevice.MatchString(path) {
			return "", status.Errorf(codes.InvalidArgument, "volume %s: %q is not a loop device", req.GetVolumeId(), path)
		}
		return path, nil
	}
	clean := filepath.Clean(path)
	if clean != path || !strings.HasPrefix(clean, p.volumesDir+string(os.PathSeparator)) {
		return "", status.Errorf(codes.InvalidArgument, "volume %s: %q is not under %s", req.GetVolumeId(), path, p.volumesDir)
	}
	return clean, nil
}

func (p *plugin) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	target := req.GetTargetPath()
	capability := req.GetVolumeCapability()
	if req.GetVolumeId() == "" || target == "" || capability == nil {
		return nil, status.Error(codes.InvalidArgument, "volume id, target path and capability are required")
	}
	block := capability.GetBlock() != nil
	src, err := p.source(req, block)
	if err != nil {
		return nil, err
	}
	if mounted(target) {
		return &csi.NodePublishVolumeResponse{}, nil // published already: idempotent
	}
	if block {
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDWR, 0o660)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		f.Close()
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return nil, status.Errorf(codes.Internal, "bind mount %s at %s: %v", src, target, err)
	}
	if req.GetReadonly() {
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
		if err := unix.Mount("", target, "", flags, ""); err != nil {
			_ = unix.Unmount(target, 0)
			return nil, status.Errorf(codes.Internal, "read-only remount of %s: %v", target, err)
		}
	}
	log.Printf("published %s (%s) at %s read-only=%v", req.GetVolumeId(), src, target, req.GetReadonly())
	return &csi.NodePublishVolumeResponse{}, nil
}

func (p *plugin) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if req.GetVolumeId() == "" || target == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id and target path are required")
	}
	for mounted(target) {
		if err := unix.Unmount(target, 0); err != nil {
			return nil, status.Errorf(codes.Internal, "unmount %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !os.IsNotExist(err) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	log.Printf("unpublished %s from %s", req.GetVolumeId(), target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// mounted says whether path is a mount point (in /proc/self/mountinfo).
func mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && unescape(fields[4]) == path {
			return true
		}
	}
	return false
}

func unescape(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// -- kubelet plugin registration -------------------------------------------------------------

func (p *plugin) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              driverName,
		Endpoint:          p.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (p *plugin) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		log.Printf("the kubelet refused the registration: %s", st.Error)
	} else {
		log.Printf("registered with the kubelet")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	return net.Listen("unix", path)
}

func main() {
	nodeID := flag.String("node-id", "", "this node's name")
	endpoint := flag.String("endpoint", "", "the CSI socket (under the kubelet's plugins/ directory)")
	registration := flag.String("registration-socket", "", "the socket the kubelet's plugin watcher finds (under plugins_registry/)")
	volumesDir := flag.String("volumes-dir", "", "the provisioner's volume directory: filesystem volumes are under it")
	flag.Parse()
	if *nodeID == "" || *endpoint == "" || *registration == "" || *volumesDir == "" {
		fmt.Fprintln(os.Stderr, "testkit-csi-node: --node-id, --endpoint, --registration-socket and --volumes-dir are required")
		os.Exit(2)
	}
	p := &plugin{nodeID: *nodeID, volumesDir: filepath.Clean(*volumesDir), endpoint: *endpoint}

	csiListener, err := listen(*endpoint)
	if err != nil {
		log.Fatalf("listen %s: %v", *endpoint, err)
	}
	csiServer := grpc.NewServer()
	csi.RegisterIdentityServer(csiServer, p)
	csi.RegisterNodeServer(csiServer, p)
	go func() { log.Fatal(csiServer.Serve(csiListener)) }()

	regListener, err := listen(*registration)
	if err != nil {
		log.Fatalf("listen %s: %v", *registration, err)
	}
	regServer := grpc.NewServer()
	registerapi.RegisterRegistrationServer(regServer, p)
	go func() { log.Fatal(regServer.Serve(regListener)) }()
	log.Printf("serving %s for node %s at %s", driverName, *nodeID, *endpoint)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	regServer.Stop()
	csiServer.Stop()
	os.Remove(*registration)
	os.Remove(*endpoint)
}
