// vendor-plugin plays a vendor's DRA kubelet plugin (NVIDIA's, say) in the vendor-driver
// mode's end-to-end test: a driver that is not ours, built on the upstream helper
// k8s.io/dynamic-resource-allocation/kubeletplugin. Like NVIDIA's plugin it enumerates
// the node's GPUs once at start and never again, so a GPU hot-plugged later is seen only
// after a restart; the suite's vendor mode restarts it (docs/operations.md).
//
// The node's GPUs come from where the suite's own redfish device source finds them
// (dra_driver/sources/redfish.py): the Redfish ComputerSystem whose UUID is the Node's
// systemUUID, and its Processors of type GPU.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

type plugin struct {
	driver string
	cdiDir string
	// Fixed at start: this plugin does not see hot-plug, as NVIDIA's does not.
	gpus map[string]gpu // device name -> GPU
}

func main() {
	var (
		nodeName    = flag.String("node-name", "", "the Node this plugin serves")
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig file")
		driver      = flag.String("driver-name", "gpu.vendor.example", "DRA driver name")
		registryDir = flag.String("plugins-registry-dir", kubeletplugin.KubeletRegistryDir, "kubelet plugin registration directory")
		pluginsDir  = flag.String("plugins-dir", kubeletplugin.KubeletPluginsDir, "kubelet plugins directory (the DRA socket goes into <dir>/<driver>)")
		cdiDir      = flag.String("cdi-dir", "/var/run/cdi", "where CDI specs are written")
		endpoint    = flag.String("redfish-endpoint", "", "Redfish service that reports the node's GPUs")
		credentials = flag.String("redfish-credentials-file", "", "JSON file with username and password (optional)")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*nodeName, *kubeconfig, *driver, *registryDir, *pluginsDir, *cdiDir, *endpoint, *credentials); err != nil {
		klog.ErrorS(err, "vendor plugin failed")
		os.Exit(1)
	}
}

func run(nodeName, kubeconfig, driver, registryDir, pluginsDir, cdiDir, endpoint, credentials string) error {
	if nodeName == "" || endpoint == "" {
		return errors.New("--node-name and --redfish-endpoint are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", nodeName, err)
	}
	rf, err := newRedfish(endpoint, credentials)
	if err != nil {
		return err
	}
	gpus, err := rf.nodeGPUs(ctx, node.Status.NodeInfo.SystemUUID)
	if err != nil {
		return fmt.Errorf("enumerating GPUs: %w", err)
	}
	p := &plugin{driver: driver, cdiDir: cdiDir, gpus: map[string]gpu{}}
	var devices []resourceapi.Device
	for i, g := range gpus {
		name := fmt.Sprintf("gpu-%d", i) // by index, as NVIDIA names them
		p.gpus[name] = g
		devices = append(devices, resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":        {StringValue: ptr.To("gpu")},
			"index":       {IntValue: ptr.To(int64(i))},
			"uuid":        {StringValue: ptr.To(g.uuid)},
			"productName": {StringValue: ptr.To(g.productName)},
		}})
	}
	klog.InfoS("enumerated GPUs once", "node", nodeName, "count", len(devices))
	dataDir := filepath.Join(pluginsDir, driver)
	if err := os.MkdirAll(dataDir, 0o750); err != nil { // the kubelet does not make it
		return err
	}
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.NodeUID(node.UID),
		kubeletplugin.DriverName(driver),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.HealthService(false), // the kubelet emulator has no health client
	)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer helper.Stop()
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices}}}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: pool}}); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	<-ctx.Done()
	return nil
}

// cdiKind is the CDI vendor/class of this driver's devices.
func (p *plugin) cdiKind() string { return "vendor.example/gpu" }

func (p *plugin) specPath(claimUID types.UID) string {
	// The UID was checked by the API server; it is a UUID, so it is safe in a file name.
	return filepath.Join(p.cdiDir, "vendor.example-"+string(claimUID)+".json")
}

func (p *plugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		out[c.UID] = p.prepare(c)
	}
	return out, nil
}

func (p *plugin) prepare(c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	type cdiDevice struct {
		Name           string `json:"name"`
		ContainerEdits struct {
			Env []string `json:"env"`
		} `json:"containerEdits"`
	}
	var result kubeletplugin.PrepareResult
	var specDevices []cdiDevice
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != p.driver {
			continue
		}
		g, ok := p.gpus[r.Device]
		if !ok { // allocated a device this process never published
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("unknown device %s", r.Device)}
		}
		d := cdiDevice{Name: string(c.UID) + "-" + r.Device}
		d.ContainerEdits.Env = []string{"VENDOR_GPU_UUID=" + g.uuid, "NVIDIA_VISIBLE_DEVICES=" + g.uuid}
		specDevices = append(specDevices, d)
		result.Devices = append(result.Devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{p.cdiKind() + "=" + d.Name},
		})
	}
	spec, _ := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": p.cdiKind(), "devices": specDevices})
	if err := writeAtomically(p.specPath(c.UID), spec); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	return result
}

func (p *plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		err := os.Remove(p.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // unprepare is idempotent
		}
		out[c.UID] = err
	}
	return out, nil
}

func (p *plugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (p *plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func writeAtomically(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// lower-cases a UUID for comparison, as the Python source does.
func sameUUID(a, b string) bool { return strings.EqualFold(a, b) }
