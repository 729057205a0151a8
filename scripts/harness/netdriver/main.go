// Command netdriver is the test harness's own DRA kubelet plugin: it stands in for an SR-IOV
// driver in Multus's DRA path (docs/multi-network.md), without any real VF.
//
// It registers with the kubelet through k8s.io/dynamic-resource-allocation's kubeletplugin
// helper and publishes one ResourceSlice for its node with --devices devices, each carrying the
// attributes Multus resolves a NetworkAttachmentDefinition's `k8s.v1.cni.cncf.io/resourceName`
// with (`k8s.cni.cncf.io/resourceName`, `k8s.cni.cncf.io/deviceID`) and the standard
// `resource.kubernetes.io/pciBusID`. The device names sort in the OPPOSITE order of their
// device IDs (vf-0 has the highest address, the last device the lowest), so that Multus's
// assignment (sorted device IDs, in the order of the pod's networks) differs from both the
// allocation's order and the names' order: a consumer that pairs interfaces and devices by
// anything but the device ID gets it wrong.
//
// Preparing a claim does nothing (no CDI device: the "VF" is a name and an address); both
// prepare and unprepare succeed.
//
// Run as `vf-capture` (a link to this binary in the CNI bin dir), it is instead a chained CNI
// plugin that records, one JSON line per call in its conf's `captureFile`, the device ID its
// caller handed it (top-level `deviceID` and `pciBusID`, `runtimeConfig.deviceID`) and passes
// the previous result through unchanged.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const (
	attrResourceName resourceapi.QualifiedName = "k8s.cni.cncf.io/resourceName"
	attrDeviceID     resourceapi.QualifiedName = "k8s.cni.cncf.io/deviceID"
)

func main() {
	if strings.HasSuffix(filepath.Base(os.Args[0]), "capture") {
		os.Exit(capture())
	}
	var (
		kubeconfig   = flag.String("kubeconfig", "", "kubeconfig of the node's identity (the Node authorizer lets it manage its own slices)")
		nodeName     = flag.String("node-name", "", "the node this plugin serves (required)")
		driverName   = flag.String("driver-name", "vf.netclaim.test", "the DRA driver name")
		resourceName = flag.String("resource-name", "netclaim.test/vf", "value of every device's "+string(attrResourceName))
		numDevices   = flag.Int("devices", 4, "devices to publish (at most 256)")
		registryDir  = flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
		pluginDir    = flag.String("plugin-dir", "", "directory of the DRA socket (default: <kubelet plugins dir>/<driver name>)")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *nodeName == "" || *numDevices < 1 || *numDevices > 256 {
		fmt.Fprintln(os.Stderr, "netdriver: --node-name is required and --devices must be 1..256")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *nodeName, *driverName, *resourceName, *numDevices, *registryDir, *pluginDir); err != nil {
		klog.ErrorS(err, "netdriver failed")
		os.Exit(1)
	}
}

// deviceAddress is the PCI address of the device with index k of the address order:
// 0000:00:05.0 .. 0000:00:05.7, 0000:00:06.0, ... (fixed-width lower-case hex, so that string
// order is address order).
func deviceAddress(k int) string {
	return fmt.Sprintf("0000:00:%02x.%d", 5+k/8, k%8)
}

// devices lists the slice's devices: vf-<i> (zero-padded to one width) has address n-1-i.
func devices(n int, resourceName string) []resourceapi.Device {
	width := len(fmt.Sprint(n - 1))
	out := make([]resourceapi.Device, 0, n)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("vf-%0*d", width, i)
		addr := deviceAddress(n - 1 - i)
		rn, id, bus := resourceName, addr, addr
		out = append(out, resourceapi.Device{
			Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				attrResourceName: {StringValue: &rn},
				attrDeviceID:     {StringValue: &id},
				deviceattribute.StandardDeviceAttributePCIBusID: {StringValue: &bus},
			},
		})
	}
	return out
}

func run(kubeconfig, nodeName, driverName, resourceName string, n int, registryDir, pluginDir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if pluginDir == "" {
		pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, driverName)
	}
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	plugin := &vfDriver{name: driverName, cancel: cancel}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(driverName),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()

	devs := devices(n, resourceName)
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	for _, d := range devs {
		klog.InfoS("publishing", "driver", driverName, "pool", nodeName, "device", d.Name,
			"deviceID", *d.Attributes[attrDeviceID].StringValue, "resourceName", resourceName)
	}
	<-ctx.Done()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	klog.InfoS("stopping")
	return nil
}

// vfDriver implements kubeletplugin.DRAPlugin: nothing to set up for a device.
type vfDriver struct {
	name   string
	cancel context.CancelCauseFunc
}

func (d *vfDriver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var prepared []kubeletplugin.Device
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != d.name {
				continue
			}
			prepared = append(prepared, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
			logger.Info("prepared", "claim", klog.KObj(claim), "request", r.Request, "device", r.Device)
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: prepared}
	}
	return result, nil
}

func (d *vfDriver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		klog.FromContext(ctx).Info("unprepared", "claim", claim.NamespacedName)
		result[claim.UID] = nil
	}
	return result, nil
}

func (d *vfDriver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("%s: %w", msg, err))
	}
}

func (d *vfDriver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
